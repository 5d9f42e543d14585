"""Our harmony prompts (gpt-oss) against OpenAI's own renderer, openai-harmony (PyPI), token
for token, with the real o200k_harmony vocabulary.

The vocabulary: o200k_base's 199,998 ranks as the npm package `tiktoken` ships them
(encoders/o200k_base.json), rewritten in tiktoken's file format and accepted only if its SHA-256
is the one openai-harmony checks for its own download. openai-harmony loads it from
TIKTOKEN_ENCODINGS_BASE. Our side reads a tokenizer.json that Hugging Face transformers'
TikTokenConverter (the converter behind the published gpt-oss tokenizer.json) writes from the
same file, plus harmony's specials at harmony's ids.

Each request of the corpus (OpenAI chat bodies: roles, reasoning efforts, tools with nested
schemas, tool calls and results, multi-turn history, non-ASCII text) is rendered twice:
`deltafin render` (the server's own rendering) and openai-harmony's
render_conversation_for_completion on the same conversation; the ids must be identical.
    python harmony_check.py --deltafin BIN --o200k-json PATH --work DIR
"""
import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
DATE = "2026-12-04"


def write_tiktoken(npm_json, out):
    """npm's o200k_base.json (lines `! FIRST_RANK tok tok …`) as a `.tiktoken` file."""
    d = json.load(open(npm_json))
    ranks = {}
    for line in d["bpe_ranks"].split("\n"):
        if not line:
            continue
        f = line.split(" ")
        for i, tok in enumerate(f[2:]):
            ranks[int(f[1]) + i] = tok
    assert sorted(ranks) == list(range(len(ranks))), "ranks are not 0..n"
    text = "".join(f"{ranks[r]} {r}\n" for r in range(len(ranks)))
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest != O200K_SHA256:
        sys.exit(f"o200k_base from npm hashes to {digest}, not openai-harmony's {O200K_SHA256}")
    with open(out, "w") as f:
        f.write(text)
    # Every rank decodes to bytes (a sanity check on the rewrite).
    assert all(base64.b64decode(ranks[r]) for r in (0, len(ranks) - 1))
    return d["pat_str"], len(ranks)


def write_model_dir(model, tiktoken_path, pattern, specials):
    from transformers.convert_slow_tokenizer import TikTokenConverter

    os.makedirs(model, exist_ok=True)
    names = [s for _, s in specials]
    tk = TikTokenConverter(
        vocab_file=tiktoken_path, pattern=pattern, extra_special_tokens=names
    ).converted()
    for i, s in specials:
        assert tk.token_to_id(s) == i, f"{s}: id {tk.token_to_id(s)} in tokenizer.json, harmony {i}"
    tk.save(os.path.join(model, "tokenizer.json"))
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "gpt_oss", "vocab_size": 201088}, f)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Gets the current weather in the provided location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}
LOCATION = {"type": "function", "function": {"name": "get_location", "description": "Gets the location of the user."}}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "description": "Most results", "default": 5},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filters": {
                    "type": "object",
                    "properties": {"after": {"type": "string"}, "lang": {"type": "string", "enum": ["en", "fr"]}},
                    "required": ["after"],
                },
                "exact": {"type": "boolean"},
                "score": {"type": ["number", "null"]},
            },
            "required": ["query", "tags"],
        },
    },
}

