#!/usr/bin/env bash
# The independent reference check (issue 27): deltafin against Apple's mlx-lm `kimi_k3` (PyPI,
# run on the CPU in fp32, called, never copied) on K3-nano, K3-medium and K3-tiny: every
# position of a 16-token prompt and a 16-token greedy continuation (and a 150-token prompt on
# K3-medium: three prefill chunks); routes and greedy ids must be identical and logits within
# 2e-3 relative. Each run also has a negative control (mlx-lm with KDA's A_log read per channel)
# that must disagree, so the check can see that error.
# Also: our K3 tool-call parser against mlx-lm's kimi_k3 tool parser on one corpus, the
# json_schema mask's replies against the jsonschema package, gpt-oss against transformers, and
# our harmony prompts against openai-harmony (scripts/harmony_check.py).
#   scripts/reference_check.sh [WORK_DIR]     # default target/reference-check
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$repo/target/reference-check}
venv=${DELTAFIN_REFERENCE_VENV:-$repo/target/reference-venv}
bin=$repo/target/release/deltafin
mkdir -p "$work"
# mlx-lm's package __init__ imports transformers, which its wheel lists as a dependency.
# jsonschema validates the json_schema mask's replies.
if ! "$venv/bin/python" -c 'import mlx.core, mlx_lm.models.kimi_k3, jsonschema' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        'mlx==0.32.4' 'mlx-cpu==0.32.4' 'mlx-lm==0.32.2' 'jsonschema==4.26.0'
fi
(cd "$repo" && cargo build --release --bin deltafin)
rm -rf "$work/nano" "$work/medium"
"$bin" fixture nano "$work/nano" --seed 11 --shards 3
"$bin" fixture medium "$work/medium" --seed 5
status=0
run() {
    "$venv/bin/python" "$repo/scripts/reference_check.py" --deltafin "$bin" "$@" || status=1
}
run --model "$work/nano" --name K3-nano --seed 1 --json "$work/nano.json"
run --model "$work/medium" --name K3-medium --seed 2 --json "$work/medium.json"
run --model "$repo/assets/k3-tiny" --name K3-tiny --seed 3 --json "$work/k3-tiny.json"
# A prompt of three prefill chunks (64 + 64 + 22 positions) against mlx-lm's single pass.
run --model "$work/medium" --name K3-medium-150 --seed 4 --prompt-len 150 --generate 4 \
    --json "$work/medium-150.json"
# The int8-activation MXFP4 kernel (`--kernel fast`, opt-in; the same as exact on a CPU without
# AVX-512 VNNI). Its gate: K3-tiny's held-out NLL over 16,384 tokens within 0.1% of the exact
# path's, and top-1 agreement with it of at least 99% (about 20 s). Then what it keeps of
# mlx-lm's argmax on K3-tiny and K3-medium, reported (int8 activations move each matrix by about
# 1%, so a near-tie can flip).
"$bin" eval --model-root "$repo/assets/k3-tiny" --text "$repo/data/heldout/persuasion.txt" \
    --window 512 --max-tokens 16384 --compare exact fast --json > "$work/kernel-fast.json"
python3 - "$work/kernel-fast.json" <<'EOF' || status=1
import json, sys
r = json.load(open(sys.argv[1]))["compare"]["report"]
change = abs(r["nll_b"] - r["nll_a"]) / r["nll_a"]
print(f"--kernel fast on K3-tiny, {r['positions']} positions: NLL {r['nll_b']:.5f} vs exact "
      f"{r['nll_a']:.5f} ({100 * change:.4f}%), top-1 agree {100 * r['top1_agreement']:.2f}%, "
      f"KL mean {r['kl_mean']:.2e}")
if change > 1e-3 or r["top1_agreement"] < 0.99:
    sys.exit("FAIL --kernel fast: NLL more than 0.1% from exact, or top-1 agreement under 99%")
EOF
run --model "$repo/assets/k3-tiny" --name K3-tiny --seed 8 --prompt-len 64 --kernel fast
run --model "$work/medium" --name K3-medium --seed 2 --kernel fast
# Tool calls (issue 32): mlx-lm's kimi_k3 tool parser against ours on generated and hand-written
# tools sections (the corpus is written by an ignored unit test).
(cd "$repo" && DELTAFIN_TOOL_CORPUS="$work/tool-corpus.jsonl" \
    cargo test --release --quiet --lib -- --ignored write_tool_corpus) || status=1
"$venv/bin/python" "$repo/scripts/tool_parser_check.py" "$work/tool-corpus.jsonl" || status=1
# response_format json_schema (issue 32): replies sampled under the schema mask, validated by the
# jsonschema package.
(cd "$repo" && DELTAFIN_SCHEMA_CORPUS="$work/schema-corpus.jsonl" \
    cargo test --release --quiet --lib -- --ignored write_schema_corpus) || status=1
