"""response_format json_schema against an independent validator: every reply deltafin's
schema mask let a random sampler write (src/chat/json_schema_tests.rs, write_schema_corpus)
must be valid against its schema by the `jsonschema` package (PyPI, Draft 2020-12, imported
and called). The control replies, written under the plain json_object mask, must include
invalid ones, so that the check can see a reply that breaks the schema.

    python scripts/schema_check.py CORPUS.jsonl
"""

import json
import sys

import jsonschema


def main():
    rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
    replies = bad = control = control_bad = 0
    for i, row in enumerate(rows):
        v = jsonschema.Draft202012Validator(row["schema"])
        v.check_schema(row["schema"])
        for text in row["replies"]:
            replies += 1
            errors = list(v.iter_errors(json.loads(text)))
            if errors:
                bad += 1
                print(f"schema {i}: INVALID {text!r}: {errors[0].message}", file=sys.stderr)
        for text in row["control"]:
            control += 1
            control_bad += not v.is_valid(json.loads(text))
    print(f"schema check: {len(rows)} schemas, {replies} masked replies, {bad} invalid; "
          f"control (json_object mask): {control_bad} of {control} invalid")
    if replies < 3 * len(rows) or bad or control_bad == 0:
        print("schema check: FAILED", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
