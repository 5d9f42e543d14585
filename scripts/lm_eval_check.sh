#!/usr/bin/env bash
# lm-evaluation-harness's `local-completions` model against `deltafin serve` on K3-tiny, offline
# (issue 32; not in .ci/run: lm-eval pulls in torch, about 3 GB): a local multiple-choice task
# of 100 items from the held-out text (data/heldout), scored by loglikelihood through the
# completions endpoint (`echo`, `logprobs`); then every loglikelihood lm-eval used is checked
# against a direct prompt-scoring request (`echo: true, max_tokens: 0`).
#   scripts/lm_eval_check.sh [WORK_DIR]     # default target/lm-eval
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$repo/target/lm-eval}
venv=${DELTAFIN_LM_EVAL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/lm-eval-0.4.13-venv}
bin=$repo/target/release/deltafin
if ! "$venv/bin/python" -c 'import lm_eval, tenacity, transformers' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check 'lm-eval[api]==0.4.13' 'transformers==5.25.0'
fi
(cd "$repo" && cargo build --release --bin deltafin)
rm -rf "$work" && mkdir -p "$work/tasks" "$work/tok"
python3 "$repo/scripts/lm_eval_task.py" "$repo/data/heldout/persuasion.txt" "$work/heldout.jsonl" 100
cat >"$work/tasks/k3tiny_heldout.yaml" <<YAML
task: k3tiny_heldout
dataset_path: json
dataset_kwargs:
  data_files:
    test: $work/heldout.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
YAML
# The tokenizer lm-eval counts context tokens with: K3-tiny's, exported as tokenizer.json.
"$bin" export-tokenizer --model-root "$repo/assets/k3-tiny" --out "$work/tok/tokenizer.json"
echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' >"$work/tok/tokenizer_config.json"
port=$((20000 + RANDOM % 20000))
"$bin" serve --port "$port" 2>"$work/serve.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)" = 200 ] && break
    sleep 0.5
done
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$venv/bin/lm_eval" --model local-completions \
    --model_args "model=deltafin-kimi-k3,base_url=http://127.0.0.1:$port/v1/completions,tokenizer_backend=huggingface,tokenizer=$work/tok,tokenized_requests=False,num_concurrent=1,max_retries=1" \
    --tasks k3tiny_heldout --include_path "$work/tasks" --output_path "$work/out" --log_samples \
    2>"$work/lm_eval.log" | grep -E '^\|'
"$venv/bin/python" "$repo/scripts/lm_eval_verify.py" "$work/out" "$work/tok/tokenizer.json" \
    "http://127.0.0.1:$port"
