#!/usr/bin/env python
"""Benchmark y = x @ W^T with W compressed: the fused kernels (palette_gemm, huffman_gemm; M <= 16)
and decode + cuBLAS for each encoding, against torch.matmul on dense BF16 (cuBLAS) in the same
run, for batch sizes 1, 4, 16, 64, 256 on Llama-3.1 layer shapes, plus the "auto" column: the
path the measured dispatch (unweight/runtime/tuning.py) picks from these very timings (a fused
kernel only where it beat decode + cuBLAS).  Needs a CUDA GPU; exits with status 2 and one line
otherwise.

    python scripts/bench_kernels.py [--models llama-3.1-8b] [--batches 1 4 16] [--iters 50]
                                    [--encodings palette huffman] [--write-cache [PATH]]
                                    [--write-defaults]

Prints a table and writes benchmarks/results/kernels-<gpu>-<date>.json.  --write-cache records
the choices in the user's tuning cache (default $UNWEIGHT_TUNING_CACHE or
~/.cache/unweight/tuning.json); --write-defaults records them in the shipped defaults
unweight/runtime/tuning_defaults.json (entries of other devices are kept).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", help="model names from benchmarks/shapes.csv (default: all)")
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 4, 16, 64, 256])
    ap.add_argument("--encodings", nargs="*", default=["palette", "huffman"], choices=["palette", "huffman"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--write-cache", nargs="?", const="", default=None, metavar="PATH",
                    help="record the dispatch choices in the user's tuning cache (or PATH)")
    ap.add_argument("--write-defaults", action="store_true",
                    help="record the dispatch choices in unweight/runtime/tuning_defaults.json")
    args = ap.parse_args()
    torch = bu.require_gpu()
    import numpy as np

    from unweight.codec import tensor_codec as tc
    from unweight.runtime import loader, tuning
    from unweight.runtime.modules import CompressedLinear

    env = bu.environment(torch)
    dev_name = tuning.device_name("cuda")
    measured = tuning.TuningTable()
    rows = []
    with torch.no_grad():
        for i, s in enumerate(bu.load_shapes(models=args.models)):
            N, K = s["N"], s["K"]
            w = bu.bf16_weights(torch, N, K, seed=i)
            w_np = w.view(torch.int16).cpu().numpy().view(np.uint16)
            mods = {}
            for enc_name in args.encodings:
                enc = tc.encode(w_np, enc_name)
                m = CompressedLinear(enc.header, device=torch.device("cuda"), planes=enc.planes)
                loader._build_lut(m)
                mods[enc_name] = m
            for M in args.batches:
                x = torch.randn((M, K), device="cuda").to(torch.bfloat16)
                r = {"model": s["model"], "layer": s["layer"], "N": N, "K": K, "M": M}
                r["cublas_ms"] = round(bu.time_cuda(torch, lambda: x @ w.T, args.warmup, args.iters), 4)
                # bandwidth of the weight read: dense 2 B/weight
                r["cublas_weight_GBps"] = round(N * K * 2 / (r["cublas_ms"] * 1e-3) / 1e9, 1)
                for enc_name, m in mods.items():
                    p = enc_name[:3]  # "pal" / "huf" column prefix
                    times = tuning.measure(m, M, args.warmup, args.iters)
                    choice = measured.record(dev_name, N, K, enc_name, M, times)
                    fused = tuning.PALETTE_GEMM if enc_name == "palette" else tuning.HUFFMAN_GEMM
                    r[f"{p}_decode_cublas_ms"] = round(times[tuning.DECODE_CUBLAS], 4)
                    r[f"{p}_fused_ms"] = round(times[fused], 4) if fused in times else "-"
                    r[f"{p}_fused_speedup"] = (round(r["cublas_ms"] / times[fused], 3) if fused in times else "-")
                    r[f"{p}_auto"] = choice
                    r[f"{p}_auto_ms"] = round(times[choice], 4)
                    r[f"{p}_auto_vs_cublas"] = round(r["cublas_ms"] / times[choice], 3)
                    if enc_name == "palette":
                        r["verbatim_blocks"] = m.owner().header.num_verbatim
                rows.append(r)
            del mods
            torch.cuda.empty_cache()
    cols = ["model", "layer", "N", "K", "M", "cublas_ms"]
    for enc_name in args.encodings:
        p = enc_name[:3]
        cols += [f"{p}_fused_ms", f"{p}_fused_speedup", f"{p}_decode_cublas_ms", f"{p}_auto", f"{p}_auto_vs_cublas"]
    bu.print_table(rows, cols + ["cublas_weight_GBps"])
    print("wrote", bu.write_results("kernels", env, rows))
    stamp = f"measured on {env['gpu']} (sm {env['sm']}, driver {env['driver']}, torch {env['torch']}) " \
            f"at {env['date']}, commit {env['git_commit'][:12]}, by scripts/bench_kernels.py"
    if args.write_cache is not None:
        path = args.write_cache or tuning.default_cache_path()
        t = tuning.TuningTable.load(path).update(measured)
        t.comment = t.comment or "unweight tuning cache"
        print("wrote", t.save(path))
    if args.write_defaults:
        t = tuning.TuningTable.load(tuning.DEFAULTS_PATH).update(measured)
        t.comment = ("Shipped dispatch defaults, written by scripts/bench_kernels.py --write-defaults; a fused path "
                     "is listed only where it beat decode + cuBLAS in the same run. Last " + stamp + ".")
        print("wrote", t.save(tuning.DEFAULTS_PATH))


if __name__ == "__main__":
    main()
