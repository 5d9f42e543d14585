#!/usr/bin/env python3
"""deltafin's DFlash and DSpark block drafters against vLLM `speculators`' own modules (CPU
torch, fp32).

For each case: builds a random head with speculators' `DFlashDraftModel` (every weight drawn,
norms around 1; a draft vocabulary smaller than the target's with its d2t/t2d maps, or the
target's own), saves it with speculators' `save_pretrained` (its published spelling) plus the
embedding and (full vocabulary) lm_head it leaves to the verifier, draws token ids and tapped
target rows, and compares the draft logits of every block slot at every anchor from
`deltafin dflash-logits` with the module's (`_backbone_forward`, every valid position an
anchor, eager attention over its own anchor-block mask). The same head in z-lab's original
spelling (`DFlashDraftModel` config with `dflash_config`, layer outputs instead of capture
points) must give the same logits. DSpark heads (`DSparkDraftModel`: vanilla, gated and
recurrent Markov heads, with and without sampling from the anchor) add the Markov head's bias
over the block's true tokens, as the module's `forward` forms it. A negative control (another
`mask_token_id`, or for DSpark `sample_from_anchor` flipped, in our copy of the config) must
disagree. Runs speculators, never copies it.

    dflash_reference.py --deltafin BIN --work DIR [--tol 1e-4]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings

# The verifier's config is looked up by name (a random target has none): never over the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.dflash import DFlashSpeculatorConfig
from speculators.models.dflash.core import DFlashDraftModel
from speculators.models.dspark import DSparkSpeculatorConfig
from speculators.models.dspark.core import DSparkDraftModel
from speculators.proposals.greedy import GreedyTokenProposalConfig

V, H, T = 320, 64, 21


def build(seed, layers, block, vd, bias, markov=None):
    """A random DFlash head, or (with `markov` = (head type, sample_from_anchor)) a DSpark
    head: the same backbone with speculators' sequential logit bias and confidence head."""
    torch.manual_seed(seed)
    tl = Qwen3Config(hidden_size=H, intermediate_size=112, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=V, rms_norm_eps=1e-5,
                     rope_theta=5000.0, max_position_embeddings=256, num_hidden_layers=layers,
                     attention_bias=bias, tie_word_embeddings=False)
    tl._attn_implementation = "eager"
    common = dict(
        transformer_layer_config=tl, draft_vocab_size=vd, block_size=block,
        aux_hidden_state_layer_ids=[2, 5, 8], mask_token_id=V - 3,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark" if markov else "dflash",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block - 1)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="random-target", architectures=["Target"])))
    if markov:
        cfg = DSparkSpeculatorConfig(markov_rank=24, markov_head_type=markov[0],
                                     sample_from_anchor=markov[1], **common)
        m = DSparkDraftModel(cfg).eval()
    else:
        m = DFlashDraftModel(DFlashSpeculatorConfig(**common)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.startswith("markov_head"):
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    if vd < V:
        used = torch.sort(torch.randperm(V)[:vd]).values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[used] = True
        m.load_vocab_mappings(t2d, used - torch.arange(vd))
    return m


def save(m, d):
    """speculators' files, plus the embedding (and full-vocabulary lm_head) it leaves out."""
    m.save_pretrained(d)
    path = os.path.join(d, "model.safetensors")
    w = load_file(path)
    w["embed_tokens.weight"] = m.embed_tokens.weight.detach().clone()
    if "lm_head.weight" not in w:
        w["lm_head.weight"] = m.lm_head.weight.detach().clone()
    save_file({k: v.contiguous() for k, v in w.items()}, path)


def reference(m, ids, taps):
    """Every anchor's block logits; for DSpark with the Markov head's bias over the block's
    true tokens, the previous token of each slot as its `forward` forms them."""
    n, b = len(ids), m.block_size
    with torch.no_grad():
        hidden, logits, _, _, idx = m._backbone_forward(
            hidden_states=taps[None], input_ids=ids[None],
            loss_mask=torch.ones(1, n, dtype=torch.long),
            verifier_last_hidden_states=torch.zeros(1, n, H),
            document_ids=torch.zeros(1, n, dtype=torch.long),
            max_anchors=n - b)
        nb = len(idx) // b
        logits = logits[0].float().view(nb, b, -1)
        if getattr(m, "markov_head", None) is not None:
            tokens = ids[idx].view(nb, b)
            prev = tokens if m.config.sample_from_anchor else torch.cat(
                [tokens[:, :1], tokens[:, :-1]], dim=1)
            logits = logits + m.markov_head.block_bias(
                prev_token_ids=prev, hidden_states=hidden.view(nb, b, -1)).float()
    return idx.view(nb, b)[:, 0], logits


def ours(binary, head_dir, inputs):
    r = subprocess.run([binary, "dflash-logits", "--drafter", head_dir, "--input", inputs],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"deltafin dflash-logits failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout)


def rel_worst(got, ref):
    return max(float((torch.tensor(g) - r).abs().max() / r.abs().max())
               for g, r in zip(got, ref))


def zlab_copy(src, dst, block):
    """The same head in z-lab's spelling: the Qwen3 config at the top, `dflash_config` with
    layer-output ids (speculators' capture points minus one)."""
    os.makedirs(dst, exist_ok=True)
    spec = json.load(open(os.path.join(src, "config.json")))
    cfg = dict(spec["transformer_layer_config"])
    cfg.update(architectures=["DFlashDraftModel"], block_size=block,
               dflash_config={"target_layer_ids":
                              [i - 1 for i in spec["aux_hidden_state_layer_ids"]],
                              "mask_token_id": spec["mask_token_id"]})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    shutil.copy(os.path.join(src, "model.safetensors"), dst)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deltafin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    cases = [  # name, seed, layers, block, draft vocabulary, attention bias, DSpark head
        ("DFlash: 1 layer, block 4, draft vocabulary 96", 0, 1, 4, 96, False, None),
        ("DFlash: 3 layers, block 8, full vocabulary (also as z-lab)", 1, 3, 8, V, False, None),
        ("DFlash: 2 layers, block 6, biases, draft vocabulary 128", 2, 2, 6, 128, True, None),
        ("DSpark: vanilla Markov head, from the anchor, draft vocabulary 96", 3, 2, 7, 96, False,
         ("vanilla", True)),
        ("DSpark: gated Markov head, not from the anchor", 4, 1, 5, V, False, ("gated", False)),
        ("DSpark: recurrent Markov head, from the anchor, draft vocabulary 128", 5, 2, 6, 128,
         False, ("rnn", True)),
    ]
    ok = True
    for name, seed, layers, block, vd, bias, markov in cases:
        d = os.path.join(a.work, f"dflash-{seed}")
        shutil.rmtree(d, ignore_errors=True)
        m = build(seed, layers, block, vd, bias, markov)
        save(m, d)
        g = torch.Generator().manual_seed(100 + seed)
        ids = torch.randint(0, V, (T,), generator=g)
        taps = torch.randn(T, 3 * H, generator=g)
        anchors, ref = reference(m, ids, taps)
        inputs = os.path.join(a.work, f"dflash-{seed}-input.safetensors")
        save_file({"input_ids": ids, "hidden_states": taps, "anchors": anchors.contiguous()}, inputs)
        o = ours(a.deltafin, d, inputs)
        worst = rel_worst(o["logits"], ref)
        d2t = m.d2t if m.d2t is not None else torch.zeros(vd, dtype=torch.long)
        want = [[int(i) + int(d2t[i]) for i in blk.argmax(-1)] for blk in ref]
        same_ids = o["target_ids"] == want
        line = (f"{name}: {len(anchors)} anchors x {block} slots, draft logits worst rel "
                f"{worst:.2e}, target ids {'equal' if same_ids else 'DIFFER'}")
        good = worst <= a.tol and same_ids
        if vd == V and markov is None:
            z = d + "-zlab"
            zlab_copy(d, z, block)
            zw = rel_worst(ours(a.deltafin, z, inputs)["logits"], ref)
            line += f"; z-lab spelling {zw:.2e}"
            good = good and zw <= a.tol
        ctl = d + "-control"
        shutil.copytree(d, ctl, dirs_exist_ok=True)
        cfg = json.load(open(os.path.join(ctl, "config.json")))
        # Control: another mask token (DSpark: the Markov head's previous tokens shifted by
        # one slot, by flipping sample_from_anchor, which moves no draft slot's logits else).
        what = "sample_from_anchor flipped" if markov else "another mask token"
        if markov:
            cfg["sample_from_anchor"] = not markov[1]
        else:
            cfg["mask_token_id"] = cfg["mask_token_id"] + 1
        json.dump(cfg, open(os.path.join(ctl, "config.json"), "w"))
        cw = rel_worst(ours(a.deltafin, ctl, inputs)["logits"], ref)
        line += f"; control ({what}) {cw:.2e}"
        if cw <= a.tol:
            print(f"FAIL {name}: the control agrees: the check cannot see that error",
                  file=sys.stderr)
            good = False
        print(line)
        ok = ok and good
    if not ok:
        print(f"FAIL: deltafin's DFlash head disagrees with speculators (tolerance {a.tol})",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
