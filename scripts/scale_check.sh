#!/usr/bin/env bash
# Scale checks at K3's real shape on this machine (issues 12 and 28), run by .ci/run (about 25
# minutes): writes the full-shape fixture with two seeds (routers and small tensors differ;
# sparse, ~1.4 GB of disk each) and a 4-layer full-shape prefix, then
#   1. `deltafin run` with default settings, a 4-token prompt and 3 decode tokens (seed 0):
#      completes, and the peak RSS it reports (VmHWM) is within the memory plan's total;
#   2. the same with --memory-gb 12: fewer layers pinned, still within its plan;
#   3. on the other seed, a 128-token prompt through all 93 layers with default settings
#      (layer-major prefill) and 3 decoded tokens: completes within the plan;
#   4. `bench prefill` on the 4-layer prefix with a 512-token prompt: bytes read ≤ 1.05 × the
#      distinct weight bytes the prompt needs, within the plan;
#   5. gpt-oss-120b's published shape (sparse): a 64-token prompt and 4 tokens within its plan,
#      then a harmony chat prompt through its 201,088-id tokenizer;
#   6. `deltafin serve` on K3 answers /health 503 while it loads, then a completion with 200.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/deltafin-scale.XXXXXX")
# (`kill 0` would signal the whole process group, this script included: only a started server.)
trap 'if [ -n "${server:-}" ]; then kill "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
bin=target/release/deltafin
[ -x "$bin" ] && [ -x "${bin}-k3" ] || cargo build --release --quiet
"$bin" fixture k3-full "$work/k3"
"$bin" fixture k3-full "$work/k3s1" --seed 1
"$bin" fixture k3-full "$work/k3p4" --layers 4 --seed 2
echo "fixtures: $(du -sh "$work/k3" | cut -f1), $(du -sh "$work/k3s1" | cut -f1), prefix $(du -sh "$work/k3p4" | cut -f1) on disk"
# Prompt ids among the fixture's first 4,096 embedding rows (the rows that hold data), so
# positions route differently.
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(1, 4096)) for _ in range($2)))"; }

check_run() { # name, model dir, prompt ids, tokens to generate, extra flags...
  local name=$1 dir=$2 prompt=$3 max_new=$4; shift 4
  local t0=$SECONDS
  "$bin" run --model-root "$dir" --prompt-ids "$prompt" --max-new "$max_new" --json "$@" \
    >"$work/$name.json" 2>"$work/$name.log" || { tail -20 "$work/$name.log"; exit 1; }
  python3 - "$work/$name.json" "$name" "$((SECONDS - t0))" "$max_new" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]; p = m["plan"]; pre = r["prefill"]
assert len(r["generated_ids"]) == int(sys.argv[4]), r["generated_ids"]
pinned = next(l["what"] for l in p["lines"] if l["what"].startswith("pinned"))
print(f'{sys.argv[2]}: {sys.argv[3]} s, prefill of {pre["tokens"]} tokens in {pre["ms"]/1e3:.1f} s '
      f'({pre["passes"]} pass(es), {(pre["bytes_read"] or 0)/1e9:.1f} GB read), peak RSS '
      f'{m["peak_rss_bytes"]/1e9:.2f} GB, plan total {p["total"]/1e9:.2f} GB (limit '
      f'{p["limit"]/1e9:.2f} GB {p["limit_source"]}), {pinned}')
assert m["peak_rss_bytes"] <= p["total"], "peak RSS over the memory plan"
open(sys.argv[1] + ".pinned", "w").write(pinned.split("(")[1].split(")")[0])
PY
}
check_run default "$work/k3" 1,2,3,4 3
check_run small "$work/k3" 1,2,3,4 3 --memory-gb 12
big=$(cat "$work/default.json.pinned"); small=$(cat "$work/small.json.pinned")
[ "$small" -lt "$big" ] || { echo "--memory-gb 12 pinned $small layers, default $big"; exit 1; }
# The second seed's routing: a 128-token prompt and 3 decoded tokens (one run covers both).
check_run prompt128 "$work/k3s1" "$(ids 128 128)" 3

"${bin}-k3" bench prefill --model-root "$work/k3p4" --lengths 512 --runs 1 --id-max 4096 \
  --no-chunk-major >"$work/prefill.jsonl" 2>"$work/prefill.log" || { tail -20 "$work/prefill.log"; exit 1; }
