"""Tool calls through the official `openai` Python package, against `deltafin serve
--scripted-reply scripts/tool_reply.txt` (the model still runs; its choice is replaced by the
scripted K3 tools section): tools in, `message.tool_calls` out with finish_reason
"tool_calls"; streamed, the SDK's own stream helper assembles `delta.tool_calls`; the calls
and their results go back as history.

Usage: python scripts/openai_tools_check.py http://127.0.0.1:PORT/v1
"""
import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="not-needed")
tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]
want = [
    ("get_weather", {"city": 'Paris "centre" & 漢字', "days": 3, "opts": {"units": ["C", {"x": None}]}}),
    ("search", {"q": "weather\nnow"}),
]
messages = [{"role": "user", "content": "Weather in Paris?"}]


def calls(tcs):
    return [(t.function.name, json.loads(t.function.arguments)) for t in tcs]


r = client.chat.completions.create(model="deltafin-kimi-k3", messages=messages, tools=tools, max_tokens=2000)
c = r.choices[0]
assert c.finish_reason == "tool_calls", c
assert c.message.content == "Let me check.", c.message
assert calls(c.message.tool_calls) == want, c.message.tool_calls
assert all(t.id.startswith("call_") and t.type == "function" for t in c.message.tool_calls)

# Streamed: the SDK's stream helper accumulates the delta.tool_calls chunks.
stream_api = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
with stream_api(model="deltafin-kimi-k3", messages=messages, tools=tools, max_tokens=2000) as s:
    for _ in s:
        pass
    final = s.get_final_completion()
fc = final.choices[0]
assert fc.finish_reason == "tool_calls", fc
assert calls(fc.message.tool_calls) == want, fc.message.tool_calls
assert fc.message.content == "Let me check.", fc.message

# The calls and their results go back as history.
history = messages + [c.message.model_dump(exclude_none=True)] + [
    {"role": "tool", "tool_call_id": t.id, "content": json.dumps({"ok": i})}
    for i, t in enumerate(c.message.tool_calls)
]
again = client.chat.completions.create(model="deltafin-kimi-k3", messages=history, tools=tools, max_tokens=2000)
assert again.choices[0].finish_reason == "tool_calls", again
# tool_choice "none": forced to end where the response closes, no calls.
none = client.chat.completions.create(model="deltafin-kimi-k3", messages=messages, tools=tools,
                                      tool_choice="none", max_tokens=2000)
assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop", none
print("openai tools check: tool_calls plain and streamed (SDK-assembled), history with results, tool_choice none: ok")
