"""Fills a sparse full-shape fixture's tensors in place with the value ranges a trained
checkpoint has (scripts/peer_llamacpp.sh), so a speed comparison multiplies ordinary numbers.

The fixture's bytes are holes: its MXFP4 scale bytes read as 0, i.e. 2^-127, whose products are
subnormal, and a kernel that decodes scales to fp32 then pays for subnormal arithmetic on some
CPUs (it halved llama.cpp's speed here). Filled: MXFP4 blocks with random codes, MXFP4 scales (gpt-oss's `_scales`, K3's
`weight_scale`) with 112..127 (2^-15 .. 2^0, as `deltafin bench mxfp4` draws them), BF16 and F32 tensors with
N(0, 0.02) values. Seeded, so both engines read the same weights.

Usage: peer_fill.py MODEL_DIR
"""

import json
import pathlib
import struct
import sys

import numpy as np

CHUNK = 1 << 26


def fill(path: pathlib.Path, rng: np.random.Generator) -> None:
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            start, end = (8 + n + o for o in t["data_offsets"])
            f.seek(start)
            left = end - start
            while left > 0:
                size = min(left, CHUNK)
                if t["dtype"] == "U8" and name.endswith(("_scales", "weight_scale")):
                    b = rng.integers(112, 128, size, dtype=np.uint8).tobytes()
                elif t["dtype"] == "U8":
                    b = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                elif t["dtype"] == "BF16":
                    v = (rng.standard_normal(size // 2, dtype=np.float32) * 0.02).view(np.uint32)
                    b = (v >> 16).astype(np.uint16).tobytes()
                elif t["dtype"] == "F32":
                    b = (rng.standard_normal(size // 4, dtype=np.float32) * 0.02).tobytes()
                else:
                    raise SystemExit(f"{path}: {name} has dtype {t['dtype']}, not filled")
                f.write(b)
                left -= size


def main() -> None:
    root = pathlib.Path(sys.argv[1])
    rng = np.random.default_rng(7)
    for p in sorted(root.glob("*.safetensors")):
        fill(p, rng)


if __name__ == "__main__":
    main()
