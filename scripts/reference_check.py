#!/usr/bin/env python3
"""Checks deltafin against an implementation written by others: Apple's mlx-lm (`kimi_k3`), run
as a reference on the CPU in fp32. Never copies its code; only calls it.

For one K3-format checkpoint and one prompt it compares, at every prompt position and for a
greedy continuation:
  * each MoE layer's expert set per position (must be identical);
  * the greedy continuation (must be identical);
  * the logits, relative error max|ours - ref| / max|ref| per position (must be <= --tol).
Then a negative control: mlx-lm with KDA's A_log read per channel (the old misreading) must
disagree with deltafin, or the check could not see that error on this checkpoint.

Usage: reference_check.py --deltafin BIN --model DIR [--prompt-len 16] [--generate 16]
                          [--seed 0] [--tol 2e-3] [--name NAME] [--json OUT]
"""

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import kimi_k3
from mlx_lm.utils import load_model


def ours(binary, model, prompt, generate, kernel):
    """deltafin's logits, routes and greedy continuation (BF16 spine; fp32 activations with
    `--kernel exact`, int8 ones into the MXFP4 experts with `--kernel fast`)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ours.json")
        cmd = [binary, "logits", "--model-root", str(model), "--spine", "bf16",
               "--prompt-ids", ",".join(map(str, prompt)), "--generate", str(generate),
               "--kernel", kernel,
               "--out", out]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"deltafin logits failed ({r.returncode}):\n{r.stderr}")
        with open(out) as f:
            return json.load(f)


class RouteRecorder:
    """Wraps kimi_k3's expert selection to record each MoE layer's selection, in call order."""

    def __init__(self):
        self.calls = []
        self.inner = kimi_k3._group_expert_select

    def __call__(self, *args):
        inds, weights = self.inner(*args)
        self.calls.append(sorted_rows(inds))
        return inds, weights


def sorted_rows(inds):
    a = inds.reshape(-1, inds.shape[-1]).tolist()
    return [sorted(int(x) for x in row) for row in a]


def load_fp32(model_dir):
    model, config = load_model(Path(model_dir))
    # fp32 against fp32: every floating parameter (BF16 in the checkpoint) to float32; the MXFP4
    # experts stay packed (uint32 codes, uint8 scales), as deltafin keeps them.
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model, config


def moe_layers(model):
    return [i for i, l in enumerate(model.layers) if isinstance(l.mlp, kimi_k3.KimiK3SparseMoE)]


def reference(model, prompt, generate):
    """mlx-lm's logits of every prompt position, its routes and greedy continuation."""
    rec = RouteRecorder()
    kimi_k3._group_expert_select = rec
    try:
        layers = moe_layers(model)
        cache = model.make_cache()
        x = mx.array([prompt])
        logits = model(x, cache=cache).astype(mx.float32)
        mx.eval(logits)
        prompt_logits = logits[0].tolist()
        prompt_routes = dict(zip(map(str, layers), rec.calls))
        rec.calls = []
        nxt = int(mx.argmax(logits[0, -1]).item())
        greedy, gen_logits, gen_routes = [], [], []
        for _ in range(generate):
            greedy.append(nxt)
            l = model(mx.array([[nxt]]), cache=cache).astype(mx.float32)[0, -1]
            mx.eval(l)
            gen_routes.append(dict(zip(map(str, layers), rec.calls)))
            rec.calls = []
            gen_logits.append(l.tolist())
            nxt = int(mx.argmax(l).item())
        return {"prompt_logits": prompt_logits, "prompt_routes": prompt_routes,
                "greedy": greedy, "greedy_logits": gen_logits, "greedy_routes": gen_routes}
    finally:
        kimi_k3._group_expert_select = rec.inner


def rel(a, b):
    a, b = mx.array(a), mx.array(b)
    return float((mx.abs(a - b).max() / mx.abs(b).max()).item())


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def compare_argmax(o, r):
    """What `--kernel fast` keeps of the reference: prompt positions with the same argmax, the
    greedy continuation, logits and routes (a report; its gate is the NLL, see reference_check.sh)."""
    pos = len(r["prompt_logits"])
    same = sum(argmax(a) == argmax(b) for a, b in zip(o["prompt_logits"], r["prompt_logits"]))
    ok, s = compare(o, r, float("inf"))
    s["argmax_same"] = same
    s["positions"] = pos
    return same == pos and s["greedy_identical"], s


def compare(o, r, tol):
    """Returns (ok, summary) of ours `o` against the reference `r`."""
    worst = max(rel(a, b) for a, b in zip(o["prompt_logits"], r["prompt_logits"]))
    routes, bad_routes = 0, 0
    for layer, rows in r["prompt_routes"].items():
        for i, row in enumerate(rows):
            routes += 1
            bad_routes += o["prompt_routes"].get(layer, [None] * len(rows))[i] != row
    greedy_same = o["greedy"] == r["greedy"]
    # The continuation's routes and logits compare only while the two continuations agree.
    agree = 0
    while agree < min(len(o["greedy"]), len(r["greedy"])) and o["greedy"][agree] == r["greedy"][agree]:
        agree += 1
    gen_worst = max([rel(o["greedy_logits"][i], r["greedy_logits"][i]) for i in range(agree)],
                    default=0.0)
    for i in range(agree):
        for layer, rows in r["greedy_routes"][i].items():
            routes += 1
            bad_routes += o["greedy_routes"][i].get(layer) != rows
    ok = greedy_same and bad_routes == 0 and worst <= tol and gen_worst <= tol
    return ok, {"prompt_logits_rel_worst": worst, "greedy_logits_rel_worst": gen_worst,
                "routes": routes, "routes_differing": bad_routes, "greedy_identical": greedy_same,
                "greedy_agreeing_prefix": agree}


