#!/usr/bin/env bash
# Starts `deltafin serve` on K3-nano and drives it with the official openai Python package,
# installed from PyPI into a temporary virtualenv. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'if [ -n "${server:-}" ]; then kill "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
bin=target/release/deltafin
[ -x "$bin" ] || cargo build --release --quiet
"$bin" fixture nano "$work/nano" 2>/dev/null
port=$((20000 + RANDOM % 20000))
"$bin" serve --model-root "$work/nano" --port "$port" 2>"$work/server.log" &
server=$!
for _ in $(seq 1 100); do
  if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; then break; fi
  sleep 0.2
done
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet openai
"$work/venv/bin/python" scripts/openai_client_check.py "http://127.0.0.1:$port/v1"
