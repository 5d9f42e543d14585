#!/usr/bin/env python3
"""deltafin's EAGLE-3 head against vLLM `speculators`' own module (CPU torch, fp32).

For each case: builds a random head with speculators' `Eagle3DraftModel` (every weight drawn,
norms around 1, a draft vocabulary smaller than the target's with its d2t/t2d maps), saves it
with speculators' `save_pretrained` (its published spelling), draws token ids and tapped target
rows, and compares every position's draft logits from `deltafin eagle3-logits` with the module's
(`forward`, one step, the lm_head's output). The same head rewritten in SpecForge's spelling
(`LlamaForCausalLMEagle3`, `midlayer.`, `eagle_config`) must give the same logits where the two
spellings mean the same thing. A negative control (`norm_before_residual` flipped in our copy of
the config) must disagree. Runs speculators, never copies it.

    eagle3_reference.py --deltafin BIN --work DIR [--tol 1e-4]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, Qwen3Config

from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3SpeculatorConfig
from speculators.models.eagle3.core import Eagle3DraftModel
from speculators.proposals.greedy import GreedyTokenProposalConfig

V, VD, H, T = 320, 96, 64, 14


def layer_config(kind):
    common = dict(hidden_size=H, intermediate_size=112, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=V, rms_norm_eps=1e-5,
                  rope_theta=5000.0, max_position_embeddings=256, num_hidden_layers=1,
                  tie_word_embeddings=False)
    cfg = Qwen3Config(**common) if kind == "qwen3" else LlamaConfig(**common)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(seed, kind, nbr, norm_before_fc, fc_norm, norm_output):
    torch.manual_seed(seed)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config(kind), draft_vocab_size=VD,
        norm_before_residual=nbr, norm_before_fc=norm_before_fc, fc_norm=fc_norm,
        norm_output=norm_output, eagle_aux_hidden_state_layer_ids=[2, 5, 8],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="random-target", architectures=["Target"])))
    m = Eagle3DraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.startswith("fc_norm"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    used = torch.sort(torch.randperm(V)[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    m.load_vocab_mappings(t2d, used - torch.arange(VD))
    return m


def reference(m, ids, taps):
    got = []
    hook = m.lm_head.register_forward_hook(lambda _m, _i, out: got.append(out[0].float()))
    with torch.no_grad():
        m(hidden_states=taps[None], input_ids=ids[None],
          document_ids=torch.zeros(1, len(ids), dtype=torch.long), ttt_steps=1)
    hook.remove()
    return got[0]


def ours(binary, head_dir, inputs):
    r = subprocess.run([binary, "eagle3-logits", "--drafter", head_dir, "--input", inputs],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"deltafin eagle3-logits failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout)


def rel_worst(a, b):
    return max(float((torch.tensor(x) - y).abs().max() / y.abs().max()) for x, y in zip(a, b))


def specforge_copy(src, dst):
    """The same head in SpecForge's spelling: a Llama config with the head's keys, the decoder
    layer's tensors under `midlayer.`, the tapped layers under `eagle_config` (output-of-layer
    ids: speculators' capture indices minus one)."""
    os.makedirs(dst, exist_ok=True)
    spec = json.load(open(os.path.join(src, "config.json")))
    cfg = dict(spec["transformer_layer_config"])
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=spec["draft_vocab_size"],
               eagle_config={"eagle_aux_hidden_state_layer_ids":
                             [i - 1 for i in spec["eagle_aux_hidden_state_layer_ids"]]})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    w = load_file(os.path.join(src, "model.safetensors"))
    save_file({k.replace("layers.0.", "midlayer."): v.contiguous() for k, v in w.items()},
              os.path.join(dst, "model.safetensors"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deltafin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    cases = [  # name, seed, layer kind, norm_before_residual, norm_before_fc, fc_norm, norm_output
        ("llama, norm_before_residual", 0, "llama", True, False, False, False),
        ("llama, plain residual (also as SpecForge)", 1, "llama", False, False, False, False),
        ("qwen3 layer, norm_before_fc", 2, "qwen3", False, True, False, False),
        ("llama, fc_norm, norm_output", 3, "llama", True, False, True, True),
    ]
    ok = True
    for name, seed, kind, nbr, nbf, fcn, nout in cases:
        d = os.path.join(a.work, f"eagle3-{seed}")
        shutil.rmtree(d, ignore_errors=True)
        m = build(seed, kind, nbr, nbf, fcn, nout)
        m.save_pretrained(d)
        g = torch.Generator().manual_seed(100 + seed)
        ids = torch.randint(0, V, (T,), generator=g)
        taps = torch.randn(T, 3 * H, generator=g)
        inputs = os.path.join(a.work, f"eagle3-{seed}-input.safetensors")
        save_file({"input_ids": ids, "hidden_states": taps}, inputs)
        ref = reference(m, ids, taps)
        o = ours(a.deltafin, d, inputs)
        worst = rel_worst(o["logits"], ref)
        want = [int(i) + int(m.d2t[i]) for i in ref.argmax(-1)]
        same_ids = o["target_ids"] == want
        line = f"{name}: {T} positions, draft logits worst rel {worst:.2e}, target ids {'equal' if same_ids else 'DIFFER'}"
        good = worst <= a.tol and same_ids
        # SpecForge's spelling has a Llama layer, no norm before fc and no normed residual.
        if not nbr and kind == "llama" and not nbf:
            sf = d + "-specforge"
            specforge_copy(d, sf)
            sw = rel_worst(ours(a.deltafin, sf, inputs)["logits"], ref)
            line += f"; SpecForge spelling {sw:.2e}"
            good = good and sw <= a.tol
        # Control: the same files with norm_before_residual flipped must disagree.
        ctl = d + "-control"
        shutil.copytree(d, ctl, dirs_exist_ok=True)
        cfg = json.load(open(os.path.join(ctl, "config.json")))
        cfg["norm_before_residual"] = not nbr
        json.dump(cfg, open(os.path.join(ctl, "config.json"), "w"))
        cw = rel_worst(ours(a.deltafin, ctl, inputs)["logits"], ref)
        line += f"; control (norm_before_residual flipped) {cw:.2e}"
        if cw <= a.tol:
            print(f"FAIL {name}: the control agrees: the check cannot see that error", file=sys.stderr)
            good = False
        print(line)
        ok = ok and good
    if not ok:
        print(f"FAIL: deltafin's EAGLE-3 head disagrees with speculators (tolerance {a.tol})",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
