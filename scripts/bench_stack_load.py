#!/usr/bin/env python3
"""Load-time cost of serving Llama 4's expert stacks compressed in vLLM, per rank (CPU).

A Llama 4 checkpoint stores each MoE layer's experts as two stacks, gate_up_proj [E, H, 2I]
and down_proj [E, I, H].  At load each vLLM rank takes, for every expert, its block of the
intermediate size from the stacks' segments (gate columns [i0, i1), up columns [I + i0,
I + i1), down rows [i0, i1)), transposes each into the orientation vLLM's experts kernel takes
and re-encodes it (unweight/integrations/vllm/moe.py, UnweightStackedMoEMethod); with the load
check on (the default) it also takes the crc32s the TP group checks the stacks with (each row's
of the gate and up blocks, the down block's).  This times those steps through the same codec
calls (tensor_codec.matrix_planes, shard.decode_block, shard.row_crcs, tensor_codec.encode) on
synthetic N(0, 0.02) BF16 stacks of a few experts with Scout's and
Maverick's expert shape (hidden 5120, intermediate 8192), at each TP size, and scales the
per-expert time to the models' expert counts (Scout: 48 MoE layers of 16 experts; Maverick: 24
of 128).  The stacks are encoded with the writer's grid: gate_up in 1024-column chunks (a
stack's columns split 16 ways), so every TP size up to 8 takes whole chunks.  --old-grid
encodes gate_up as writers before that rule did, in 2048-column chunks, wider than a rank's
1024 columns at TP 8: there a rank decodes the chunks that hold its block and cuts it out.
The load check is also timed with its per-row crcs as a crc32 call per row from Python
(`check_py_rows_s`, against shard.row_crcs, which takes them in the C++ codec) for comparison
(`<model>_py_rows_s`); the other totals use the codec's.

    python scripts/bench_stack_load.py [--experts 2] [--tp 1,2,4,8] [--encodings huffman,palette]
                                       [--old-grid] [--threads N] [--out PATH]

Prints a table and writes JSON (default benchmarks/results/stack-load-<date>-<machine>-<commit>.json).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

HIDDEN, INTER = 5120, 8192  # Llama 4 Scout and Maverick's expert shape
MODELS = {"scout": 48 * 16, "maverick": 24 * 128}  # experts over all MoE layers


def rank_share(tc, sh, gu, dn, e: int, i0: int, i1: int, encoding: str, threads: int) -> dict:
    """One expert's share for one rank: seconds to decode its three blocks, to take their load
    check's crc32s (also with the per-row ones as a Python loop), to transpose them and to
    re-encode them; bytes of BF16 the share holds."""
    import zlib

    import numpy as np
    import torch

    from unweight.codec.shard_check import shard_record
    t_dec = t_chk = t_py = t_tr = t_enc = 0.0
    nbytes = 0
    for enc, kw in ((gu, {"cols": (i0, i1)}), (gu, {"cols": (INTER + i0, INTER + i1)}), (dn, {"rows": (i0, i1)})):
        t = time.perf_counter()
        hm, pm = tc.matrix_planes(enc.header, enc.planes, e)
        w = sh.decode_block(hm, pm, threads=threads, **kw)
        t_dec += time.perf_counter() - t
        t = time.perf_counter()
        if "cols" in kw:  # (moe.py: a cols record per gate / up block, a rows record for down)
            sh.row_crcs(w, threads)
            t_chk += time.perf_counter() - t
            t = time.perf_counter()
            [zlib.crc32(w[r].view(np.uint8)) for r in range(w.shape[0])]
            t_py += time.perf_counter() - t
        else:  # (the same either way)
            shard_record(w, rows=kw["rows"])
            t_chk += time.perf_counter() - t
            t_py += time.perf_counter() - t
        t = time.perf_counter()
        # the transpose as moe.transposed makes it (that module needs vLLM to import)
        wt = torch.from_numpy(w.view(np.int16)).t().contiguous().numpy().view(np.uint16)
        t_tr += time.perf_counter() - t
        t = time.perf_counter()
        tc.encode(wt, encoding, threads=threads)
        t_enc += time.perf_counter() - t
        nbytes += w.nbytes
    return {"decode_s": t_dec, "check_s": t_chk, "check_py_rows_s": t_py, "transpose_s": t_tr, "encode_s": t_enc,
            "bf16_bytes": nbytes}


def run(experts: int, tps: list, encodings: list, threads: int, old_grid: bool = False) -> list:
    from unweight.codec import shard as sh
    from unweight.codec import tensor_codec as tc
    from unweight.tools.tune import gaussian_bf16
    grid = tc.choose_grid(HIDDEN, 2 * INTER) if old_grid else None  # (the 2-D rule: 8 column chunks)
    gu = tc.encode(gaussian_bf16(experts * HIDDEN, 2 * INTER, seed=0).reshape(experts, HIDDEN, 2 * INTER), "huffman",
                   threads=threads, grid=grid)
    dn = tc.encode(gaussian_bf16(experts * INTER, HIDDEN, seed=1).reshape(experts, INTER, HIDDEN), "huffman",
                   threads=threads)
    rows = []
    for tp in tps:
        i0, i1 = 0, INTER // tp  # rank 0's block; every rank's is the same size
        for encoding in encodings:
            per = [rank_share(tc, sh, gu, dn, e, i0, i1, encoding, threads) for e in range(experts)]
            dec, chk, py, tr, enc = (statistics.median(p[k] for p in per)
                                     for k in ("decode_s", "check_s", "check_py_rows_s", "transpose_s", "encode_s"))
            mb = per[0]["bf16_bytes"] / 1e6
            row = {"tp": tp, "stack_encoding": "huffman", "held_encoding": encoding,
                   "gate_up_grid": [gu.header.rows_per_group, gu.header.cols_per_chunk],
                   "down_grid": [dn.header.rows_per_group, dn.header.cols_per_chunk],
                   "expert_share_mb": round(mb, 1), "decode_s": round(dec, 4), "check_s": round(chk, 4),
                   "check_py_rows_s": round(py, 4), "transpose_s": round(tr, 4),
                   "encode_s": round(enc, 4), "mb_per_s": round(mb / (dec + chk + tr + enc), 1)}
            row.update({f"{m}_s": round(n * (dec + chk + tr + enc), 1) for m, n in MODELS.items()})
            row.update({f"{m}_py_rows_s": round(n * (dec + py + tr + enc), 1) for m, n in MODELS.items()})
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=bu.positive_int, default=2, help="experts in the synthetic stacks")
    ap.add_argument("--tp", type=bu.positive_int_list, default=[1, 2, 4, 8])
    ap.add_argument("--encodings", default="huffman,palette", help="encodings the rank holds its blocks in")
    ap.add_argument("--old-grid", action="store_true",
                    help="gate_up in 2048-column chunks, as writers before the stacked grid rule")
    ap.add_argument("--threads", type=bu.positive_int, default=None, help="codec threads (default: all cores)")
    ap.add_argument("--out", help="result JSON")
    args = ap.parse_args(argv)
    encodings = [e for e in args.encodings.split(",") if e]
    if not encodings or any(e not in ("huffman", "palette") for e in encodings):
        return bu.fail(f"bench_stack_load: --encodings takes huffman and/or palette, not {args.encodings!r}")
    if any(INTER % tp for tp in args.tp):
        return bu.fail(f"bench_stack_load: every --tp must divide the intermediate size {INTER}")
    out = bu.writable_path(args.out, "bench_stack_load") if args.out else None
    from unweight.codec import tensor_codec as tc
    threads = args.threads or tc.default_threads()
    rows = run(args.experts, args.tp, encodings, threads, args.old_grid)
    bu.print_table(rows, ["tp", "held_encoding", "expert_share_mb", "decode_s", "check_s", "check_py_rows_s",
                          "transpose_s", "encode_s", "mb_per_s", "scout_s", "maverick_s", "scout_py_rows_s",
                          "maverick_py_rows_s"])
    res = {"env": bu.environment(), "threads": threads, "old_grid": args.old_grid, "experts_timed": args.experts,
           "hidden": HIDDEN,
           "intermediate": INTER, "model_experts": MODELS, "rows": rows}
    out = out or bu.result_path("stack-load", bu.machine_tag())
    print("wrote", bu.write_json(out, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
