#!/usr/bin/env bash
# Bit-identity of a refactor: two binaries (before, after) on K3-nano, K3-medium, a K3-slice,
# K3-tiny (the built-in model), gpt-oss-tiny and a Qwen3-MoE fixture. Per model it compares `run --json` (generated
# ids and first-step top-10 logits) and the whole `logits` document (every prompt position's
# logits, the routes, a greedy continuation's logits), and fails on any difference.
#   bash scripts/identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]
# WORK_DIR keeps the fixtures between runs (the slice is 6.9 GB; default: a temporary directory).
set -euo pipefail
before=${1:?usage: identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]}
after=${2:?usage: identity_check.sh BEFORE_BIN AFTER_BIN [WORK_DIR]}
work=${3:-$(mktemp -d)}
mkdir -p "$work"
for m in nano medium slice gpt-oss-tiny qwen3-moe; do
  [ -f "$work/$m/config.json" ] || "$before" fixture "$m" "$work/$m" >/dev/null
done
prompt="The quick brown fox jumps over the lazy dog. Once upon a time"
ids="1,5,9,13,2,7,11,3,17,19,23,29"
status=0
for m in nano medium slice tiny gpt-oss-tiny qwen3-moe; do
  root=()
  [ "$m" = tiny ] || root=(--model-root "$work/$m")
  outs=()
  for bin in "$before" "$after"; do
    out=$("$bin" run "${root[@]}" --prompt "$prompt" --max-new 12 --ignore-eos --json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["generated_ids"], json.dumps(d.get("first_step_top")))')
    gen=4
    [ "$m" = slice ] && gen=2
    sum=$("$bin" logits "${root[@]}" --prompt-ids "$ids" --generate "$gen" 2>/dev/null | sha256sum | cut -c1-16)
    echo "$m $(basename "$(dirname "$bin")")/$(basename "$bin"): $out logits-sha256 $sum"
    outs+=("$out $sum")
  done
  # A binary that did not report first_step_top (null) is compared on the rest.
  if [[ "${outs[0]}" == *" null "* || "${outs[1]}" == *" null "* ]]; then
    outs[0]="${outs[0]%% [\[n]*} ${outs[0]##* }"
    outs[1]="${outs[1]%% [\[n]*} ${outs[1]##* }"
  fi
  if [ "${outs[0]}" = "${outs[1]}" ]; then echo "$m: identical"; else echo "$m: DIFFERENT"; status=1; fi
done
exit $status
