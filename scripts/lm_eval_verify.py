"""Checks the loglikelihoods lm-evaluation-harness used (its logged samples) against a direct
prompt-scoring request to the same server (`echo: true`, `max_tokens: 0`): the continuation's
token logprobs summed after the context's tokens.

Usage: lm_eval_verify.py SAMPLES_DIR TOKENIZER_JSON URL
"""
import json, glob, sys, urllib.request
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2])
samples = [json.loads(l) for l in open(glob.glob(sys.argv[1] + "/*/samples_*.jsonl")[0])]
worst = 0.0; n = 0
for s in samples:
    ctx = s["doc"]["context"]
    for choice, resp in zip(s["doc"]["choices"], s["resps"]):
        ll_lm = float(resp[0][0])
        ctx_ids = tok.encode(ctx, add_special_tokens=False).ids
        whole = tok.encode(ctx + choice, add_special_tokens=False).ids
        body = json.dumps({"model": "deltafin-kimi-k3", "prompt": ctx + choice, "echo": True, "max_tokens": 0, "logprobs": 0}).encode()
        r = json.load(urllib.request.urlopen(urllib.request.Request(sys.argv[3] + "/v1/completions", body, {"Content-Type": "application/json"})))
        lps = r["choices"][0]["logprobs"]["token_logprobs"]
        assert len(lps) == len(whole), (len(lps), len(whole))
        ll = sum(lps[len(ctx_ids):])
        worst = max(worst, abs(ll - ll_lm)); n += 1
assert worst < 1e-9, worst
print(f"{n} continuations: lm-eval's loglikelihoods vs a direct echo/max_tokens 0 request: worst |diff| {worst:.2e}")
print("first item:", samples[0]["doc"]["choices"], [round(float(r[0][0]), 3) for r in samples[0]["resps"]], "label", samples[0]["doc"]["label"])
