#!/usr/bin/env python3
"""One decode of a random BF16 matrix per encoding on the GPU, for a profiler to look at.

    ncu --kernel-name regex:huffman_chain --launch-skip 2 --launch-count 1 --set full \\
        python scripts/profile_decode.py --rows 4096 --cols 4096 --encoding huffman --index 1024

Each encoding is decoded three times (the first two warm the caches and the LUT build) and
checked bitwise against the source weights; nothing is timed here (scripts/bench_decode.py
times).  Exit status 1 when a decode is not bitwise.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

log = logging.getLogger("profile_decode")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--encoding", choices=("huffman", "palette"), default="huffman")
    ap.add_argument("--index", type=int, default=1024, help="checkpoint interval S for huffman (0: as stored)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import numpy as np
    import torch

    from unweight.codec import tensor_codec as tc
    h = bu.import_helpers()
    dev = bu.device(torch)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    w = bu.bf16_weights(torch, args.rows, args.cols, seed=0)
    w_bits = h.bits(w)
    enc = tc.encode(w_bits, args.encoding)
    if args.encoding == "huffman" and args.index:
        enc = tc.with_index(enc.header, enc.planes, chk_interval=args.index)
    ew = h.encoded_weight(enc, dev, err)
    out = torch.empty((args.rows, args.cols), dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        h.decode_op(ew, out, err)
    bu.sync(torch)
    ok = bool(np.array_equal(h.bits(out), w_bits)) and int(err.item()) == 0
    log.info("%s %dx%d index %s: %s", args.encoding, args.rows, args.cols, args.index, "bitwise" if ok else "WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
