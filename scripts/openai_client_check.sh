#!/usr/bin/env bash
# Starts `deltafin serve` on K3-nano and drives it with the official openai Python package,
# installed from PyPI into a temporary virtualenv; tool calls against a scripted server
# (scripts/openai_tools_check.py); gpt-oss's harmony tool calls (scripts/openai_gpt_oss_check.py);
# then the load test (scripts/load_check.py):
# 32 concurrent clients against `deltafin serve --max-batch 8` on the built-in K3-tiny. Run by
# .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'for p in ${server:-} ${server2:-} ${server3:-}; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
bin=target/release/deltafin
# Waits until the server on port $1 answers /health.
wait_up() {
  for _ in $(seq 1 100); do
    if curl -sf "http://127.0.0.1:$1/health" >/dev/null; then return; fi
    sleep 0.2
  done
}
[ -x "$bin" ] || cargo build --release --quiet
"$bin" fixture nano "$work/nano" 2>/dev/null
port=$((20000 + RANDOM % 20000))
"$bin" serve --model-root "$work/nano" --port "$port" --api-key sk-check 2>"$work/server.log" &
server=$!
wait_up "$port"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet openai
"$work/venv/bin/python" scripts/openai_client_check.py "http://127.0.0.1:$port/v1" sk-check
kill "$server" 2>/dev/null || true
# A server whose every reply is a scripted one ($3), driven by a check script ($4): serves the
# model in $1 on port $2 (more serve flags after), fails with the server's log.
scripted_check() {
  local dir=$1 p=$2 reply=$3 check=$4
  shift 4
  "$bin" serve --model-root "$dir" --port "$p" --scripted-reply "$reply" "$@" 2>"$work/server-$p.log" &
  local pid=$!
  wait_up "$p"
  "$work/venv/bin/python" "$check" "http://127.0.0.1:$p/v1" || {
    tail -20 "$work/server-$p.log"
    kill "$pid" 2>/dev/null || true
    exit 1
  }
  kill "$pid" 2>/dev/null || true
}
# Tool calls: every reply is the scripted K3 tools section.
scripted_check "$work/nano" $((port + 3)) scripts/tool_reply.txt scripts/openai_tools_check.py
# gpt-oss (harmony) through the same client: a scripted harmony reply with a tool call.
"$bin" fixture gpt-oss-tiny "$work/gpt-oss" --original-context 512 2>/dev/null
scripted_check "$work/gpt-oss" $((port + 4)) scripts/harmony_tool_reply.txt \
  scripts/openai_gpt_oss_check.py --model-id gpt-oss-tiny
port2=$((port + 1))
"$bin" serve --port "$port2" --max-batch 8 --queue 16 2>"$work/server2.log" &
server2=$!
# The alone answers come from a server that runs one request at a time and keeps no prompt
# cache: nothing the concurrent run computed can reach them.
port3=$((port + 2))
"$bin" serve --port "$port3" --max-batch 1 --queue 1 --no-prompt-cache 2>"$work/server3.log" &
server3=$!
for p in "$port2" "$port3"; do
  for _ in $(seq 1 150); do
    if curl -sf "http://127.0.0.1:$p/v1/models" >/dev/null; then break; fi
    sleep 0.2
  done
done
"$work/venv/bin/python" scripts/load_check.py "http://127.0.0.1:$port2/v1" 32 \
  "http://127.0.0.1:$port3/v1" || {
  tail -20 "$work/server2.log" "$work/server3.log"
  exit 1
}
