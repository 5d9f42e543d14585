#!/usr/bin/env bash
# Scale checks at K3's real shape on this machine (issue 12), run by .ci/run (8-11 minutes):
# writes the full-shape fixture (sparse, ~1.4 GB of disk), then
#   1. `deltafin run` with default settings, a 4-token prompt and 3 decode tokens: completes, and
#      the peak RSS it reports (VmHWM) is within the memory plan's total;
#   2. the same with --memory-gb 12: fewer layers pinned, still within its plan;
#   3. `deltafin serve` on it answers a completion with 200.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/deltafin-scale.XXXXXX")
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
bin=target/release/deltafin
[ -x "$bin" ] || cargo build --release --quiet
"$bin" fixture k3-full "$work/k3"
echo "fixture: $(du -sh "$work/k3" | cut -f1) on disk"

check_run() { # name, extra flags...
  local name=$1; shift
  local t0=$SECONDS
  "$bin" run --model-root "$work/k3" --prompt-ids 1,2,3,4 --max-new 3 --json "$@" \
    >"$work/$name.json" 2>"$work/$name.log" || { cat "$work/$name.log"; exit 1; }
  python3 - "$work/$name.json" "$name" "$((SECONDS - t0))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]; p = m["plan"]
assert len(r["generated_ids"]) == 3, r["generated_ids"]
pinned = next(l["what"] for l in p["lines"] if l["what"].startswith("pinned"))
print(f'{sys.argv[2]}: {sys.argv[3]} s, peak RSS {m["peak_rss_bytes"]/1e9:.2f} GB, plan total '
      f'{p["total"]/1e9:.2f} GB (limit {p["limit"]/1e9:.2f} GB {p["limit_source"]}), {pinned}')
assert m["peak_rss_bytes"] <= p["total"], "peak RSS over the memory plan"
open(sys.argv[1] + ".pinned", "w").write(pinned.split("(")[1].split(")")[0])
PY
}
check_run default
check_run small --memory-gb 12
big=$(cat "$work/default.json.pinned"); small=$(cat "$work/small.json.pinned")
[ "$small" -lt "$big" ] || { echo "--memory-gb 12 pinned $small layers, default $big"; exit 1; }

port=$((20000 + RANDOM % 20000))
"$bin" serve --model-root "$work/k3" --port "$port" --max-tokens 2 2>"$work/server.log" &
server=$!
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 1
done
code=$(curl -s -o "$work/reply.json" -w '%{http_code}' --max-time 1200 \
  -H 'Content-Type: application/json' \
  -d '{"model":"deltafin-kimi-k3","prompt":"Hello","max_tokens":2}' \
  "http://127.0.0.1:$port/v1/completions")
[ "$code" = 200 ] || { echo "serve answered $code: $(cat "$work/reply.json")"; tail "$work/server.log"; exit 1; }
echo "serve: 200 $(cat "$work/reply.json")"
