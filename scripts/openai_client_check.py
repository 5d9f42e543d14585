"""Drives a running deltafin server with the official `openai` Python package.

Usage: python scripts/openai_client_check.py http://127.0.0.1:PORT/v1 [API_KEY]
Checks models.list, a chat completion, a streamed chat completion (reading reasoning_content),
a completion, stop sequences (cut out of an unstopped answer, plain and streamed) and
logprobs (chat top_logprobs, completions logprobs), echo with max_tokens 0. Exits
non-zero on any failure. With API_KEY (the server's --api-key), a wrong key must raise the
client's AuthenticationError (401).
"""
import sys

import openai
from openai import OpenAI

base = sys.argv[1]
key = sys.argv[2] if len(sys.argv) > 2 else "not-needed"
client = OpenAI(base_url=base, api_key=key)
if len(sys.argv) > 2:
    try:
        OpenAI(base_url=base, api_key=key + "-wrong", max_retries=0).models.list()
        raise SystemExit("a wrong API key was accepted")
    except openai.AuthenticationError:
        pass

models = client.models.list()
ids = [m.id for m in models.data]
assert ids == ["deltafin-kimi-k3"], ids

chat = client.chat.completions.create(
    model="deltafin-kimi-k3",
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=5,
)
choice = chat.choices[0]
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert chat.usage.completion_tokens == 5, chat.usage
reasoning = getattr(choice.message, "reasoning_content", None)
if reasoning is None:
    reasoning = (choice.message.model_extra or {}).get("reasoning_content")
assert reasoning is not None, choice.message

stream = client.chat.completions.create(
    model="deltafin-kimi-k3",
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
)
streamed_reasoning, streamed_content, usage = "", "", None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        extra = c.delta.model_extra or {}
        streamed_reasoning += extra.get("reasoning_content") or ""
        streamed_content += c.delta.content or ""
assert usage is not None and usage.completion_tokens == 5, usage
assert streamed_reasoning == reasoning, (streamed_reasoning, reasoning)
assert streamed_content == (choice.message.content or ""), (streamed_content, choice.message.content)

comp = client.completions.create(model="deltafin-kimi-k3", prompt="The capital of France is", max_tokens=4)
assert comp.choices[0].finish_reason in ("stop", "length")
assert comp.usage.completion_tokens == 4, comp.usage

full = client.completions.create(model="deltafin-kimi-k3", prompt="Once upon a time", max_tokens=30)
text = full.choices[0].text
assert len(text) > 12, text
stop = text[8:11]
want = text[: text.find(stop)]
cut = client.completions.create(model="deltafin-kimi-k3", prompt="Once upon a time", max_tokens=30, stop=[stop])
assert cut.choices[0].text == want and cut.choices[0].finish_reason == "stop", (cut, want)
streamed, finish = "", None
for chunk in client.completions.create(
    model="deltafin-kimi-k3", prompt="Once upon a time", max_tokens=30, stop=stop, stream=True
):
    for c in chunk.choices:
        streamed += c.text or ""
        finish = c.finish_reason or finish
assert (streamed, finish) == (want, "stop"), (streamed, finish, want)

lc = client.chat.completions.create(
    model="deltafin-kimi-k3", messages=[{"role": "user", "content": "Hello"}], max_tokens=6,
    logprobs=True, top_logprobs=2,
)
content = lc.choices[0].logprobs.content
assert len(content) == lc.usage.completion_tokens == 6, lc
assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content), content
assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content), content
lp = client.completions.create(model="deltafin-kimi-k3", prompt="Once upon a time", max_tokens=5, logprobs=3)
assert len(lp.choices[0].logprobs.token_logprobs) == 5, lp
assert "".join(lp.choices[0].logprobs.tokens) == lp.choices[0].text, lp

# The loglikelihood request of evaluation harnesses: the prompt echoed and scored, no tokens.
prompt = "Once upon a time there was"
ll = client.completions.create(model="deltafin-kimi-k3", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
lpe = ll.choices[0].logprobs
assert ll.choices[0].text == prompt and ll.usage.completion_tokens == 0, ll
assert lpe.token_logprobs[0] is None and all(v <= 0 for v in lpe.token_logprobs[1:]), lpe
assert "".join(lpe.tokens) == prompt, lpe.tokens

# Structured outputs as the SDK sends them: a pydantic model turned into a strict json_schema
# (title, enum with type, additionalProperties false), the reply parsed back into the model.
from typing import List, Literal

from pydantic import BaseModel


class Cat(BaseModel):
    mood: Literal["calm", "angry", "sleepy"]
    legs: int
    indoor: bool
    toys: List[Literal["ball", "mouse"]]


parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
for seed in range(3):
    done = parse(
        model="deltafin-kimi-k3", messages=[{"role": "user", "content": "Describe a cat."}],
        response_format=Cat, max_tokens=300, seed=seed, temperature=0.8, extra_body={"thinking": False},
    )
    cat = done.choices[0].message.parsed
    assert isinstance(cat, Cat), done
    assert Cat.model_validate_json(done.choices[0].message.content) == cat, done

print("openai client check: models, chat, streamed chat (reasoning_content), completion, stop, logprobs, echo, structured outputs, API key: ok")
