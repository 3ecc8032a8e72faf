#!/usr/bin/env python3
"""Host time per forward of a compressed layer: the Python and dispatch work an eager model
(transformers' generate without CUDA graphs) pays per layer and token, against nn.Linear's.

Each row times N back-to-back forwards of one layer on a small weight (default 64 x 64, batch 1,
so the device work is a few microseconds and the host is what is measured: on CUDA the
launches queue ahead of the device), R times; median and min microseconds per call.  Each
compressed variant runs twice in the same process: with the forward's ops called directly
(ops.run, the default) and through torch's dispatcher (_ext.direct_calls(False)), so the table
gives what the direct calls save.  Paths: decode + GEMM (huffman, palette) and, on CUDA, the
fused palette GEMV and tensor-core GEMV (a policy that picks them for the layer).

    python scripts/bench_host.py [--device cpu|cuda] [--shape 64x64] [--calls 2000] [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402


def _forced(path: str):
    """A dispatch policy that runs `path` for every palette layer (decode + cuBLAS for the rest)."""
    from unweight.runtime.policy import DECODE_CUBLAS, DispatchPolicy

    class Forced(DispatchPolicy):
        def linear_path(self, w, M, device):
            return DECODE_CUBLAS if w.is_huffman else path
    return Forced(None)


def time_calls(torch, fn, x, calls: int, runs: int) -> dict:
    """Microseconds per call of fn(x): `runs` timings of `calls` calls each (after a warm-up),
    the host clock around them; the device is synchronized before each timing only."""
    for _ in range(min(calls, 200)):
        fn(x)
    ts = []
    for _ in range(runs):
        bu.sync(torch)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        ts.append((time.perf_counter() - t0) / calls * 1e6)
    bu.sync(torch)
    return {"median_us": statistics.median(ts), "min_us": min(ts), "runs_us": ts}


def run(torch, device: str, rows: int, cols: int, batch: int, calls: int, runs: int) -> dict:
    from unweight.ops import _ext
    from unweight.runtime import scratch
    from unweight.runtime.modules import CompressedLinear
    torch.manual_seed(0)
    lin = torch.nn.Linear(cols, rows, bias=False).to(device=device, dtype=torch.bfloat16)
    torch.nn.init.normal_(lin.weight, std=0.02)
    x = torch.randn(batch, cols, device=device).to(torch.bfloat16)
    scratch.reserve(device, rows * cols)
    res = {"benchmark": "host", "environment": bu.environment(torch), "device": device, "shape": [rows, cols],
           "batch": batch, "calls": calls, "runs": runs, "rows": []}
    with torch.no_grad():
        ref = time_calls(torch, lin, x, calls, runs)
        res["rows"].append({"layer": "nn.Linear", "path": "cuBLAS" if device == "cuda" else "GEMM",
                            "direct": ref, "dispatcher": None})
        variants = [("huffman", None), ("palette", None)]
        if device == "cuda":
            variants += [("palette", "palette_gemv"), ("palette", "palette_gemv_mma")]
        for enc, path in variants:
            m = CompressedLinear.from_linear(lin, enc)
            if path:
                m.policy = _forced(path)
            want = lin(x)
            row = {"layer": f"CompressedLinear {enc}", "path": path or "decode + GEMM"}
            for key, on in (("direct", True), ("dispatcher", False)):
                with _ext.direct_calls(on):
                    y = m(x)
                    row[key] = time_calls(torch, m, x, calls, runs)
                if path is None:  # decode + GEMM gives nn.Linear's bits, either way
                    row[key]["same_bits_as_nn_linear"] = bool(torch.equal(y.view(torch.int16), want.view(torch.int16)))
            row["direct_saves_us"] = row["dispatcher"]["median_us"] - row["direct"]["median_us"]
            row["over_nn_linear_us"] = row["direct"]["median_us"] - ref["median_us"]
            res["rows"].append(row)
    return res


def table_rows(res) -> list:
    out = []
    for r in res["rows"]:
        d, p = r["direct"], r.get("dispatcher")
        out.append({"layer": r["layer"], "path": r["path"], "us_per_call": round(d["median_us"], 1),
                    "via_dispatcher_us": round(p["median_us"], 1) if p else "-",
                    "over_nn_linear_us": round(r["over_nn_linear_us"], 1) if "over_nn_linear_us" in r else "-"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when a GPU is visible")
    ap.add_argument("--shape", default="64x64", help="the layer's weight, NxK (out x in)")
    ap.add_argument("--batch", type=bu.positive_int, default=1)
    ap.add_argument("--calls", type=bu.positive_int, default=2000, help="forwards per timing")
    ap.add_argument("--runs", type=bu.positive_int, default=7)
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/host-<date>-<machine>-<commit>.json)")
    args = ap.parse_args(argv)
    try:
        ((_, rows, cols),) = bu.parse_shapes(args.shape)
    except (ValueError, SystemExit):
        return bu.fail(f"bench_host: bad shape {args.shape!r}: write NxK")
    out = bu.writable_path(args.out, "bench_host") if args.out else None
    import torch
    device = args.device or bu.device(torch)
    if device == "cuda" and not torch.cuda.is_available():
        return bu.fail("bench_host: --device cuda but torch sees no GPU")
    res = run(torch, device, rows, cols, args.batch, args.calls, args.runs)
    bu.print_table(table_rows(res), ["layer", "path", "us_per_call", "via_dispatcher_us", "over_nn_linear_us"])
    out = out or bu.result_path("host", bu.machine_tag(torch.cuda.get_device_name(0) if device == "cuda" else None))
    print("wrote", bu.write_json(out, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
