#!/usr/bin/env bash
# `bench forward --floor` on a Qwen3-30B-A3B-shaped checkpoint at real widths (a prefix of its 48
# layers; hidden 2,048, 32 q / 4 kv heads of 128, 128 experts of 768, top 8, 151,936 ids): in
# RAM, then inside a cgroup v1/v2 memory limit smaller than the model (the experts streamed from
# the shards through the tiered store), then candle-transformers' in-RAM `qwen3_moe` on the same
# weights (BF16) as the speed reference. Prints one JSON summary line per configuration.
#   bash scripts/qwen3_moe_bench.sh [LAYERS=8] [LIMIT_GB=4] [WORK=/work/bench]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
layers=${1:-8} limit=${2:-4} work=${3:-/work/bench}
bin=$repo/target/release/deltafin
dir=$work/qwen3-30b-a3b-$layers
[ -f "$dir/config.json" ] || "$bin" fixture qwen3-moe "$dir" --shape 30b-a3b --layers "$layers" --shards 6 --seed 3
bench=(bench forward --model-root "$dir" --floor --prompt-len 16 --decode 16 --runs 5)
# In RAM: a RAM tier as large as the checkpoint, so every expert stays resident after the warm-up.
ram=$(du -s --block-size=1G "$dir" | cut -f1)
echo "== deltafin, in RAM (expert RAM tier ${ram} GB)"
"$bin" "${bench[@]}" --ram-gb "$ram" 2>/dev/null | tail -1
echo "== deltafin, under a ${limit} GB memory cgroup"
cg=/sys/fs/cgroup/memory/deltafin-bench
[ -d /sys/fs/cgroup/memory ] || cg=/sys/fs/cgroup/deltafin-bench
mkdir -p "$cg"
if [ -f "$cg/memory.limit_in_bytes" ]; then echo $((limit << 30)) >"$cg/memory.limit_in_bytes"; else echo $((limit << 30)) >"$cg/memory.max"; fi
sync; echo 3 >/proc/sys/vm/drop_caches
sh -c "echo \$\$ >$cg/cgroup.procs && exec $bin ${bench[*]}" 2>/dev/null | tail -1
echo "== candle-transformers qwen3_moe, in RAM (BF16)"
(cd "$repo" && DELTAFIN_QWEN3_BENCH=$dir cargo test --release --quiet --test qwen3_moe -- \
    --ignored --nocapture candle_transformers_decode_speed 2>/dev/null | grep '^{')
