#!/usr/bin/env bash
# ARM64 Linux as a tested platform, under emulation (correctness only; qemu-user is slow):
#   1. installs what it needs by name: the rustup target aarch64-unknown-linux-gnu, Debian's
#      gcc-aarch64-linux-gnu (the linker) and qemu-user;
#   2. cross-builds and runs the library's unit tests (every MXFP4 kernel, exact and int8,
#      against its scalar reference on odd sizes, tails, zero and subnormal scales) twice:
#      under qemu's `-cpu max` (NEON with the dot-product extension: `Kernel::NeonDot`) and
#      under `-cpu cortex-a53` (ARMv8.0 without it: the fallbacks `Kernel::NeonInt8`); the dense
#      spine's NEON kernels against the portable one the same way;
#   3. runs end-to-end test files whose spawned binaries go through the same runner
#      (tests/common/runner.rs reads CARGO_TARGET_<TRIPLE>_RUNNER): $E2E below;
#   4. ARM64 = x86-64: `deltafin logits` (a prompt, routes and a greedy continuation) on K3-nano,
#      K3-tiny, a gpt-oss fixture and a Qwen3-MoE fixture, with `--kernel exact` and
#      `--kernel fast`, on the cross-built binary under qemu and the native one: greedy ids and
#      routes identical and the logits bit-identical with both kernels: every kernel is
#      bit-identical to its plain-Rust statement on both, K3's sums over a row run in a fixed
#      order (candle's CPU sum adds AVX lanes on one and NEON lanes on the other) and `tanh` is
#      computed in f64 and rounded once (glibc's `tanhf` differs between the two). A one-ulp
#      difference anywhere would show: `--kernel fast` quantizes expert inputs to int8, and
#      K3-nano's logits moved by 7.6e-3 when only `tanhf` differed.
# The cross-build's target directory lives in the user's cache (like the reference venvs), so a
# clean clone rebuilds only this crate: 10 minutes on 2 cores the first time (609 s measured),
# about 3 after (182 s); then about 75 s emulated (both printed at the end). Needs target/release/deltafin (native)
# built first.
#   scripts/check_aarch64.sh [WORK_DIR]      # default target/aarch64-check
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$repo/target/aarch64-check}
triple=aarch64-unknown-linux-gnu
start=$(date +%s)
rustup target add "$triple"
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    apt-get install -y -q gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_DIR=${DELTAFIN_AARCH64_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/deltafin/aarch64-target}
qemu="qemu-aarch64 -L /usr/aarch64-linux-gnu"
E2E=(cli engine gpt_oss)
cd "$repo"
# The chat example too: tests/cli.rs drives it.
cargo build --release --target "$triple" --bin deltafin --example chat
cargo test --release --target "$triple" --lib --no-run
for t in "${E2E[@]}"; do cargo test --release --target "$triple" --test "$t" --no-run; done
built=$(date +%s)

# 2. Unit tests with and without the optional instructions.
for cpu in max cortex-a53; do
    echo "check_aarch64: library tests under qemu -cpu $cpu"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -cpu $cpu" \
        cargo test --release --target "$triple" --lib -q
done
# 3. End-to-end files, their spawned binaries through the runner.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -cpu max"
for t in "${E2E[@]}"; do
    echo "check_aarch64: tests/$t.rs under qemu"
    cargo test --release --target "$triple" --test "$t" -q
done

# 4. The same logits on both.
native=$repo/target/release/deltafin
arm=$CARGO_TARGET_DIR/$triple/release/deltafin
rm -rf "$work" && mkdir -p "$work"
"$native" fixture nano "$work/nano" --seed 3 --shards 2 >/dev/null
"$native" fixture gpt-oss-tiny "$work/gpt-oss" --seed 5 --shards 2 >/dev/null
"$native" fixture qwen3-moe "$work/qwen3-moe" --seed 1 --shards 2 >/dev/null
status=0
# `--kernel fast` is int8 experts and fused dense kernels on ARM64 (qemu's `-cpu max` has NEON
# and `sdot`), but on x86-64 only with AVX-512 VNNI (and F, BW, VL; AVX2, FMA): elsewhere it
# falls back to exact there and the two cannot be compared.
kernels="exact fast"
for flag in avx512f avx512bw avx512vl avx512_vnni avx2 fma; do
    if ! grep -qw "$flag" /proc/cpuinfo; then
        echo "check_aarch64: this CPU lacks $flag: --kernel fast not compared"
        kernels=exact
    fi
done
for model in "$work/nano" "$repo/assets/k3-tiny" "$work/gpt-oss" "$work/qwen3-moe"; do
    for kernel in $kernels; do
        args=(logits --model-root "$model" --prompt-ids 1,5,9,13,17,21,25,29 --generate 6
              --kernel "$kernel")
        "$native" "${args[@]}" --out "$work/x86.json" 2>/dev/null
        $qemu -cpu max "$arm" "${args[@]}" --out "$work/arm.json" 2>/dev/null
        python3 - "$work/x86.json" "$work/arm.json" "$(basename "$model") --kernel $kernel" <<'EOF' || status=1
import json, sys
a, b, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
def rel(x, y):
    return max(abs(p - q) for p, q in zip(x, y)) / max(max(abs(p) for p in x), 1e-30)
worst = max(rel(x, y) for x, y in zip(a["prompt_logits"], b["prompt_logits"]))
same = a["prompt_logits"] == b["prompt_logits"]
same_routes = a["prompt_routes"] == b["prompt_routes"] and a["greedy_routes"] == b["greedy_routes"]
ok = a["greedy"] == b["greedy"] and same_routes and same
print(f"{'ok' if ok else 'FAIL'} {name}: ARM64 vs x86-64 greedy "
      f"{'identical' if a['greedy'] == b['greedy'] else 'DIFFERENT'}, routes "
      f"{'identical' if same_routes else 'DIFFERENT'}, logits {'bit-identical' if same else 'DIFFERENT'} (worst rel {worst:.2e})")
sys.exit(0 if ok else 1)
EOF
    done
done
end=$(date +%s)
echo "check_aarch64: cross-build $((built - start)) s, emulated checks $((end - built)) s"
exit $status
