#!/usr/bin/env python3
"""The shared half of the transformers reference checks (scripts/gpt_oss_reference.py,
scripts/qwen3_moe_reference.py): run deltafin's `logits` and a transformers causal LM (CPU torch,
fp32) on one prompt, compare every prompt position's logits, the hidden rows after every layer
but the last (what a drafter reading the target's hidden states takes: `logits --hidden-layers`
against `output_hidden_states`), each MoE layer's expert set per position and a greedy
continuation, and run negative controls (config.json edits that must
make the reference disagree). Calls transformers, never copies it.
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
from transformers.utils import logging as hf_logging


def ours(binary, model, prompt, generate, layers):
    """deltafin's logits, hidden rows after `layers`, routes and greedy continuation."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ours.json")
        cmd = [binary, "logits", "--model-root", str(model),
               "--prompt-ids", ",".join(map(str, prompt)), "--generate", str(generate),
               "--out", out]
        if layers:
            cmd += ["--hidden-layers", ",".join(map(str, layers))]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"deltafin logits failed ({r.returncode}):\n{r.stderr}")
        with open(out) as f:
            return json.load(f)


def load(cls, model_dir, overrides, edit=None):
    """transformers' model `cls` in fp32, with config.json edited (`edit(cfg, overrides)`, by
    default `cfg.update(overrides)`) in a copy of the directory whose shards are links."""
    if not overrides:
        return cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    tmp = tempfile.mkdtemp()
    for f in os.listdir(model_dir):
        if f != "config.json":
            os.symlink(os.path.join(os.path.abspath(model_dir), f), os.path.join(tmp, f))
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    (edit or (lambda c, o: c.update(o)))(cfg, overrides)
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
    return cls.from_pretrained(tmp, dtype=torch.float32).eval()


def reference(model, routers, prompt, generate):
    """Every prompt position's logits, the routes, and a greedy continuation (each step a full
    forward of the sequence so far: no cache to trust)."""
    calls = []

    def hook(layer):
        def f(_mod, _inp, out):
            # The router returns (logits, scores, indices); the indices are the last, [T, k].
            calls.append((layer, [sorted(r) for r in out[-1].tolist()]))
        return f

    hooks = [m.register_forward_hook(hook(i)) for i, m in routers(model)]
    seq = list(prompt)
    with torch.no_grad():
        out = model(torch.tensor([seq]), output_hidden_states=True)
    logits = out.logits[0].float()
    prompt_logits = logits.tolist()
    # hidden_states[0] is the embedding, [l + 1] the rows after layer l; the last one has the
    # final norm applied, so the layers compared stop one short of it.
    hidden = {str(l - 1): h[0].float().tolist() for l, h in enumerate(out.hidden_states)
              if 1 <= l < len(out.hidden_states) - 1}
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
            "greedy_logits": gen_logits, "greedy_routes": gen_routes, "prompt_hidden": hidden}


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
    hidden = [rel(a, b) for l, rows in r["prompt_hidden"].items()
              for a, b in zip(o.get("prompt_hidden", {}).get(l, []), rows)]
    missing = len(r["prompt_hidden"]) != len(o.get("prompt_hidden", {}))
    hidden_worst = max(hidden, default=float("inf")) if not missing else float("inf")
    ok = (worst <= tol and gen_worst <= tol and differ == 0 and o["greedy"] == r["greedy"]
          and hidden_worst <= tol)
    return ok, {"prompt_logits_rel_worst": worst, "greedy_logits_rel_worst": gen_worst,
                "hidden_rel_worst": hidden_worst, "hidden_layers": len(r["prompt_hidden"]),
                "routes_differing": differ, "greedy_identical": o["greedy"] == r["greedy"]}




def main(cls, routers, controls, name, edit=None):
    """The command line: `cls` the transformers model class, `routers(model)` the
    `(layer, module)` pairs whose output's last element is the selected experts `[T, k]`,
    `controls(cfg)` the `(label, overrides)` that must disagree."""
    p = argparse.ArgumentParser()
    p.add_argument("--deltafin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--generate", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--name", default=name)
    p.add_argument("--json")
    a = p.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    rnd = random.Random(a.seed)
    prompt = [rnd.randrange(0, cfg["vocab_size"]) for _ in range(a.prompt_len)]
    layers = cfg["num_hidden_layers"]
    o = ours(a.deltafin, a.model, prompt, a.generate, list(range(layers - 1)))
    r = reference(load(cls, a.model, {}), routers, prompt, a.generate)
    ok, s = compare(o, r, a.tol)
    results = {}
    for label, overrides in controls(cfg):
        ref = reference(load(cls, a.model, overrides, edit), routers, prompt, a.generate)
        c_ok, cs = compare(o, ref, a.tol)
        results[label] = cs
        if c_ok:
            print(f"FAIL {a.name}: control '{label}' agrees with deltafin: the check cannot see "
                  "that error on this checkpoint", file=sys.stderr)
            ok = False
    line = (f"{a.name}: prompt {a.prompt_len} + greedy {a.generate}: logits worst rel "
            f"{s['prompt_logits_rel_worst']:.2e} (prompt) {s['greedy_logits_rel_worst']:.2e} "
            f"(greedy), hidden rows after {s['hidden_layers']} layers worst rel "
            f"{s['hidden_rel_worst']:.2e}, {s['routes_differing']} routes differ, greedy "
            f"{'identical' if s['greedy_identical'] else 'different'}; controls: " +
            ", ".join(f"{k}: rel {c['prompt_logits_rel_worst']:.2e}, {c['routes_differing']} "
                      f"routes differ" for k, c in results.items()))
    print(line)
    if a.json:
        json.dump({"name": a.name, "ok": ok, "summary": s, "controls": results}, open(a.json, "w"))
    if not ok:
        print(f"FAIL {a.name}: deltafin disagrees with transformers (tolerance {a.tol})",
              file=sys.stderr)
        sys.exit(1)
