#!/usr/bin/env python3
"""Memory-access profile of the CUDA kernels, from their bodies run through the warp emulator.

Nothing here runs on a GPU.  The emulator (csrc/cuda/emu/warp_emu.h, "memory-access
profile") groups each warp's accesses into instructions and counts what a profiler's memory
counters would: shared-memory wavefronts per request (more than the ideal one per phase
means a bank conflict) and global 32-byte sectors per request (more than the ideal means the
lanes' bytes straddle sectors they do not fill).  For each kernel family it runs one small
launch per configuration on N(0, 0.02) weights with verbatim outliers and reports, per kind
of access, requests, units per request and the ideal; the worst shared-memory phase is
described with its lanes' byte offsets.  Global counts cover the kernels' load and store
helpers and cp.async sources (not every plain load), and no cache: a sector read again by a
later request counts again, although on the device it may come from L1 or L2.

A table goes to stdout and JSON, by default to
``benchmarks/results/emu/emu-profile-<date>-<commit>.json``.  Needs the CUDA extension built
(``python3 setup.py build_ext --inplace``), not a GPU; exits with status 2 without it.

Usage: python scripts/emu_profile.py [--out PATH] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)
import ptxas_report as pr  # noqa: E402  (build stamp and report writer, shared with the build reports)

KINDS = ("shared_load", "shared_store", "shared_async", "global_load", "global_store", "global_async")
HEAD = ("shared ld", "shared st", "cp.async wr", "global ld", "global st", "cp.async rd")


def _cuda():
    try:
        from unweight import _cuda
    except ImportError:
        return None
    return _cuda


def runs(cu):
    """(family, config, shape, thunk) of every launch profiled: each thunk runs one emulation."""
    from tests.cuda.helpers import aligned, make_weights
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    from unweight.runtime import kernel_plan as kp

    rng = np.random.default_rng(1)

    def x_bits(M, K):
        return aligned((rng.standard_normal((M, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

    N, K = 96, 512
    w = make_weights(N, K, seed=3)
    pal_enc = tc.encode(w, "palette")
    p = pal_enc.planes
    pal = bytes(int(b) for b in pal_enc.header.palette[: pal_enc.header.pal_size])
    pal_ops = (p[C.SUFFIX_SM], p[C.SUFFIX_IDX], pal, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP])
    out = []
    for M in (1, 16, 64):
        for name, stage, xs in (("one-tile stages", 1, 0), ("wide stages", kp.PMMA_SUB_WIDE, 0),
                                ("shared x", 1, 1)):
            x = x_bits(M, K)
            out.append(("palette_gemm", f"M={M}, {name}", [N, K],
                        lambda x=x, s=stage, xs=xs: cu.emulate_palette_gemm(x, *pal_ops, 1, False, s, xs)))
    for M in (1, 4):
        x = x_bits(M, K)
        out.append(("palette_gemv", f"M={M}", [N, K], lambda x=x: cu.emulate_palette_gemv(x, *pal_ops, 1, False)))
    planes = [aligned(p[s]) for s in (C.SUFFIX_SM, C.SUFFIX_IDX)]

    def pal_decode(variant):
        o = aligned(np.zeros((N, K), np.uint16))
        nerr = cu.emulate_palette_decode(*planes, 0, N, 0, K, pal, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], o, variant)
        if nerr or not np.array_equal(o, w):
            raise RuntimeError("emulated palette decode is wrong")

    for v, name in ((kp.PAL_VARIANT_VEC8, "vec8"), (kp.PAL_VARIANT_WIDE, "wide")):
        out.append(("palette_decode", name, [N, K], lambda v=v: pal_decode(v)))

    HR, HK = 256, 512
    wh = make_weights(HR, HK, seed=5)
    enc = tc.encode(wh, "huffman", chk_interval=C.DEFAULT_CHK_INTERVAL, grid=(64, HK))
    h, hp = enc.header, enc.planes
    stream, sm = aligned(hp[C.SUFFIX_EXP]), aligned(hp[C.SUFFIX_SM])
    names = {kp.HUFF_VARIANT_CHAIN: "chain", kp.HUFF_VARIANT_AHEAD: "look-ahead",
             kp.HUFF_VARIANT_AHEAD2: "look-ahead x2", kp.HUFF_VARIANT_SCALAR: "scalar",
             kp.HUFF_VARIANT_RING: "ring", kp.HUFF_VARIANT_RING_WIDE: "ring, wide CTAs",
             kp.HUFF_VARIANT_RING_MAX: "ring, 512-thread CTAs", kp.HUFF_VARIANT_PAIR: "pair lookups"}

    def decode(variant):
        o = aligned(np.zeros((HR, HK), np.uint16))
        nerr = cu.emulate_huffman_decode(stream, hp[C.SUFFIX_OFF], h.rows, h.cols, h.rows_per_group,
                                         h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi, 0, h.n_groups, 0,
                                         h.n_chunks, sm, o, False, hp[C.SUFFIX_CHK], h.chk_interval, 3, variant, None)
        if nerr or not np.array_equal(o, wh):
            raise RuntimeError(f"emulated huffman decode ({names[variant]}) is wrong")

    for v, name in names.items():
        out.append(("huffman_decode", f"{name}, S={h.chk_interval}", [HR, HK], lambda v=v: decode(v)))

    ids = np.array([3, 200, 17, 17, 255, 64], np.int64)

    def gather():
        o = aligned(np.zeros((len(ids), HK), np.uint16))
        nerr = cu.emulate_huffman_gather_rows(ids, stream, hp[C.SUFFIX_OFF], h.rows, h.cols, h.rows_per_group,
                                              h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi, sm, hp[C.SUFFIX_CHK],
                                              h.chk_interval, o, 2)
        if nerr or not np.array_equal(o, wh[ids]):
            raise RuntimeError("emulated huffman row gather is wrong")

    out.append(("huffman_gather_rows", f"{len(ids)} rows", [HR, HK], gather))
    exps = aligned(((wh >> 7) & 0xFF).astype(np.uint8))
    hist = np.bincount(exps.ravel(), minlength=256)
    top = bytes(np.argsort(-hist, kind="stable")[:16].astype(np.uint8).tobytes())
    out.append(("transcode", "exponent histogram", [HR, HK], lambda: cu.emulate_exp_histogram(exps)))
    out.append(("transcode", "palette encode", [HR, HK], lambda: cu.emulate_palette_encode(exps, top)))
    crc_buf = aligned(np.random.default_rng(7).integers(0, 256, size=1 << 20, dtype=np.uint8))

    def crc():
        import zlib
        if int(cu.emulate_crc32_ranges(crc_buf, 0, crc_buf.size, 1)[0]) != zlib.crc32(crc_buf.tobytes()):
            raise RuntimeError("emulated crc32 is wrong")

    out.append(("crc32", "1 MiB, one range", [crc_buf.size], crc))
    return out


def cell(d: dict) -> str:
    if not d["requests"]:
        return "-"
    return f"{d['units'] / d['requests']:.2f}/{d['ideal'] / d['requests']:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/emu/emu-profile-<date>-<commit>.json)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    cu = _cuda()
    if cu is None or not hasattr(cu, "emu_profile"):
        print("emu_profile: the CUDA extension (unweight._cuda) is not built: python3 setup.py build_ext --inplace",
              file=sys.stderr)
        return 2
    from tests.cuda.helpers import access_profile
    rows = []
    for family, config, shape, thunk in runs(cu):
        with access_profile(cu) as prof:
            thunk()
        rows.append({"kernel": family, "config": config, "shape": shape, **prof})
    print("units per request / ideal (shared: wavefronts, global: 32-byte sectors); '-': none")
    print(f"{'kernel':<20} {'config':<26} " + " ".join(f"{h:>11}" for h in HEAD))
    for r in rows:
        print(f"{r['kernel']:<20} {r['config']:<26} " + " ".join(f"{cell(r[k]):>11}" for k in KINDS))
    worst = [r for r in rows if r["worst"] and any(r[k]["worse"] for k in KINDS[:3])]
    for r in worst:
        print(f"worst shared phase of {r['kernel']} ({r['config']}): {r['worst'][:160]}")
    if args.no_write:
        return 0
    doc = {"benchmark": "emu_profile", **pr.build_stamp(),
           "model": "csrc/cuda/emu/warp_emu.h, memory-access profile: 32 banks of 4 bytes, 8- and 16-byte "
                    "accesses in 2 and 4 phases; 32-byte global sectors; no caches",
           "kernels": rows}
    pr.write_report(doc, args.out, "emu", "emu-profile")
    return 0

if __name__ == "__main__":
    sys.exit(main())
