#!/usr/bin/env python3
"""One kernel on a random BF16 matrix, three launches, for Nsight Compute to look at.

    ncu --clock-control none --kernel-name regex:huffman_ --launch-skip 2 --launch-count 1 --set full \\
        python scripts/profile_kernels.py --kernel huffman --rows 4096 --cols 4096 --index 256 --variant ahead2
    ncu --clock-control none --kernel-name regex:pmma --launch-skip 2 --launch-count 1 \\
        python scripts/profile_kernels.py --kernel fused --rows 4096 --cols 4096 --batch 1

--kernel huffman / palette: the decode to BF16 (huffman with the checkpoint index at --index S,
0 for the stream as stored, by the decoder --variant); fused: the palette matmul y = x W^T at batch --batch
(--stage-tiles 2: its wide-stage variant; --x-shared: x shared per CTA); gemv: the palette
GEMV at batch --batch (1..4); --tiled: a palette kernel on tile-major planes.  The first
two launches warm the caches and tables.  The result is checked (decodes bitwise against the
source weights; the matmul within 2x cuBLAS's error against a float64 reference); nothing is
timed here (scripts/bench_decode.py and bench_kernels.py time).  Exit status 1 when a check
fails.  scripts/gpu_check.py runs it under ncu in its bench stage (PROFILES there).
``--clock-control none`` leaves the card's clocks as they are (ncu otherwise locks them to base).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

log = logging.getLogger("profile_kernels")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("huffman", "palette", "fused", "gemv"), default="huffman")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--index", type=int, default=256, help="huffman checkpoint interval S (0: as stored)")
    ap.add_argument("--batch", type=int, default=1, help="fused: rows of x")
    ap.add_argument("--stage-tiles", type=int, default=1, choices=(1, 2),
                    help="fused: 64-column tiles per copy stage (2: the wide-stage kernel)")
    ap.add_argument("--x-shared", action="store_true", help="fused: x copied once per CTA into shared memory")
    ap.add_argument("--wgmma", action="store_true",
                    help="fused: x copied per CTA in wgmma's layout and multiplied by wgmma (sm_90a)")
    ap.add_argument("--tiled", action="store_true",
                    help="palette / fused / gemv: the planes held tile-major (ops/layout.py), as a runtime may hold them")
    ap.add_argument("--variant", default="default",
                    help="decoder variant: default, or a name of runtime.kernel_plan.HUFF_VARIANTS (huffman) "
                         "or PAL_VARIANTS (palette); gemv: default, deep, staged, mma, mma_staged "
                         "mma_prefetch, mma_bulk (PGEMV_VARIANTS; mma_bulk needs --tiled) or mma_queue")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import numpy as np
    import torch

    from unweight.codec import tensor_codec as tc
    from unweight.runtime import kernel_plan as kp
    gemv_names = {**kp.PGEMV_VARIANTS, "mma_queue": kp.PGEMV_VARIANT_MMA_QUEUE}  # (the queue has its own op)
    names = {"palette": kp.PAL_VARIANTS, "gemv": gemv_names}.get(args.kernel, kp.HUFF_VARIANTS)
    variant = 0 if args.variant == "default" else names[args.variant]
    h = bu.import_helpers()
    dev = bu.device(torch)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    w = bu.bf16_weights(torch, args.rows, args.cols, seed=0)
    w_bits = h.bits(w)
    encoding = "huffman" if args.kernel == "huffman" else "palette"
    enc = tc.encode(w_bits, encoding)
    if encoding == "huffman" and args.index:
        enc = tc.with_index(enc.header, enc.planes, chk_interval=args.index)
    ew = bu.as_gpu_loaders_hold(h.encoded_weight(enc, dev, err))
    if args.tiled:
        if encoding != "palette" or not kp.pal_tiled_ok(args.rows, args.cols):
            ap.error("--tiled takes a palette kernel on whole 16 x 64 tiles")
        ew = bu.clone_encoded(ew, tiled=True)
    if args.kernel in ("fused", "gemv"):
        from unweight.runtime.tuning_table import (GEMV_PATHS, PALETTE_GEMM, PALETTE_GEMM_WG, PALETTE_GEMM_WIDE,
                                                   PALETTE_GEMM_XS, PALETTE_GEMV)
        if (args.x_shared or args.wgmma) and args.stage_tiles != 1:
            ap.error("--x-shared and --wgmma go with --stage-tiles 1")
        path = (PALETTE_GEMM_WIDE if args.stage_tiles == 2 else PALETTE_GEMM_WG if args.wgmma
                else PALETTE_GEMM_XS if args.x_shared else PALETTE_GEMM)
        if args.kernel == "gemv":
            path = {v: p for p, v in GEMV_PATHS.items()}.get(variant, PALETTE_GEMV)  # std: the default
        x = torch.randn((args.batch, args.cols), device=dev).to(torch.bfloat16)
        for _ in range(2):
            h.fused_op(ew, x, err, path)
        r = h.fused_vs_cublas(ew, x, w, err, path)  # the third (and fourth) launch, checked
        ok = bool(r["passed"]) and int(err.item()) == 0
        what = f"max error {r['max_err']:.3g} (cuBLAS {r['max_err_cublas']:.3g})"
    else:
        out = torch.empty((args.rows, args.cols), dtype=torch.bfloat16, device=dev)
        for _ in range(3):
            h.decode_op(ew, out, err, variant)
        bu.sync(torch)
        ok = bool(np.array_equal(h.bits(out), w_bits)) and int(err.item()) == 0
        what = "bitwise" if ok else "not bitwise"
    log.info("%s %dx%d (index %s, batch %s, variant %s, stage tiles %d, shared x %s, wgmma %s, %s order): %s -> %s",
             args.kernel, args.rows, args.cols, args.index, args.batch, args.variant, args.stage_tiles, args.x_shared,
             args.wgmma,
             "tile-major" if args.tiled else "file", what, "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
