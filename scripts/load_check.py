"""A load test with the official `openai` client against a running deltafin server.

Usage: python scripts/load_check.py http://127.0.0.1:PORT/v1 CLIENTS [ALONE_URL]

CLIENTS clients (32 in CI, against `--max-batch 8 --queue 16`) send one request each at the
same moment: prompts of mixed lengths (a few tokens to several hundred), replies of 4 to 40
tokens, greedy and seeded sampling, streamed and not. A request over the limit must get 429
with a Retry-After header (the client then waits that long and retries); any 5xx or other
error fails the check. Then every request is sent again alone, one at a time, to ALONE_URL
(in CI a second server with `--max-batch 1 --no-prompt-cache`, so no answer can come from a
state the concurrent run saved; default: the same server), and each concurrent answer must
equal its alone answer. Prints one JSON line of figures.
"""
import json
import sys
import threading
import time

import openai
from openai import OpenAI

base, clients = sys.argv[1], int(sys.argv[2])
alone_base = sys.argv[3] if len(sys.argv) > 3 else base
MODEL = "deltafin-kimi-k3"
WORDS = ["hello", "tell me about the sea", "one two three four five six seven eight nine ten"]


def request(i):
    content = " ".join([WORDS[i % 3]] * (1 + (i * 13) % 60))
    r = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4 + (i * 7) % 37,
    }
    if i % 3 == 1:
        r["temperature"] = 0.8
        r["seed"] = 1000 + i
    return r, i % 2 == 1


def ask(client, r, stream):
    """The answer's (content, finish_reason, completion tokens)."""
    if not stream:
        c = client.chat.completions.create(**r)
        return c.choices[0].message.content, c.choices[0].finish_reason, c.usage.completion_tokens
    s = client.chat.completions.create(**r, stream=True, stream_options={"include_usage": True})
    text, finish, used = "", None, None
    for chunk in s:
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    return text, finish, used


client = OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=600)
reqs = [request(i) for i in range(clients)]
answers, errors, refused, waits = [None] * clients, [], [0] * clients, []
gate = threading.Barrier(clients)


def worker(i):
    r, stream = reqs[i]
    gate.wait()
    t0 = time.time()
    while True:
        try:
            answers[i] = ask(client, r, stream)
            waits.append(time.time() - t0)
            return
        except openai.RateLimitError as e:
            after = e.response.headers.get("retry-after")
            if after is None:
                errors.append(f"request {i}: 429 without Retry-After")
                return
            refused[i] += 1
            time.sleep(float(after))
        except Exception as e:  # 5xx, connection errors, anything else fails the check
            errors.append(f"request {i}: {type(e).__name__}: {e}")
            return


threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
t0 = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - t0
assert not errors, errors
assert all(a is not None for a in answers), "a request got no answer"
tokens = sum(a[2] for a in answers)
t1 = time.time()
alone_client = OpenAI(base_url=alone_base, api_key="not-needed", max_retries=0, timeout=600)
alone = [ask(alone_client, r, stream) for r, stream in reqs]
alone_wall = time.time() - t1
diff = [i for i in range(clients) if answers[i] != alone[i]]
assert not diff, [(i, answers[i], alone[i]) for i in diff]
print(json.dumps({
    "figure": "load_check", "clients": clients, "answered": clients, "server_errors": 0,
    "requests_refused_429_at_least_once": sum(1 for x in refused if x),
    "total_429": sum(refused), "wait_s_max": round(max(waits), 2), "completion_tokens": tokens,
    "concurrent_wall_s": round(wall, 2), "sequential_wall_s": round(alone_wall, 2),
    "identical_to_alone": clients,
}))
