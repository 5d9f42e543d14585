#!/usr/bin/env python3
"""Checks deltafin's gpt-oss against an implementation written by others: Hugging Face
transformers' `GptOssForCausalLM` (CPU torch, fp32; it loads the MXFP4 checkpoint as the hub
serves it and dequantizes the experts, exactly, on a machine without a GPU). Never copies its
code; only calls it.

For one gpt-oss checkpoint and one prompt it compares, at every prompt position and for a
greedy continuation:
  * each layer's expert set per position (must be identical);
  * the greedy continuation (must be identical);
  * the logits, relative error max|ours - ref| / max|ref| per position (must be <= --tol).
Then negative controls, each a reference run on a config that changes one thing deltafin reads
from config.json, that must disagree with deltafin (or the check could not see that error):
  * SwiGLU's clamp removed (`swiglu_limit` 1e9);
  * YaRN's correction range rounded (`rope_scaling.truncate` true; mlx-lm's gpt_oss rounds it);
  * no sliding window (`sliding_window` larger than the prompt).

Usage: gpt_oss_reference.py --deltafin BIN --model DIR [--prompt-len 24] [--generate 8]
                            [--seed 0] [--tol 1e-4] [--name NAME] [--json OUT]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

import torch
from transformers import GptOssForCausalLM
from transformers.utils import logging as hf_logging


def ours(binary, model, prompt, generate):
    """deltafin's logits, routes and greedy continuation."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ours.json")
        cmd = [binary, "logits", "--model-root", str(model),
               "--prompt-ids", ",".join(map(str, prompt)), "--generate", str(generate),
               "--out", out]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"deltafin logits failed ({r.returncode}):\n{r.stderr}")
        with open(out) as f:
            return json.load(f)


def load(model_dir, overrides):
    """transformers' model in fp32, with config.json fields overridden (a copy of the directory
    whose shards are links)."""
    if not overrides:
        return GptOssForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tmp = tempfile.mkdtemp()
    for f in os.listdir(model_dir):
        if f != "config.json":
            os.symlink(os.path.join(os.path.abspath(model_dir), f), os.path.join(tmp, f))
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    for k, v in overrides.items():
        if k == "truncate":
            cfg["rope_scaling"]["truncate"] = v
        else:
            cfg[k] = v
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
    return GptOssForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()


def reference(model, prompt, generate):
    """Every prompt position's logits, the routes, and a greedy continuation (each step a full
    forward of the sequence so far: no cache to trust)."""
    calls = []

    def hook(layer):
        def f(_mod, _inp, out):
            # The router returns (logits, scores, indices); the indices are the last, [T, k].
            calls.append((layer, [sorted(r) for r in out[-1].tolist()]))
        return f

    hooks = [l.mlp.router.register_forward_hook(hook(i)) for i, l in enumerate(model.model.layers)]
    seq = list(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    prompt_logits = logits.tolist()
    prompt_routes = {str(l): r for l, r in calls}
    greedy, gen_logits, gen_routes = [], [], []
    nxt = int(torch.argmax(logits[-1]))
    for _ in range(generate):
        greedy.append(nxt)
        seq.append(nxt)
        calls.clear()
        with torch.no_grad():
            l = model(torch.tensor([seq])).logits[0, -1].float()
        gen_logits.append(l.tolist())
        gen_routes.append({str(k): [r[-1]] for k, r in calls})
        nxt = int(torch.argmax(l))
    for h in hooks:
        h.remove()
    return {"prompt_logits": prompt_logits, "prompt_routes": prompt_routes, "greedy": greedy,
            "greedy_logits": gen_logits, "greedy_routes": gen_routes}


def rel(a, b):
    m = max(abs(x) for x in b) or 1.0
    return max(abs(x - y) for x, y in zip(a, b)) / m


def compare(o, r, tol):
    worst = max(rel(a, b) for a, b in zip(o["prompt_logits"], r["prompt_logits"]))
    differ = sum(1 for l, rows in r["prompt_routes"].items()
                 for a, b in zip(rows, o["prompt_routes"].get(l, [])) if a != b)
    agree = 0
    while agree < len(r["greedy"]) and o["greedy"][agree] == r["greedy"][agree]:
        agree += 1
    gen_worst = max([rel(o["greedy_logits"][i], r["greedy_logits"][i]) for i in range(agree)],
                    default=0.0)
    for i in range(agree):
        for l, rows in r["greedy_routes"][i].items():
            if rows != o["greedy_routes"][i].get(l):
                differ += 1
    ok = worst <= tol and gen_worst <= tol and differ == 0 and o["greedy"] == r["greedy"]
    return ok, {"prompt_logits_rel_worst": worst, "greedy_logits_rel_worst": gen_worst,
                "routes_differing": differ, "greedy_identical": o["greedy"] == r["greedy"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deltafin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--generate", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--name", default="gpt-oss")
    p.add_argument("--json")
    a = p.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    rnd = random.Random(a.seed)
    prompt = [rnd.randrange(0, vocab) for _ in range(a.prompt_len)]
    o = ours(a.deltafin, a.model, prompt, a.generate)
    r = reference(load(a.model, {}), prompt, a.generate)
    ok, s = compare(o, r, a.tol)
    controls = {}
    for label, overrides in [("no clamp", {"swiglu_limit": 1e9}),
                             ("yarn truncated", {"truncate": True}),
                             ("no window", {"sliding_window": 10 ** 6})]:
        c_ok, cs = compare(o, reference(load(a.model, overrides), prompt, a.generate), a.tol)
        controls[label] = cs
        if c_ok:
            print(f"FAIL {a.name}: control '{label}' agrees with deltafin: the check cannot see "
                  "that error on this checkpoint", file=sys.stderr)
            ok = False
    line = (f"{a.name}: prompt {a.prompt_len} + greedy {a.generate}: logits worst rel "
            f"{s['prompt_logits_rel_worst']:.2e} (prompt) {s['greedy_logits_rel_worst']:.2e} "
            f"(greedy), {s['routes_differing']} routes differ, greedy "
            f"{'identical' if s['greedy_identical'] else 'different'}; controls: " +
            ", ".join(f"{k}: rel {c['prompt_logits_rel_worst']:.2e}, {c['routes_differing']} "
                      f"routes differ" for k, c in controls.items()))
    print(line)
    if a.json:
        json.dump({"name": a.name, "ok": ok, "summary": s, "controls": controls}, open(a.json, "w"))
    if not ok:
        print(f"FAIL {a.name}: deltafin disagrees with transformers (tolerance {a.tol})",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
