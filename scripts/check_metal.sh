#!/usr/bin/env bash
# Type-checks and lints the Metal build (`--features metal`) for aarch64-apple-darwin on a
# non-Apple machine: the Rust Metal glue cannot run here, but it is compiled against Candle's real
# Metal API. C dependencies are stood in for by a compiler that writes empty objects (nothing is
# linked by `cargo check`). Needs `rustup target add aarch64-apple-darwin`; skipped without it,
# unless DELTAFIN_REQUIRE_METAL=1 (as in .ci/run), which makes a missing target a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup target list --installed 2>/dev/null | grep -q '^aarch64-apple-darwin$'; then
    if [[ "${DELTAFIN_REQUIRE_METAL:-}" == 1 ]]; then
        echo "check_metal: DELTAFIN_REQUIRE_METAL=1 but the aarch64-apple-darwin target is not installed" >&2
        exit 1
    fi
    echo "check_metal: aarch64-apple-darwin target not installed; skipped"
    exit 0
fi
if [[ "$(uname -s)" == Darwin ]]; then
    cargo clippy --features metal --all-targets -- -D warnings
    exit 0
fi
# A fixed path, so the C dependencies' build scripts are not rerun on every check.
stub="$PWD/target/metal-check-stub"
mkdir -p "$stub"
cat >"$stub/cc" <<'SH'
#!/usr/bin/env bash
out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; done
[[ -n "$out" ]] && : >"$out"
exit 0
SH
cat >"$stub/ar" <<'SH'
#!/usr/bin/env bash
for a in "$@"; do case "$a" in *.a) : >"$a" ;; esac; done
exit 0
SH
chmod +x "$stub/cc" "$stub/ar"
export CC_aarch64_apple_darwin="$stub/cc" CXX_aarch64_apple_darwin="$stub/cc" AR_aarch64_apple_darwin="$stub/ar"
cargo clippy --target aarch64-apple-darwin --features metal --all-targets -- -D warnings
echo "check_metal: --features metal type-checks and lints clean for aarch64-apple-darwin"
