#!/usr/bin/env python3
"""Checks deltafin's Qwen3-MoE against an implementation written by others: Hugging Face
transformers' `Qwen3MoeForCausalLM` (CPU torch, fp32; it loads the BF16 checkpoint as the hub
serves it: one tensor per expert and matrix, shards cut at tensor boundaries). Never copies
its code; only calls it.

For one Qwen3-MoE checkpoint and one prompt it compares, at every prompt position and for a
greedy continuation:
  * each layer's expert set per position (must be identical);
  * the greedy continuation (must be identical);
  * the logits, relative error max|ours - ref| / max|ref| per position (must be <= --tol).
Then negative controls, each a reference run on a config that changes one thing deltafin reads
from config.json, that must disagree with deltafin (or the check could not see that error):
  * `norm_topk_prob` flipped (the top-k weights renormalised, or not);
  * another rotary base (`rope_theta` 10,000).

Usage: qwen3_moe_reference.py --deltafin BIN --model DIR [--prompt-len 24] [--generate 8]
                            [--seed 0] [--tol 1e-4] [--name NAME] [--json OUT]
"""
import os
import sys

from transformers import Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402


def routers(model):
    # Dense MLP layers (`mlp_only_layers`, `decoder_sparse_step`) have no router.
    return [(i, l.mlp.gate) for i, l in enumerate(model.model.layers)
            if hasattr(l.mlp, "gate") and hasattr(l.mlp, "experts")]


if __name__ == "__main__":
    hf_reference.main(
        Qwen3MoeForCausalLM, routers,
        lambda cfg: [("norm_topk_prob flipped", {"norm_topk_prob": not cfg["norm_topk_prob"]}),
                     ("rope_theta 1e4", {"rope_theta": 10000.0})],
        "Qwen3-MoE")
