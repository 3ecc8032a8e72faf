#!/usr/bin/env python3
"""Benchmark the GPU decode kernels: Huffman -> BF16, palette -> BF16 and the Huffman -> palette
transcode, on Llama-3.1-8B layer shapes, against a device-to-device copy of the dense BF16
weights measured in the same process.  Needs a CUDA GPU; exits with status 2 and one line
otherwise.

    python scripts/bench_decode.py [--shapes 4096x4096,128256x4096] [--runs 25] [--out PATH]

Method (scripts/_bench_util.py, graph_time): weights are N(0, 0.02) BF16 made on the GPU,
encoded by the host codec; each variant rotates over copies of its planes and outputs
spanning >= 4x the L2, launches are captured in a CUDA graph and replayed between CUDA events
(median and min of >= 20 replays, no host sync inside).  Every decoded weight is first
checked bitwise against the original.  The transcode reads two values back to the host by
design (a load-time operation), so it is timed call by call between events.

GB/s: out_GBps counts the BF16 bytes written; moved_GBps counts planes read + BF16 written,
the number to hold against the copy's read + write rate.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402


def _time_transcode(torch, ops, header, planes, lut, err, runs):
    times = []
    for _ in range(runs):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = ops.transcode_to_palette(header, planes, lut, err)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            out = ops.transcode_to_palette(header, planes, lut, err)
            times.append((time.perf_counter() - t0) * 1e3)
        del out
    return {"median_ms": sorted(times)[len(times) // 2], "min_ms": min(times), "runs_ms": times, "graph": False}


INDEX_INTERVALS = (1024, 256)


def other_decoders(kp) -> dict:
    """{encoding: decoder variant names} timed beside the runtime's default on each stream
    (runtime.kernel_plan.HUFF_VARIANTS / PAL_VARIANTS, less the default and Huffman's SCALAR,
    the fallback of shapes the vector readers cannot take); the default's row has no suffix."""
    return {"huffman": [n for n, v in kp.HUFF_VARIANTS.items() if v not in (kp.HUFF_DEFAULT_VARIANT,
                                                                            kp.HUFF_VARIANT_SCALAR)],
            "palette": [n for n, v in kp.PAL_VARIANTS.items() if v != kp.PAL_DEFAULT_VARIANT]}


def default_decoders(kp) -> dict:
    """{encoding: the name of the variant the runtime runs} (the unsuffixed rows)."""
    return {"huffman": next(n for n, v in kp.HUFF_VARIANTS.items() if v == kp.HUFF_DEFAULT_VARIANT),
            "palette": next(n for n, v in kp.PAL_VARIANTS.items() if v == kp.PAL_DEFAULT_VARIANT)}


