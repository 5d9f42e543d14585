"""Agreement of deltafin's K3 tool-call parser with mlx-lm's (PyPI mlx-lm,
mlx_lm/tool_parsers/kimi_k3.py, imported and called, never copied): for every section in the
corpus deltafin wrote, both must find the same calls (names, and arguments as JSON values).

    python scripts/tool_parser_check.py CORPUS.jsonl
"""

import json
import sys

from mlx_lm.tool_parsers import kimi_k3


def theirs(text):
    try:
        return [{"name": c["name"], "arguments": c["arguments"]} for c in kimi_k3.parse_tool_call(text)]
    except ValueError:
        # mlx-lm raises when it finds no call.
        return []


def main():
    rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
    bad = 0
    calls = 0
    for i, row in enumerate(rows):
        ours = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in row["calls"]]
        ref = theirs(row["text"])
        calls += len(ref)
        if ours != ref:
            bad += 1
            print(f"section {i} disagrees:\n  text {row['text']!r}\n  deltafin {ours}\n  mlx-lm   {ref}")
    print(f"tool parser check: {len(rows)} sections, {calls} calls by mlx-lm, {bad} disagreements")
    sys.exit(1 if bad or not rows else 0)


if __name__ == "__main__":
    main()
