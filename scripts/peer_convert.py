"""Runs llama.cpp's own convert_hf_to_gguf.py on one of our checkpoints (scripts/peer_llamacpp.sh).

Our fixtures' vocabularies match none of the pre-tokenizers the converter knows by the hash of
their output, so the converter refuses them; the real model's name for its pre-tokenizer is given
instead (`gpt-4o` for gpt-oss's o200k split, `kimi-k2` for K3's). Nothing else of the converter
is changed.

Usage: peer_convert.py LLAMA_CPP_DIR PRE_TOKENIZER MODEL_DIR OUT.gguf [converter args...]
"""

import runpy
import sys


def main() -> None:
    src, pre, model, out, *rest = sys.argv[1:]
    sys.path[:0] = [src, f"{src}/gguf-py"]
    import conversion.base as base  # the converter's own package, from the sdist

    known = base.TextModel.get_vocab_base_pre

    def named(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return pre

    base.TextModel.get_vocab_base_pre = named
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, *rest]
    runpy.run_path(f"{src}/convert_hf_to_gguf.py", run_name="__main__")


if __name__ == "__main__":
    main()
