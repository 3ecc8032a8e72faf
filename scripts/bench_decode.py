#!/usr/bin/env python
"""Benchmark the GPU decode kernels (Huffman -> BF16, palette -> BF16, Huffman -> palette
transcode) on Llama-3.1 layer shapes, against a dense BF16 copy and torch.matmul (cuBLAS) in
the same run.  Needs a CUDA GPU; exits with status 2 and one line otherwise.

    python scripts/bench_decode.py [--models llama-3.1-8b] [--iters 50]

Prints a table and writes benchmarks/results/decode-<gpu>-<date>.json.
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
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    torch = bu.require_gpu()
    import numpy as np

    from unweight.codec import tensor_codec as tc
    from unweight.runtime import cuda_ops as ops

    env = bu.environment(torch)
    rows = []
    for i, s in enumerate(bu.load_shapes(models=args.models)):
        N, K = s["N"], s["K"]
        w = bu.bf16_weights(torch, N, K, seed=i)
        w_host = w.view(torch.int16).cpu().numpy().view(np.uint16)
        enc_h = tc.encode(w_host, "huffman")
        enc_p = tc.encode(w_host, "palette")
        gh, gp = ops.to_device(enc_h.planes), ops.to_device(enc_p.planes)
        lut = ops.huffman_lut(enc_h.header)
        x = torch.randn((1, K), device="cuda").to(torch.bfloat16)
        t = {
            "copy_dense": bu.time_cuda(torch, lambda: w.clone(), args.warmup, args.iters),
            "matmul_m1": bu.time_cuda(torch, lambda: x @ w.T, args.warmup, args.iters),
            "huffman": bu.time_cuda(torch, lambda: ops.decode_huffman(enc_h.header, gh, lut=lut), args.warmup,
                                    args.iters),
            "palette": bu.time_cuda(torch, lambda: ops.decode_palette(enc_p.header, gp), args.warmup, args.iters),
            "transcode": bu.time_cuda(torch, lambda: ops.transcode_to_palette(enc_h.header, gh), 1,
                                      max(3, args.iters // 10)),
        }
        gbs = lambda ms: round(N * K * 2 / (ms * 1e-3) / 1e9, 1)  # noqa: E731 - output GB/s
        rows.append({"model": s["model"], "layer": s["layer"], "N": N, "K": K,
                     "huffman_ratio": round(enc_h.nbytes / (N * K * 2), 4),
                     "palette_ratio": round(enc_p.nbytes / (N * K * 2), 4),
                     **{f"{k}_ms": round(v, 4) for k, v in t.items()},
                     "huffman_GBps": gbs(t["huffman"]), "palette_GBps": gbs(t["palette"]),
                     "copy_GBps": gbs(t["copy_dense"])})
    bu.print_table(rows, ["model", "layer", "N", "K", "copy_dense_ms", "matmul_m1_ms", "huffman_ms", "palette_ms",
                          "transcode_ms", "huffman_GBps", "palette_GBps"])
    print("wrote", bu.write_results("decode", env, rows))


if __name__ == "__main__":
    main()
