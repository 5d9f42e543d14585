"""gpt-oss through the official `openai` Python package, against `deltafin serve` on the tiny
gpt-oss fixture with `--scripted-reply scripts/harmony_tool_reply.txt` (the model still runs;
its choice is replaced by a harmony reply: an analysis message, then a call addressed
`to=functions.get_weather` on the commentary channel, ended by `<|call|>`): the call comes back
as `message.tool_calls` with finish_reason "tool_calls" and the analysis as
`reasoning_content`; streamed, the SDK's stream helper assembles the call; the call and its
result go back as history (rendered in harmony's tool form); a forced tool_choice is refused
with 400 naming harmony; a raw completion answers.

Usage: python scripts/openai_gpt_oss_check.py http://127.0.0.1:PORT/v1
"""
import json
import sys

import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="not-needed")
model = "gpt-oss-tiny"
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "days": {"type": "integer"}},
                         "required": ["city"]}}}]
messages = [{"role": "user", "content": "Weather in Paris?"}]
want = [("get_weather", {"city": "Paris", "days": 2})]


def calls(tcs):
    return [(t.function.name, json.loads(t.function.arguments)) for t in tcs]


r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=200)
c = r.choices[0]
assert c.finish_reason == "tool_calls", c
assert calls(c.message.tool_calls) == want, c.message.tool_calls
assert all(t.id.startswith("call_") and t.type == "function" for t in c.message.tool_calls)
extra = c.message.model_extra or {}
assert extra.get("reasoning_content") == "The user wants the weather; call the tool.", extra
assert not c.message.content, c.message

stream_api = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
with stream_api(model=model, messages=messages, tools=tools, max_tokens=200) as s:
    for _ in s:
        pass
    final = s.get_final_completion()
fc = final.choices[0]
assert fc.finish_reason == "tool_calls", fc
assert calls(fc.message.tool_calls) == want, fc.message.tool_calls

history = messages + [c.message.model_dump(exclude_none=True)] + [
    {"role": "tool", "tool_call_id": t.id, "content": json.dumps({"temp": 18})}
    for t in c.message.tool_calls
]
again = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=200)
assert again.choices[0].finish_reason == "tool_calls", again
assert again.usage.prompt_tokens > r.usage.prompt_tokens, (again.usage, r.usage)

try:
    client.chat.completions.create(model=model, messages=messages, tools=tools,
                                   tool_choice="required", max_tokens=20)
    raise SystemExit("a forced tool_choice was accepted on harmony")
except openai.BadRequestError as e:
    assert "harmony" in str(e), e

comp = client.completions.create(model=model, prompt="Hello", max_tokens=5)
assert comp.choices[0].finish_reason in ("stop", "length"), comp
print("openai gpt-oss check: harmony tool call plain and streamed (SDK-assembled), reasoning_content, "
      "history with the tool result, forced tool_choice refused, completion: ok")