def bench_shape(torch, name, N, K, seed, runs, l2, skip=()):
    import numpy as np

    from unweight import ops
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    h = bu.import_helpers()
    dev = bu.device(torch)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    w = bu.bf16_weights(torch, N, K, seed)
    w_bits = h.bits(w)
    dense = N * K * 2
    row = {"shape": name, "N": N, "K": K, "bf16_bytes": dense}
    # Dense baseline: copy the BF16 weights (2 B read + 2 B written per weight).
    k = bu.rotation_copies(2 * dense, l2)
    srcs = [w] + [w.clone() for _ in range(k - 1)]
    dsts = [torch.empty_like(w) for _ in range(k)]
    t = bu.graph_time(torch, [lambda s=s, d=d: d.copy_(s) for s, d in zip(srcs, dsts)], runs=runs)
    row["copy"] = {**t, "out_GBps": dense / (t["median_ms"] * 1e-3) / 1e9,
                   "moved_GBps": 2 * dense / (t["median_ms"] * 1e-3) / 1e9}
    del srcs, dsts
    encs = {e: tc.encode(w_bits, e) for e in ("huffman", "palette")}
    # The file's stream as stored (one chain per segment) and with the checkpoint index the GPU
    # loaders add (chains of S weights; S = 1024 by default, 256 for comparison).
    for s_chk in INDEX_INTERVALS:
        encs[f"huffman+index{s_chk}"] = tc.with_index(encs["huffman"].header, encs["huffman"].planes,
                                                      chk_interval=s_chk)
    from unweight.runtime import kernel_plan as kp
    decoders = other_decoders(kp)
    for e, enc in encs.items():
        ew = h.encoded_weight(enc, dev, err)
        nb = bu.encoded_bytes(ew)
        k = bu.rotation_copies(nb + dense, l2)
        ws = [ew] + [bu.clone_encoded(ew) for _ in range(k - 1)]
        outs = [torch.empty((N, K), dtype=torch.bfloat16, device=dev) for _ in range(k)]
        others = (decoders["huffman"] if e.startswith("huffman+index") else
                  decoders["palette"] if e == "palette" else ())
        others = tuple(v for v in others if f"{e.split('+')[0]}:{v}" not in skip)
        for v in ("", *others):
            code = (kp.PAL_VARIANTS[v] if e == "palette" else kp.HUFF_VARIANTS[v]) if v else 0
            bitwise = all(np.array_equal(g, w_bits) for g in h.decode_poisoned(ew, err, code))
            t = bu.graph_time(torch, [lambda x=x, o=o: h.decode_op(x, o, err, code) for x, o in zip(ws, outs)],
                              runs=runs)
            s = t["median_ms"] * 1e-3
            row[e + (f"+{v}" if v else "")] = {**t, "bitwise": bitwise, "planes_bytes": nb, "ratio": nb / dense,
                                               "out_GBps": dense / s / 1e9, "moved_GBps": (nb + dense) / s / 1e9}
        if e == "huffman":
            planes = h.huffman_planes(enc, ew)
            hdr, got = ops.transcode_to_palette(enc.header, planes, ew.lut, err)
            ref = tc.transcode_to_palette(enc.header, enc.planes)
            same = bool(np.array_equal(hdr.pack(), ref.header.pack()) and
                        np.array_equal(got[C.SUFFIX_IDX].cpu().numpy(), ref.planes[C.SUFFIX_IDX]))
            del got
            t = _time_transcode(torch, ops, enc.header, planes, ew.lut, err, max(5, runs // 2))
            row["transcode"] = {**t, "matches_host_codec": same,
                                "out_GBps": dense / (t["median_ms"] * 1e-3) / 1e9}
        del ws, outs, ew
        bu.empty_cache(torch)
    row["device_errors"] = int(err.item())
    return row


def run(torch, shapes, budget: "bu.Budget", runs: int = 25, out_path: str | None = None, log=print,
        skip: dict | None = None) -> dict:
    """Decode benchmark over `shapes` [(name, N, K)] within `budget`; a shape that fails is
    recorded with its error and the next one still runs.  Writes out_path after every shape.
    skip: {"huffman:<variant>" | "palette:<variant>": why} decoder variants left out."""
    skip = dict(skip or {})
    l2 = bu.l2_bytes(torch)
    res = {"benchmark": "decode", "environment": bu.environment(torch), "l2_bytes": l2, "runs": runs,
           "rotate_l2_factor": bu.ROTATE_L2_FACTOR, "rows": [],
           "skipped": [{"variant": t, "why": why} for t, why in sorted(skip.items())]}
    from unweight.runtime import kernel_plan as kp
    res["default_decoders"] = default_decoders(kp)
    res["copy_1GiB"] = bu.copy_bandwidth(torch)
    for i, (name, N, K) in enumerate(shapes):
        # ~80 ns/weight covers encoding on the host, the checked decodes and the timings.
        need = 5 + 8e-8 * N * K
        if budget.left() < need:
            res["skipped"].append({"shape": name, "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
            continue
        try:
            row = bench_shape(torch, name, N, K, i, runs, l2, skip)
        except Exception as e:  # noqa: BLE001 - a failing kernel is a finding; the next shape still runs
            row = {"shape": name, "N": N, "K": K, "error": f"{type(e).__name__}: {e}"}
            bu.sync(torch)
        res["rows"].append(row)
        log(f"decode {name}: " + ", ".join(f"{e} {v['median_ms']:.4f} ms ({v.get('out_GBps', 0):.0f} GB/s)"
                                           for e, v in row.items() if isinstance(v, dict) and "median_ms" in v)
            + (f" ERROR {row['error']}" if "error" in row else ""))
        if out_path:
            bu.write_json(out_path, res)
        bu.empty_cache(torch)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=bu.shapes_arg, default=None,
                    help="NxK,... (default: Llama-3.1-8B's o, qkv, mlp up, mlp down, lm_head)")
    ap.add_argument("--runs", type=bu.positive_int, default=25, help="timed graph replays per variant (>= 20)")
    ap.add_argument("--budget", type=bu.positive_float, default=600.0,
                    help="seconds; shapes that would not fit are skipped")
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/decode-<date>-<gpu>-<commit>.json)")
    args = ap.parse_args(argv)
    out = bu.writable_path(args.out, "bench_decode") if args.out else None
    torch = bu.require_gpu()
    shapes = args.shapes or bu.parse_shapes(None)
    out = out or bu.result_path("decode", bu.machine_tag(torch.cuda.get_device_name(0)))
    res = run(torch, shapes, bu.Budget(args.budget), args.runs, out)
    rows = [{"shape": r["shape"], **{f"{e}_ms": round(r[e]["median_ms"], 4) for e in ("copy", "huffman", "palette",
                                                                                       "transcode") if e in r},
             **{f"{e}_GBps": round(r[e]["out_GBps"], 1) for e in ("huffman", "palette") if e in r}}
            for r in res["rows"] if "error" not in r]
    bu.print_table(rows, ["shape", "copy_ms", "huffman_ms", "palette_ms", "transcode_ms", "huffman_GBps",
                          "palette_GBps"])
    print("wrote", bu.write_json(out, res))
    return bu.nothing_measured("bench_decode", res, out)


if __name__ == "__main__":
    sys.exit(main())
