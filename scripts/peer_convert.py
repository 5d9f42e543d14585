"""Runs llama.cpp's own convert_hf_to_gguf.py on one of our checkpoints (scripts/peer_llamacpp.sh).

Our fixtures' vocabularies match none of the pre-tokenizers the converter knows by the hash of
their output, so the converter refuses them; the real model's name for its pre-tokenizer is given
instead (`gpt-4o` for gpt-oss's o200k split, `kimi-k2` for K3's).

K3 ships its tokenizer as a bare `tiktoken.model` read by remote code (its repository's
`tokenization_kimi.py`, which a checkpoint of ours does not carry). The converter asks
`transformers.AutoTokenizer` for it and reads three things: the mergeable ranks, the special
tokens and the end-of-text id. `TiktokenFiles` gives exactly those from the published files
(`tiktoken.model`: one `base64 rank` line per token; `tokenizer_config.json`:
`added_tokens_decoder` and `eos_token`). Nothing else of the converter is changed.

Usage: peer_convert.py LLAMA_CPP_DIR PRE_TOKENIZER MODEL_DIR OUT.gguf [converter args...]
"""

import base64
import json
import pathlib
import runpy
import sys
from types import SimpleNamespace


class TiktokenFiles:
    """What the converter reads of K3's remote-code tokenizer, from the published files."""

    def __init__(self, root: pathlib.Path):
        ranks = {}
        for line in (root / "tiktoken.model").read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        self.model = SimpleNamespace(_mergeable_ranks=ranks)
        cfg = json.loads((root / "tokenizer_config.json").read_text())
        self.special_tokens = {
            t["content"]: int(i) for i, t in cfg.get("added_tokens_decoder", {}).items()
        }
        self.eos_id = self.special_tokens[cfg["eos_token"]]
        self.vocab_size = len(ranks) + len(self.special_tokens)

    def encode(self, text, **_):
        # Only hashed by the converter to recognise a known pre-tokenizer (ours is named
        # instead): the bytes' single-byte ranks, not a BPE encoding.
        single = {b[0]: r for b, r in self.model._mergeable_ranks.items() if len(b) == 1}
        return [single[b] for b in text.encode("utf-8")]


def main() -> None:
    src, pre, model, out, *rest = sys.argv[1:]
    sys.path[:0] = [src, f"{src}/gguf-py"]
    import conversion.base as base  # the converter's own package, from the sdist
    import transformers

    known = base.TextModel.get_vocab_base_pre

    def named(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return pre

    base.TextModel.get_vocab_base_pre = named
    published = transformers.AutoTokenizer.from_pretrained

    def from_pretrained(path, *args, **kwargs):
        root = pathlib.Path(path)
        if (root / "tiktoken.model").is_file() and not (root / "tokenizer.json").is_file():
            return TiktokenFiles(root)
        return published(path, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = from_pretrained
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, *rest]
    runpy.run_path(f"{src}/convert_hf_to_gguf.py", run_name="__main__")


if __name__ == "__main__":
    main()
