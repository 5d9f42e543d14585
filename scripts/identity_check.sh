#!/usr/bin/env bash
# Bit-identity of a refactor: `run --json` with two binaries (before, after) on K3-nano,
# K3-medium, a K3-slice and K3-tiny (the built-in model); prints both binaries' generated ids and
# first-step top-10 logits per model and fails on any difference.
#   bash scripts/identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]
# WORK_DIR keeps the fixtures between runs (the slice is 6.9 GB; default: a temporary directory).
set -euo pipefail
before=${1:?usage: identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]}
after=${2:?usage: identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]}
work=${3:-$(mktemp -d)}
mkdir -p "$work"
for m in nano medium slice; do
  [ -f "$work/$m/config.json" ] || "$after" fixture "$m" "$work/$m" >/dev/null
done
prompt="The quick brown fox jumps over the lazy dog. Once upon a time"
status=0
for m in nano medium slice tiny; do
  root=()
  [ "$m" = tiny ] || root=(--model-root "$work/$m")
  outs=()
  for bin in "$before" "$after"; do
    out=$("$bin" run "${root[@]}" --prompt "$prompt" --max-new 12 --ignore-eos --json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["generated_ids"], json.dumps(d["first_step_top"]))')
    echo "$m $(basename "$bin"): $out"
    outs+=("$out")
  done
  if [ "${outs[0]}" = "${outs[1]}" ]; then echo "$m: identical"; else echo "$m: DIFFERENT"; status=1; fi
done
exit $status
