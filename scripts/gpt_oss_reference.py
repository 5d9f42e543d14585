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
import os
import sys

from transformers import GptOssForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402


def edit(cfg, overrides):
    for k, v in overrides.items():
        if k == "truncate":
            cfg["rope_scaling"]["truncate"] = v
        else:
            cfg[k] = v


if __name__ == "__main__":
    hf_reference.main(
        GptOssForCausalLM,
        lambda m: [(i, l.mlp.router) for i, l in enumerate(m.model.layers)],
        lambda cfg: [("no clamp", {"swiglu_limit": 1e9}),
                     ("yarn truncated", {"truncate": True}),
                     ("no window", {"sliding_window": 10 ** 6})],
        "gpt-oss", edit)
