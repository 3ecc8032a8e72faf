#!/usr/bin/env python3
"""Load-time cost of a rank's tensor-parallel blocks of huffman matrices, per rank (CPU).

At load each rank keeps its block of every sharded matrix (codec.shard.block_planes, used by
the vLLM and transformers loaders): a block on the matrix's segment grid is its segments
copied; any other equal split is decoded from the segments that hold it and encoded anew.
This times both for the matrix shapes of DeepSeek-V3 / Kimi-K2 (hidden 7168) at each TP size,
on synthetic N(0, 0.02) BF16 matrices encoded with the writer's grid, and scales the time per
matrix by how many such matrices the model holds (61 layers: 3 dense, 58 MoE of 256 routed
experts and one shared expert).  At TP 16 the expert down-projections (K = 2048 in 256-column
chunks) and o_proj (K = 16384 in 2048-column chunks) are off the grid.

    python scripts/bench_tp_blocks.py [--tp 8,16] [--reps 3] [--threads N] [--out PATH]

Prints a table and writes JSON (default benchmarks/results/tp-blocks-<date>-<machine>-<commit>.json).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

# (matrix, [N, K], axis a rank's block is taken along, matrices of that shape in the model)
MATRICES = [
    ("expert gate/up", (2048, 7168), "rows", 2 * 58 * 256),
    ("expert down", (7168, 2048), "cols", 58 * 256),
    ("shared expert gate/up", (2048, 7168), "rows", 2 * 58),
    ("shared expert down", (7168, 2048), "cols", 58),
    ("dense gate/up", (18432, 7168), "rows", 2 * 3),
    ("dense down", (7168, 18432), "cols", 3),
    ("q_b_proj", (24576, 1536), "rows", 61),
    ("o_proj", (7168, 16384), "cols", 61),
]


def time_block(sh, enc, axis: str, tp: int, reps: int, threads: int) -> tuple[float, bool, list]:
    """(median seconds, recoded, [rows, cols] held) of rank 0's block of the encoded matrix."""
    n = enc.header.rows if axis == "rows" else enc.header.cols
    rng = (0, n // tp)
    kw = {"rows": rng} if axis == "rows" else {"cols": rng}
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        hb, _, recoded = sh.block_planes(enc.header, enc.planes, threads=threads, where="bench", **kw)
        times.append(time.perf_counter() - t)
    return statistics.median(times), recoded, [hb.rows, hb.cols]


def run(tps: list, reps: int, threads: int, names: list | None = None) -> list:
    from unweight.codec import shard as sh
    from unweight.codec import tensor_codec as tc
    from unweight.tools.tune import gaussian_bf16
    rows = []
    encoded = {}
    for name, shape, axis, count in MATRICES:
        if names and name not in names:
            continue
        if shape not in encoded:
            encoded[shape] = tc.encode(gaussian_bf16(*shape, seed=len(encoded)), "huffman", threads=threads)
        enc = encoded[shape]
        for tp in tps:
            sec, recoded, held = time_block(sh, enc, axis, tp, reps, threads)
            rows.append({"matrix": name, "shape": list(shape), "axis": axis, "tp": tp,
                         "grid": [enc.header.rows_per_group, enc.header.cols_per_chunk], "held": held,
                         "recoded": recoded, "seconds": round(sec, 5), "count": count,
                         "model_seconds": round(sec * count, 1)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=bu.positive_int_list, default=[8, 16])
    ap.add_argument("--reps", type=bu.positive_int, default=3, help="timed calls per block (median)")
    ap.add_argument("--threads", type=bu.positive_int, default=None, help="codec threads (default: all cores)")
    ap.add_argument("--matrix", action="append", default=None, help="time only this matrix (repeatable)")
    ap.add_argument("--out", help="result JSON")
    args = ap.parse_args(argv)
    known = [m[0] for m in MATRICES]
    if args.matrix and any(m not in known for m in args.matrix):
        return bu.fail(f"bench_tp_blocks: --matrix takes one of {known}")
    bad = [tp for tp in args.tp for _, shape, axis, _ in MATRICES
           if (shape[0] if axis == "rows" else shape[1]) % tp]
    if bad:
        return bu.fail(f"bench_tp_blocks: --tp {bad[0]} does not split every matrix into equal blocks")
    out = bu.writable_path(args.out, "bench_tp_blocks") if args.out else None
    from unweight.codec import tensor_codec as tc
    threads = args.threads or tc.default_threads()
    rows = run(args.tp, args.reps, threads, args.matrix)
    bu.print_table(rows, ["matrix", "shape", "axis", "tp", "grid", "held", "recoded", "seconds", "count",
                          "model_seconds"])
    totals = {tp: round(sum(r["model_seconds"] for r in rows if r["tp"] == tp), 1) for tp in args.tp}
    print("per rank, all matrices above:", ", ".join(f"TP {tp}: {s} s" for tp, s in totals.items()))
    res = {"env": bu.environment(), "threads": threads, "reps": args.reps, "model": "DeepSeek-V3 / Kimi-K2 shapes",
           "rows": rows, "per_rank_seconds": totals}
    out = out or bu.result_path("tp-blocks", bu.machine_tag())
    print("wrote", bu.write_json(out, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
