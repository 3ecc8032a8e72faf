#!/usr/bin/env python
"""Benchmark y = x @ W^T with W palette-coded: the fused kernel (M <= 16) and palette decode +
cuBLAS, against torch.matmul on dense BF16 (cuBLAS) in the same run, for batch sizes
1, 4, 16, 64, 256 on Llama-3.1 layer shapes.  Needs a CUDA GPU; exits with status 2 and one
line otherwise.

    python scripts/bench_kernels.py [--models llama-3.1-8b] [--batches 1 4 16] [--iters 50]

Prints a table and writes benchmarks/results/kernels-<gpu>-<date>.json.
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
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch = bu.require_gpu()
    import numpy as np

    from unweight.codec import tensor_codec as tc
    from unweight.runtime import cuda_ops as ops
    from unweight.runtime import kernel_plan as kp

    env = bu.environment(torch)
    rows = []
    for i, s in enumerate(bu.load_shapes(models=args.models)):
        N, K = s["N"], s["K"]
        w = bu.bf16_weights(torch, N, K, seed=i)
        enc = tc.encode(w.view(torch.int16).cpu().numpy().view(np.uint16), "palette")
        g = ops.to_device(enc.planes)
        for M in args.batches:
            x = torch.randn((M, K), device="cuda").to(torch.bfloat16)
            r = {"model": s["model"], "layer": s["layer"], "N": N, "K": K, "M": M,
                 "verbatim_blocks": enc.header.num_verbatim}
            r["cublas_ms"] = round(bu.time_cuda(torch, lambda: x @ w.T, args.warmup, args.iters), 4)
            r["decode_matmul_ms"] = round(bu.time_cuda(
                torch, lambda: x @ ops.decode_palette(enc.header, g).T, args.warmup, args.iters), 4)
            if kp.gemm_supported(M, K):
                r["fused_ms"] = round(bu.time_cuda(torch, lambda: ops.palette_gemm(x, enc.header, g), args.warmup,
                                                   args.iters), 4)
                r["fused_speedup"] = round(r["cublas_ms"] / r["fused_ms"], 3)
            else:
                r["fused_ms"] = r["fused_speedup"] = "-"
            # bandwidth of the weight read: dense 2 B/weight vs planes as stored
            r["cublas_weight_GBps"] = round(N * K * 2 / (r["cublas_ms"] * 1e-3) / 1e9, 1)
            rows.append(r)
    bu.print_table(rows, ["model", "layer", "N", "K", "M", "cublas_ms", "fused_ms", "fused_speedup",
                          "decode_matmul_ms", "cublas_weight_GBps"])
    print("wrote", bu.write_results("kernels", env, rows))


if __name__ == "__main__":
    main()