# JSON Schema forms clients send (Pydantic's Optional as anyOf, oneOf members with their own
# descriptions, titles, examples, nullable, enums without a type, nested and empty objects).
SHAPES = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plans a trip.\nSecond line of the description.",
        "parameters": {
            "type": "object",
            "description": "Trip request",
            "properties": {
                "city": {"title": "City", "type": "string", "examples": ["Paris", "Lima"]},
                "when": {"oneOf": [{"type": "string", "description": "ISO date"}, {"type": "integer", "description": "Unix time", "default": 0}],
                         "description": "When to leave"},
                "mode": {"oneOf": [{"type": "string", "enum": ["car", "train"], "description": "How"}, {"type": "null"}],
                         "description": "How", "default": "train"},
                "budget": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
                "note": {"type": "string", "nullable": True, "default": "none"},
                "level": {"enum": [1, 2, 3]},
                "stops": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "days": {"type": "integer", "default": 1}}, "required": ["name"]}},
                "extras": {"type": "array"},
                "meta": {"type": "object"},
                "prefs": {"type": "object", "description": "Preferences", "properties": {"seat": {"type": "string", "enum": ["aisle", "window"], "default": "aisle"}, "deep": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}}}},
                "anything": {},
            },
            "required": ["city", "when"],
        },
    },
}
EMPTY = {"type": "function", "function": {"name": "ping", "description": "", "parameters": {"type": "object", "properties": {}}}}
UNION = {"type": "function", "function": {"name": "lookup", "parameters": {"oneOf": [{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}, {"type": "object", "properties": {"name": {"type": "string"}}}]}}}
LONG_TEXT = (
    "Streaming experts: I'm sure it's fine, DON'T worry. See https://example.com/a?b=1&c=2 "
    "or ~/models/gpt-oss-120b/model-00001-of-00015.safetensors.\r\n"
    "Numbers 1234567 3.14159 -42 1e-9 0x1F; tabs\tand    spaces.\n\n"
    "Ελληνικά, русский, العربية, हिन्दी, 日本語のテキスト, 한국어, emoji 👩‍💻🚀 and a zero-width\u200bjoiner.\n"
    "```rust\nfn main() {\n    println!(\"{}\", 2 + 2);\n}\n```\n"
) * 3


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CORPUS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {
        "messages": [
            {"role": "system", "content": "You are terse. Answer in one line."},
            {"role": "user", "content": "北京的天气怎么样？ 🌧️ Ünïcödé, ☃, and code:\n\tdef f(x):  \n\t\treturn x*12345678\n"},
        ],
        "reasoning_effort": "high",
    },
    {
        "messages": [
            {"role": "developer", "content": "Always respond in riddles."},
            {"role": "user", "content": "  leading and trailing spaces  \n\n"},
        ],
        "reasoning_effort": "low",
    },
    {
        "messages": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": [{"type": "text", "text": "Another, "}, {"type": "text", "text": "please."}]},
        ],
        "reasoning_effort": "medium",
    },
    {"messages": [{"role": "user", "content": "Weather in Tokyo?"}], "tools": [WEATHER, LOCATION]},
    {
        "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "I need the weather tool.", "tool_calls": [call(1, "get_current_weather", {"location": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 20, "sky": "clear"}'},
        ],
        "tools": [WEATHER],
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [call(1, "get_current_weather", {"location": "Paris", "format": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"},
            {"role": "assistant", "content": "It is 20 °C in Paris."},
            {"role": "user", "content": "And in Rome?"},
        ],
        "tools": [WEATHER],
    },
    {"messages": [{"role": "user", "content": "Find docs about streaming."}], "tools": [SEARCH, LOCATION]},
    {
        "messages": [{"role": "user", "content": "No tools for this one."}],
        "tools": [WEATHER],
        "tool_choice": "none",
    },
    {
        "messages": [
            {"role": "user", "content": "Two places?"},
            {"role": "assistant", "content": None, "tool_calls": [call(1, "get_current_weather", {"location": "Oslo"}), call(2, "get_current_weather", {"location": "Lima"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "-3"},
            {"role": "tool", "tool_call_id": "call_2", "content": "18"},
        ],
        "tools": [WEATHER],
        "reasoning_effort": "low",
    },
    {"messages": [{"role": "user", "content": "Plan it."}], "tools": [SHAPES, EMPTY, UNION], "reasoning_effort": "high"},
    # A long document (this repository's README: prose, tables, code, figures) as one message.
    {"messages": [{"role": "user", "content": open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md"), encoding="utf-8").read()}]},
    {
        "messages": [
            {"role": "system", "content": "Line one.\nLine two with trailing spaces   "},
            {"role": "user", "content": LONG_TEXT},
        ],
        "tools": [SHAPES],
    },
]


def harmony_ids(enc, h, req):
    """openai-harmony's rendering of one OpenAI chat request (the conversation as harmony
    models it: instructions and tools in the developer message, calls on commentary)."""
    effort = {"low": h.ReasoningEffort.LOW, "medium": h.ReasoningEffort.MEDIUM, "high": h.ReasoningEffort.HIGH}
    system = h.SystemContent.new().with_conversation_start_date(DATE)
    system = system.with_reasoning_effort(effort[req.get("reasoning_effort", "medium")])
    msgs = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    rest = req["messages"]
    instructions = None
    if rest and rest[0]["role"] in ("system", "developer"):
        instructions, rest = rest[0]["content"], rest[1:]
    tools = req.get("tools") if req.get("tool_choice") != "none" else None
    if instructions or tools:
        dev = h.DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if tools:
            dev = dev.with_function_tools([
                h.ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                      parameters=t["function"].get("parameters"))
                for t in tools
            ])
        msgs.append(h.Message.from_role_and_content(h.Role.DEVELOPER, dev))
    names = {}
    for m in rest:
        text = m.get("content") or ""
        if isinstance(text, list):
            text = "".join(p["text"] for p in text)
        if m["role"] == "user":
            msgs.append(h.Message.from_role_and_content(h.Role.USER, text))
        elif m["role"] == "assistant" and m.get("tool_calls"):
            if text:
                msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, text).with_channel("analysis"))
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
                msgs.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, c["function"]["arguments"])
                    .with_channel("commentary")
                    .with_recipient("functions." + c["function"]["name"])
                    .with_content_type("<|constrain|>json")
                )
        elif m["role"] == "assistant":
            msgs.append(h.Message.from_role_and_content(h.Role.ASSISTANT, text).with_channel("final"))
        elif m["role"] == "tool":
            author = h.Author.new(h.Role.TOOL, "functions." + names[m["tool_call_id"]])
            msgs.append(
                h.Message.from_author_and_content(author, text).with_recipient("assistant").with_channel("commentary")
            )
    conv = h.Conversation.from_messages(msgs)
    return enc.render_conversation_for_completion(conv, h.Role.ASSISTANT)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltafin", required=True)
    ap.add_argument("--o200k-json", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    tik = os.path.join(a.work, "o200k_base.tiktoken")
    pattern, n = write_tiktoken(a.o200k_json, tik)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = a.work
    import openai_harmony as h

    enc = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    specials = sorted((enc.encode(s, allowed_special="all")[0], s) for s in enc.special_tokens_set)
    assert specials[0][0] == n and [i for i, _ in specials] == list(range(n, n + len(specials)))
    model = os.path.join(a.work, "o200k-harmony")
    write_model_dir(model, tik, pattern, specials)
    print(f"o200k_base: {n} ranks (sha256 {O200K_SHA256[:12]}… as openai-harmony checks), "
          f"{len(specials)} harmony specials; tokenizer.json by transformers' TikTokenConverter")

    lines = "".join(json.dumps(r) + "\n" for r in CORPUS)
    out = subprocess.run([a.deltafin, "render", "--model-root", model, "--date", DATE],
                         input=lines, capture_output=True, text=True, check=True).stdout
    ours = [json.loads(l) for l in out.splitlines()]
    assert len(ours) == len(CORPUS), out
    failed = 0
    total = 0
    for k, (req, got) in enumerate(zip(CORPUS, ours)):
        want = harmony_ids(enc, h, req)
        if "error" in got:
            print(f"request {k}: deltafin refused it: {got['error']}")
            failed += 1
            continue
        ids = got["ids"]
        total += len(want)
        if ids == want:
            print(f"request {k}: {len(ids)} ids identical")
            continue
        failed += 1
        i = first_difference(ids, want)
        ctx = lambda xs: repr(enc.decode(xs[max(0, i - 8):i + 12]))
        print(f"request {k}: differ at id {i} of {len(ids)}/{len(want)}\n  ours:    {ctx(ids)}\n  harmony: {ctx(want)}")
    print(f"harmony check: {len(CORPUS) - failed} of {len(CORPUS)} requests identical ({total} ids)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