python3 - "$work/prefill.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["figure"] != "prefill":
        continue
    q = r["read_over_distinct"]["median"]
    print(f'prefix prefill, {r["prompt_len"]} tokens: {r["bytes_read_gb"]:.1f} GB read for '
          f'{r["distinct_gb"]:.1f} GB distinct ({q:.3f}x), {r["wall_ms"]["median"]/1e3:.1f} s '
          f'({r["wall_over_floor"]["median"]:.2f}x the floor), peak RSS {r["peak_rss_gb"]:.2f} GB, '
          f'plan {r["plan_total_gb"]:.2f} GB')
    assert q <= 1.05, "the prefill read more than 1.05x the distinct bytes"
    assert r["within_plan"], "peak RSS over the memory plan"
PY

# gpt-oss-120b at its published shape (issue 33): 36 layers × 128 experts, 15 shard files, 65 GB
# as sparse files; a 64-token prompt and 4 greedy tokens within its memory plan.
"$bin" fixture gpt-oss-full "$work/g120" --model 120b
"$bin" run --model-root "$work/g120" --prompt-ids "$(ids 64 64)" --max-new 4 --ignore-eos \
  --json >"$work/g120.json" 2>"$work/g120.log" || { tail -20 "$work/g120.log"; exit 1; }
python3 - "$work/g120.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]; p = m["plan"]; pre = r["prefill"]
assert len(r["generated_ids"]) == 4, r["generated_ids"]
print(f'gpt-oss-120b: prefill of {pre["tokens"]} tokens in {pre["ms"]/1e3:.1f} s '
      f'({(pre["bytes_read"] or 0)/1e9:.1f} GB of experts read), {r["decode_ms_per_token"]:.0f} ms '
      f'per decoded token, peak RSS {m["peak_rss_bytes"]/1e9:.2f} GB, plan total '
      f'{p["total"]/1e9:.2f} GB (limit {p["limit"]/1e9:.2f} GB {p["limit_source"]})')
assert m["peak_rss_bytes"] <= p["total"], "peak RSS over the memory plan"
PY
# The same shape through its chat format: the 201,088-id tokenizer.json, harmony's rendering.
"$bin" run --model-root "$work/g120" --prompt "What is the capital of France?" --chat \
  --max-new 2 --ignore-eos --json >"$work/g120c.json" 2>"$work/g120c.log" \
  || { tail -20 "$work/g120c.log"; exit 1; }
python3 - "$work/g120c.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]; p = m["plan"]; pre = r["prefill"]
assert len(r["generated_ids"]) == 2 and pre["tokens"] > 100, r
print(f'gpt-oss-120b chat (harmony, 201,088-id tokenizer): {pre["tokens"]}-token prompt in '
      f'{pre["ms"]/1e3:.1f} s, peak RSS {m["peak_rss_bytes"]/1e9:.2f} GB (plan {p["total"]/1e9:.2f} GB)')
assert m["peak_rss_bytes"] <= p["total"], "peak RSS over the memory plan"
PY
rm -rf "$work/g120"

port=$((20000 + RANDOM % 20000))
"$bin" serve --model-root "$work/k3" --port "$port" --max-tokens 2 2>"$work/server.log" &
server=$!
# The server binds before it loads: /health is 503 while the full-shape model loads, then 200.
seen_loading=no
for _ in $(seq 1 600); do
  h=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
  [ "$h" = 503 ] && seen_loading=yes
  if [ "$h" = 200 ]; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 0.5
done
[ "$seen_loading" = yes ] || { echo "/health never answered 503 while the model loaded"; exit 1; }
echo "serve: /health 503 while loading, then 200"
code=$(curl -s -o "$work/reply.json" -w '%{http_code}' --max-time 1200 \
  -H 'Content-Type: application/json' \
  -d '{"model":"deltafin-kimi-k3","prompt":"Hello","max_tokens":2}' \
  "http://127.0.0.1:$port/v1/completions")
[ "$code" = 200 ] || { echo "serve answered $code: $(cat "$work/reply.json")"; tail "$work/server.log"; exit 1; }
echo "serve: 200 $(cat "$work/reply.json")"