"$venv/bin/python" "$repo/scripts/schema_check.py" "$work/schema-corpus.jsonl" || status=1
# gpt-oss (issue 33) against Hugging Face transformers' GptOssForCausalLM (CPU torch, fp32, the
# MXFP4 experts dequantized by transformers): two seeds and shard splits, a prompt three times
# the sliding window, every position's logits, routes and a greedy continuation, and three
# negative controls (no SwiGLU clamp, YaRN range rounded, no sliding window) that must fail.
# The venv (5 GB, about 2 minutes to install) lives in the user's cache, keyed by the pinned
# versions, so a clean clone does not install it again.
tvenv=${DELTAFIN_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/torch2.6.0-transformers5.25.0-venv}
if ! "$tvenv/bin/python" -c 'import torch, transformers, accelerate, openai_harmony, tiktoken' 2>/dev/null; then
    [ -x "$tvenv/bin/python" ] || python3 -m venv "$tvenv"
    "$tvenv/bin/pip" install -q --disable-pip-version-check \
        'torch==2.6.0' 'transformers==5.25.0' 'accelerate==1.16.0' \
        'openai-harmony==0.0.8' 'tiktoken==0.14.0'
fi
for spec in "0 3" "7 1"; do
    set -- $spec
    rm -rf "$work/gpt-oss-$1"
    "$bin" fixture gpt-oss-tiny "$work/gpt-oss-$1" --seed "$1" --shards "$2"
    "$tvenv/bin/python" "$repo/scripts/gpt_oss_reference.py" --deltafin "$bin" \
        --model "$work/gpt-oss-$1" --name "gpt-oss-tiny (seed $1, $2 shard files)" --seed "$1" \
        --prompt-len 24 --generate 8 --json "$work/gpt-oss-$1.json" || status=1
done
# Qwen3-MoE (issue 43) against transformers' Qwen3MoeForCausalLM (CPU torch, fp32): three
# seeds, shapes and shard splits (an expert straddling two files; dense MLP layers from
# `decoder_sparse_step`/`mlp_only_layers`; tied embeddings without renormalised top-k weights),
# every position's logits, routes and a greedy continuation, and two negative controls
# (`norm_topk_prob` flipped, another rotary base) that must fail.
for spec in "0 3 --shape=tiny" "1 5 --hidden=128 --heads=8 --head-dim=32 --experts=32 --top-k=8 --moe-inter=64 --no-norm-topk --tied" \
    "2 1 --sparse-step=2 --mlp-only=2"; do
    set -- $spec
    seed=$1 shards=$2
    shift 2
    rm -rf "$work/qwen3-moe-$seed"
    "$bin" fixture qwen3-moe "$work/qwen3-moe-$seed" --seed "$seed" --shards "$shards" "$@"
    "$tvenv/bin/python" "$repo/scripts/qwen3_moe_reference.py" --deltafin "$bin" \
        --model "$work/qwen3-moe-$seed" --name "Qwen3-MoE (seed $seed, $shards shard files $*)" \
        --seed "$seed" --prompt-len 40 --generate 8 --json "$work/qwen3-moe-$seed.json" || status=1
done
# EAGLE-3 draft heads (issue 44) against vLLM `speculators`' own module (CPU torch, fp32):
# four random heads written by speculators (norm before residual or not, a Qwen3 layer with
# norm before fc, per-tap fc norms with post-norm feedback), one also in SpecForge's spelling;
# every position's draft logits and target ids, and a control that must fail. speculators'
# own dependencies pull another torch, so it is installed without them beside the torch venv,
# with the few it imports.
spec_dir=${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/speculators-0.9.0
if ! PYTHONPATH="$spec_dir/pkg:$spec_dir/deps" "$tvenv/bin/python" \
    -c 'import speculators.models.eagle3.core' 2>/dev/null; then
    rm -rf "$spec_dir"
    "$tvenv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$spec_dir/pkg" \
        'speculators==0.9.0' 'hs-connectors==0.9.0'
    "$tvenv/bin/pip" install -q --disable-pip-version-check --target "$spec_dir/deps" \
        'openai==3.63.0' 'loguru==0.7.3' 'pydantic-settings==2.16.3' 'datasets==5.2.0'
fi
mkdir -p "$work/eagle3"
PYTHONPATH="$spec_dir/pkg:$spec_dir/deps" "$tvenv/bin/python" "$repo/scripts/eagle3_reference.py" \
    --deltafin "$bin" --work "$work/eagle3" || status=1
# DFlash and DSpark block drafters against speculators' DFlashDraftModel and DSparkDraftModel
# (eager attention over its own anchor-block mask): six random heads (1-3 layers, blocks of 4-8,
# draft or full vocabulary, biases, three Markov heads), every slot of every anchor's block,
# z-lab's spelling, and a control per head that must fail.
PYTHONPATH="$spec_dir/pkg:$spec_dir/deps" "$tvenv/bin/python" "$repo/scripts/dflash_reference.py" \
    --deltafin "$bin" --work "$work/eagle3" || status=1
# Harmony prompts (gpt-oss) against OpenAI's renderer, openai-harmony, token for token with the
# real o200k_harmony vocabulary: o200k_base's ranks come from the npm package `tiktoken` (the
# script accepts them only with the SHA-256 openai-harmony checks); transformers' converter
# writes our side's tokenizer.json from them.
npm_dir=${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/npm-tiktoken-1.0.22
o200k=$npm_dir/node_modules/tiktoken/encoders/o200k_base.json
[ -f "$o200k" ] || npm install --silent --no-audit --no-fund --prefix "$npm_dir" tiktoken@1.0.22
"$tvenv/bin/python" "$repo/scripts/harmony_check.py" --deltafin "$bin" --o200k-json "$o200k" \
    --work "$work/harmony" || status=1
if [[ $status -ne 0 ]]; then
    echo "reference check: FAILED" >&2
    exit 1
fi
echo "reference check: 10 passed, 0 failed"