class PerChannelGate:
    """The negative control: mlx-lm with A_log broadcast per channel (the misreading), using the
    checkpoint's stored [head_dim] vector instead of its first num_heads entries."""

    def __init__(self, model_dir, model):
        raw = {}
        for f in glob.glob(str(Path(model_dir) / "model*.safetensors")):
            raw.update({k: v for k, v in mx.load(f).items() if k.endswith("A_log")})
        self.full = {}
        for i, layer in enumerate(model.layers):
            if isinstance(layer.self_attn, kimi_k3.KimiK3DeltaAttention):
                key = f"language_model.model.layers.{i}.self_attn.A_log"
                self.full[id(layer.self_attn)] = raw[key].astype(mx.float32).reshape(-1)
        self.current = None

    def __enter__(self):
        self.call = kimi_k3.KimiK3DeltaAttention.__call__
        self.update = kimi_k3.gated_delta_update
        ctl = self

        def call(attn, *a, **k):
            ctl.current = attn
            return ctl.call(attn, *a, **k)

        def update(q, k, v, a, b, A_log, dt_bias, *rest, **kw):
            attn = ctl.current
            full = ctl.full[id(attn)][: attn.head_dim]
            A_log = mx.broadcast_to(full[None, :], (attn.num_heads, attn.head_dim))
            return ctl.update(q, k, v, a, b, A_log, dt_bias, *rest, **kw)

        kimi_k3.KimiK3DeltaAttention.__call__ = call
        kimi_k3.gated_delta_update = update
        return self

    def __exit__(self, *exc):
        kimi_k3.KimiK3DeltaAttention.__call__ = self.call
        kimi_k3.gated_delta_update = self.update


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deltafin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--generate", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=2e-3)
    p.add_argument("--json", default=None)
    p.add_argument("--kernel", choices=["exact", "fast"], default="exact",
                   help="exact: logits within --tol, routes identical (fails otherwise); "
                        "fast: a report of what int8 activations keep (never fails)")
    a = p.parse_args()
    mx.set_default_device(mx.cpu)
    name = a.name or Path(a.model).name
    model, config = load_fp32(a.model)
    text = config.get("text_config", config)
    vocab = text["vocab_size"]
    # Ordinary tokens only (below the specials), drawn from the seed.
    first_special = text.get("bos_token_id", vocab)
    rng = random.Random(a.seed)
    prompt = [rng.randrange(0, min(first_special, vocab)) for _ in range(a.prompt_len)]
    o = ours(a.deltafin, a.model, prompt, a.generate, a.kernel)
    r = reference(model, prompt, a.generate)
    if a.kernel == "fast":
        ok, s = compare_argmax(o, r)
        print(f"{name} (--kernel fast): argmax {s['argmax_same']}/{s['positions']} prompt "
              f"positions, greedy {a.generate} {'identical' if s['greedy_identical'] else 'DIFFERENT'}"
              f"; logits worst rel {s['prompt_logits_rel_worst']:.2e}, routes "
              f"{s['routes'] - s['routes_differing']}/{s['routes']} identical", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"name": name, "kernel": "fast", "prompt": prompt, **s}, f, indent=1)
        return
    ok, s = compare(o, r, a.tol)
    with PerChannelGate(a.model, model):
        rc = reference(model, prompt, a.generate)
    control_ok, cs = compare(o, rc, a.tol)
    s["negative_control_per_channel"] = {k: cs[k] for k in
                                         ("prompt_logits_rel_worst", "routes_differing",
                                          "greedy_identical")}
    line = (f"{name}: prompt {a.prompt_len} + greedy {a.generate}: logits worst rel "
            f"{s['prompt_logits_rel_worst']:.2e} (prompt) {s['greedy_logits_rel_worst']:.2e} "
            f"(greedy), routes {s['routes'] - s['routes_differing']}/{s['routes']} identical, "
            f"greedy {'identical' if s['greedy_identical'] else 'DIFFERENT'}; per-channel control: "
            f"logits rel {cs['prompt_logits_rel_worst']:.2e}, {cs['routes_differing']} routes "
            f"differ, greedy {'identical' if cs['greedy_identical'] else 'different'}")
    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"name": name, "prompt": prompt, **s}, f, indent=1)
    if not ok:
        print(f"FAIL {name}: deltafin disagrees with mlx-lm (tolerance {a.tol})", file=sys.stderr)
        sys.exit(1)
    if control_ok:
        print(f"FAIL {name}: the per-channel control also agrees: this checkpoint cannot show "
              "the A_log reading", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
