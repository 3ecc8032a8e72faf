#!/usr/bin/env python3
"""Benchmark y = x @ W^T with W compressed against cuBLAS BF16 on the dense W, in one process:
the fused kernels this build has (unweight.runtime.dispatch.fused) and decode + cuBLAS (the
runtime's baseline) for each encoding, at batch 1, 2, 4, 8, 16, 32, 64 on Llama-3.1-8B layer
shapes.  Needs a CUDA GPU; exits with status 2 and one line otherwise.

    python scripts/bench_kernels.py [--shapes 4096x4096] [--batches 1 16 64] [--runs 25]
                                    [--encodings palette huffman] [--out PATH]
                                    [--write-cache [PATH]] [--write-defaults]
    python scripts/bench_kernels.py --from-json RESULT.json --write-defaults   # no GPU needed

Method (scripts/_bench_util.py, graph_time): CUDA-graph replays between CUDA events, every
variant rotating over copies of its weights spanning >= 4x the L2, median and min of >= 20
replays; cuBLAS is timed the same way on dense copies.  Before timing, each fused kernel's
output is checked against cuBLAS on the same weights (error vs a float64 reference <= 2x
cuBLAS BF16's, and a repeat bitwise equal); a launch the kernel refuses (e.g. M > 16) is
recorded as refused with its message.  time_vs_cublas = time / cuBLAS time (2.0 = twice as slow).

The "auto" entry is the path the measured dispatch (unweight/runtime/tuning_table.py) picks
from these very timings.  --write-cache records the choices in the user's tuning cache
($UNWEIGHT_TUNING_CACHE or ~/.cache/unweight/tuning.json, or PATH); --write-defaults in the
shipped unweight/runtime/tuning_defaults.json (entries of other devices are kept).
--from-json rebuilds those choices from a recorded run instead of measuring (a result JSON of
this script, or a bench stage JSON of scripts/gpu_check.py, whose raw.kernels it reads, and
whose raw.decode gives the decoder choices as scripts/bench_decode.py records them): the same
rule, from the same medians, a fused time counted only where its accuracy check passed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

def bench_shape(torch, name, N, K, batches, encodings, runs, l2, budget, table, dev_name, log, skip=()):
    import torch.nn.functional as F

    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    from unweight.runtime import dispatch, scratch
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.policy import GEMV_PATHS, DispatchPolicy
    h = bu.import_helpers()
    dev = bu.device(torch)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    w = bu.bf16_weights(torch, N, K, seed=N + K)
    w_bits = h.bits(w)
    dense = [w] + [w.clone() for _ in range(bu.rotation_copies(N * K * 2, l2) - 1)]
    copies, encs = {}, {}
    for e in encodings:
        enc = encs[e] = tc.encode(w_bits, e)
        if e == "huffman":  # as the GPU loaders hold it: with the checkpoint index (prepare._add_index)
            enc = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
        ew = bu.as_gpu_loaders_hold(h.encoded_weight(enc, dev, err))
        copies[e] = [ew] + [bu.clone_encoded(ew) for _ in range(bu.rotation_copies(bu.encoded_bytes(ew), l2) - 1)]
    scratch.reserve(dev, N * K)
    baseline = DispatchPolicy(None)
    tiled = []  # tile-major copies of the palette weights, made at the first batch that times them
    split = []  # their planes in the split layout (ops.split_palette_planes), where the palette allows
    writer = []  # the same in the writer's palette order (WRITER_ORDER_BATCHES)
    rows = []
    for M in batches:
        if budget.left() < 3 + 2e-9 * N * K * (1 + 2 * len(encodings)):
            rows.append({"shape": name, "N": N, "K": K, "M": M, "skipped": f"{budget.left():.0f} s left"})
            continue
        x = torch.randn((M, K), device=dev).to(torch.bfloat16)
        r = {"shape": name, "N": N, "K": K, "M": M}
        if "palette" in copies:  # the palette order the rows ran with (the loaders': paired where it can)
            r["palette"] = list(copies["palette"][0].palette)
        t = bu.graph_time(torch, [lambda d=d: F.linear(x, d) for d in dense], runs=runs)
        r["cublas"] = {**t, "weight_GBps": N * K * 2 / (t["median_ms"] * 1e-3) / 1e9}
        t_cublas = t["median_ms"]
        for e, ws in copies.items():
            t = bu.graph_time(torch, [lambda q=q: dispatch.linear([q], x, None, N, K, baseline) for q in ws],
                              runs=runs)
            r[f"{e}_decode_cublas"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas}
            times = {"decode_cublas": t["median_ms"]}
            try:
                acc = h.fused_vs_cublas(ws[0], x, w, err)
            except (ValueError, RuntimeError) as ex:  # no such kernel, or it refused this problem
                r[f"{e}_fused"] = {"refused": f"{type(ex).__name__}: {ex}"}
            else:
                try:
                    t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x) for q in ws], runs=runs)
                    r[f"{e}_fused"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "accuracy": acc,
                                       "weight_GBps": bu.encoded_bytes(ws[0]) / (t["median_ms"] * 1e-3) / 1e9}
                    times[h.fused_paths()[e]] = t["median_ms"]
                except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
                    r[f"{e}_fused"] = {"error": f"{type(ex).__name__}: {ex}", "accuracy": acc}
                if e == "palette":  # the other copy layouts of the same kernel, and the GEMV (LAYOUTS)
                    y_one = None  # the one-tile kernel's result, computed once for the bit comparisons
                    for key, path, tag, same in LAYOUTS:
                        gemm = path not in GEMV_PATHS
                        if tag in skip or not (gemm or kp.pgemv_supported(M, K, GEMV_PATHS[path])):
                            continue
                        if gemm and y_one is None:
                            y_one = h.fused_op(ws[0], x, err).view(torch.int16)
                        _time_layout(torch, h, ws, x, w, err, t_cublas, runs, r, times, key, path,
                                     y_one if gemm else None, require_same=same)
                    if "tiled" not in skip and kp.pal_tiled_ok(N, K):
                        tiled = tiled or [bu.clone_encoded(q, tiled=True) for q in ws]
                        t = bu.graph_time(torch, [lambda q=q: dispatch.linear([q], x, None, N, K, baseline)
                                                  for q in tiled], runs=runs)
                        r["palette_tiled_decode_cublas"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas}
                        times_tiled = {"decode_cublas": t["median_ms"]}
                        for key, path, ref, tag in TILED:
                            if ref in times and tag not in skip:  # (its file-order reference passed)
                                _time_tiled(torch, h, ws, tiled, x, err, t_cublas, runs, r, key, path, ref)
                                if r[key].get("same_bits_as_file_order"):
                                    times_tiled[path] = r[key]["median_ms"]
                        table.record(dev_name, N, K, "palette:tiled", M, times_tiled)
                        base = r.get("palette_gemv_mma_tiled", {})
                        if (M in WRITER_ORDER_BATCHES and "median_ms" in base
                                and list(encs[e].header.palette[: encs[e].header.pal_size]) != list(ws[0].palette)):
                            writer = writer or [bu.clone_encoded(h.encoded_weight(encs[e], dev, err), tiled=True)
                                                for _ in ws]
                            key = "palette_gemv_mma_tiled_writer_order"
                            _time_tiled(torch, h, ws, writer, x, err, t_cublas, runs, r, key, "palette_gemv_mma",
                                        "palette_gemv_mma")
                            if "median_ms" in r[key]:
                                r[key]["time_vs_paired"] = r[key]["median_ms"] / base["median_ms"]
                        if M in PDL_BATCHES and "gemv:pdl" not in skip:
                            _time_switched(torch, h, tiled, x, err, t_cublas, runs, r, PDL_ROWS, h.programmatic,
                                           "_pdl", "no_pdl")
                        if M in PDL_WG_BATCHES and "gemm:wg" not in skip:
                            _time_switched(torch, h, tiled, x, err, t_cublas, runs, r, PDL_WG_ROWS, h.programmatic,
                                           "_pdl", "no_pdl")
                            _time_switched(torch, h, tiled, x, err, t_cublas, runs, r, WG_TILE_WAIT_ROWS,
                                           h.wgmma_tile_wait, "_tile_wait", "step")
                        if M in X_PREFETCH_BATCHES:
                            _time_switched(torch, h, tiled, x, err, t_cublas, runs, r, X_PREFETCH_ROWS,
                                           lambda on: h.gemv_x_prefetch(not on), "_no_x_prefetch", "x_prefetch")
                        if M in PROBE_BATCHES and "gemv:probe" not in skip:
                            _time_probes(torch, tiled, x, runs, r, log)
                        if M in SPLIT_BATCHES and "gemv:mma_split" not in skip:
                            _time_split(torch, tiled, split, x, t_cublas, runs, r)
                if e == "palette" and M == 1 and budget.left() > 30:
                    r["palette_split_sweep"] = _split_sweep(torch, ws, x, runs, t_cublas,
                                                            wide="gemm:wide" not in skip)
                    r["palette_gemv_parts_sweep"] = _gemv_parts_sweep(torch, ws, x, runs, t_cublas, skip)
                    if "gemv:mma_queue" not in skip:
                        r["palette_gemv_queue_sweep"] = _queue_units_sweep(torch, ws, tiled, x, runs, t_cublas)
            choice = table.record(dev_name, N, K, e, M, times)
            r[f"{e}_auto"] = {"choice": choice, "time_vs_cublas": times[choice] / t_cublas}
        r["device_errors"] = int(err.item())
        rows.append(r)
        log(f"kernels {name} M={M}: cuBLAS {t_cublas * 1e3:.1f} us; " + "; ".join(
            f"{e} fused {_ratio(r.get(e + '_fused'))}, decode+cuBLAS {_ratio(r.get(e + '_decode_cublas'))}"
            for e in copies) + "".join(f"; {key.replace('_', ' ')} {_ratio(r[key])}"
                                       for key, *_ in LAYOUTS + TILED + WRITER_ROW + PDL_KEYS + SPLIT_ROW
                                       if key in r))
    del dense, copies
    bu.empty_cache(torch)
    return rows


# The fused palette GEMM's other copy layouts, and the palette GEMV (batch 1..4; its tensor-core
# variants 1..32), timed beside
# the one-tile kernel: (row key, tuning-table path, variant tag for the GPU runbook's skips,
# whether it must give the one-tile kernel's bits: the mma.sync layouts do, the GEMV sums in its
# own order, and the wgmma layout may round differently inside a k16 step, so its bits are
# recorded against the one-tile kernel's, not required).
LAYOUTS = (("palette_fused_wide", "palette_gemm_wide", "gemm:wide", True),
           ("palette_fused_xs", "palette_gemm_xs", "gemm:xs", True),
           ("palette_fused_wg", "palette_gemm_wg", "gemm:wg", False),
           ("palette_gemv", "palette_gemv", "gemv", False),
           ("palette_gemv_deep", "palette_gemv_deep", "gemv:deep", False),
           ("palette_gemv_staged", "palette_gemv_staged", "gemv:staged", False),
           ("palette_gemv_mma", "palette_gemv_mma", "gemv:mma", False),
           ("palette_gemv_mma_staged", "palette_gemv_mma_staged", "gemv:mma_staged", False),
           ("palette_gemv_mma_prefetch", "palette_gemv_mma_prefetch", "gemv:mma_prefetch", False),
           ("palette_gemv_mma_queue", "palette_gemv_mma_queue", "gemv:mma_queue", False))


# The palette kernels timed again on tile-major planes (ops/layout.py; the same bits as on file
# order, checked): (row key, path, the file-order path whose bits and time it is held to, the
# runbook's variant tag that leaves it out beside "tiled", or None).  They
# fill the table's "palette:tiled" entries (with decode + cuBLAS on the same tile-major copies as
# their baseline), from which a runtime both picks a tile-major weight's path and decides, per
# shape, which order to load a weight in (TuningTable.plane_order).  The bulk-copy GEMV runs
# tile-major only: it is held to the register-direct tensor-core GEMV's file-order bits.
TILED = (("palette_fused_tiled", "palette_gemm", "palette_gemm", None),
         ("palette_fused_wide_tiled", "palette_gemm_wide", "palette_gemm_wide", None),
         # (the runtime holds a weight tile-major where the table says so, the H200's for every
         # Llama-8B shape: a path the tile-major entries never time is never chosen for it)
         ("palette_fused_xs_tiled", "palette_gemm_xs", "palette_gemm_xs", "gemm:xs"),
         ("palette_fused_wg_tiled", "palette_gemm_wg", "palette_gemm_wg", "gemm:wg"),
         ("palette_gemv_tiled", "palette_gemv", "palette_gemv", None),
         ("palette_gemv_mma_tiled", "palette_gemv_mma", "palette_gemv_mma", None),
         ("palette_gemv_mma_staged_tiled", "palette_gemv_mma_staged", "palette_gemv_mma_staged", None),
         ("palette_gemv_mma_bulk_tiled", "palette_gemv_mma_bulk", "palette_gemv_mma", "gemv:mma_bulk"),
         ("palette_gemv_mma_queue_tiled", "palette_gemv_mma_queue", "palette_gemv_mma_queue", "gemv:mma_queue"))


# Batches at which the tensor-core GEMV on tile-major planes is timed again with the palette in
# the writer's order (the general decode) beside the paired order the loaders hold: what the
# reorder (ops.paired_palette) buys, measured in one run.
WRITER_ORDER_BATCHES = (1, 16)
WRITER_ROW = (("palette_gemv_mma_tiled_writer_order",),)


# Batches at which the tensor-core GEMVs on tile-major planes are timed again with programmatic
# dependent launch on (ops.programmatic_launch): the graph replays back-to-back launches over the
# rotating copies, as a layer's q, k and v (or gate and up) projections run, so each launch may
# start streaming its planes while the one ahead ends.  Rows: "<row>_pdl", with time_vs_no_pdl.
PDL_BATCHES = (1, 16)
PDL_ROWS = (("palette_gemv_mma_tiled", "palette_gemv_mma"), ("palette_gemv_mma_queue_tiled", "palette_gemv_mma_queue"))
# The wgmma GEMM the same way at the batches it is for: with programmatic launch on, its x reorder
# may start under the launch ahead, and the GEMM sets up its weight pipeline and verbatim cursors
# while the reorder writes x's images.
PDL_WG_BATCHES = (64, 256)
PDL_WG_ROWS = (("palette_fused_wg_tiled", "palette_gemm_wg"),)
# And the wgmma GEMM's other schedule (ops.wgmma_tile_wait: each tile waits for its own wgmmas,
# and x is refilled a stage earlier), beside the default: "<row>_tile_wait", time_vs_step.
WG_TILE_WAIT_ROWS = PDL_WG_ROWS
# Batches at which the tensor-core GEMVs on tile-major planes are timed again without their L1
# prefetch of x (ops.gemv_x_prefetch, on by default): "<row>_no_x_prefetch", time_vs_x_prefetch
# (above 1: the prefetch pays for its instructions).
X_PREFETCH_BATCHES = (1, 16)
X_PREFETCH_ROWS = PDL_ROWS
PDL_KEYS = tuple((key + "_pdl",) for key, _ in PDL_ROWS + PDL_WG_ROWS) + tuple(
    (key + "_tile_wait",) for key, _ in WG_TILE_WAIT_ROWS) + tuple(
    (key + "_no_x_prefetch",) for key, _ in X_PREFETCH_ROWS)


def _time_switched(torch, h, tiled, x, err, t_cublas, runs, r, rows, switch, suffix, ref) -> None:
    """Each timed (row, path) of `rows` again with the process-wide `switch` on, into
    r[row + suffix]: its bits against the same launch with it off (same_bits_as_<ref>) and its
    time against the row's (time_vs_<ref>).  PDL_ROWS and PDL_WG_ROWS with h.programmatic
    ("_pdl", "no_pdl"); WG_TILE_WAIT_ROWS with h.wgmma_tile_wait ("_tile_wait", "step");
    X_PREFETCH_ROWS with the L1 prefetch of x turned off ("_no_x_prefetch", "x_prefetch")."""
    for key, path in rows:
        if "median_ms" not in r.get(key, {}):
            continue
        try:
            with switch(False):
                want = h.fused_op(tiled[0], x, err, path).view(torch.int16)
            with switch(True):
                same = bool(torch.equal(h.fused_op(tiled[0], x, err, path).view(torch.int16), want))
                t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in tiled], runs=runs)
        except Exception as ex:  # noqa: BLE001 - a failing launch mode is a finding
            r[key + suffix] = {"error": f"{type(ex).__name__}: {ex}"}
            continue
        r[key + suffix] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, f"same_bits_as_{ref}": same,
                           f"time_vs_{ref}": t["median_ms"] / r[key]["median_ms"]}


# Batches at which the tensor-core GEMV on tile-major planes (the runtime's batch-1 path) is
# timed again with one stage left out: ops.palette_gemv_probe's "no_decode" (the loaded words go
# to the tensor cores undecoded), "no_mma" (decoded, neither x loaded nor multiplied) and
# "stream" (the loads alone), the kernel itself on an empty verbatim list ("no_verbatim"), and
# the kernel finding its verbatim cursors by a search of the whole list instead of the row
# index the loaders hold ("search": ops.verbatim_rows left out).
# Row "palette_gemv_mma_tiled_probe": each time and its share of the full kernel's, which say
# what the decode, the verbatim blocks, the mma, the stream and the cursor search cost
# (docs/design/gpu-kernels.md, "What bounds the tensor-core GEMV at batch 1").  Their results
# are not the product and are not checked.
PROBE_BATCHES = (1,)


def _time_probes(torch, tiled, x, runs, r, log) -> None:
    """Times the probes on the tile-major copies into r["palette_gemv_mma_tiled_probe"]."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    base = r.get("palette_gemv_mma_tiled", {})
    if "median_ms" not in base or not hasattr(ops, "palette_gemv_probe"):
        return
    w0, v = tiled[0], kp.PGEMV_VARIANT_MMA
    parts = ops.palette_gemv_parts(w0.rows, w0.cols, x.device, v)
    calls = {"no_verbatim": lambda q: torch.ops.unweight.palette_gemv(x, q.sm, q.idx, q.vpos[:0], q.vexp[:0], q.rows,
                                                                      q.cols, q.palette, parts, v, True),
             "search": lambda q: torch.ops.unweight.palette_gemv(x, q.sm, q.idx, q.vpos, q.vexp, q.rows, q.cols,
                                                                 q.palette, parts, v, True)}
    for name in kp.PGEMV_PROBES:
        calls[name] = lambda q, name=name: ops.palette_gemv_probe(x, q.sm, q.idx, q.vpos, q.vexp, q.rows, q.cols,
                                                                  q.palette, parts, name, tiled=True,
                                                                  vrow=getattr(q, "vrow", None))
    out = {"full_ms": base["median_ms"], "parts": parts, "verbatim_blocks": int(w0.vpos.numel())}
    for name, call in calls.items():
        try:
            t = bu.graph_time(torch, [lambda q=q: call(q) for q in tiled], runs=runs)
        except Exception as ex:  # noqa: BLE001 - a refused probe is a finding
            out[name] = {"error": f"{type(ex).__name__}: {ex}"}
            continue
        out[name] = {**t, "share_of_full": t["median_ms"] / base["median_ms"]}
    r["palette_gemv_mma_tiled_probe"] = out
    shares = (f"{k} {out[k]['share_of_full']:.2f}" if "share_of_full" in out[k] else f"{k} error" for k in calls)
    log(f"kernels {w0.rows}x{w0.cols} M={x.size(0)}: tensor-core GEMV {base['median_ms'] * 1e3:.1f} us; "
        "as a share of it: " + ", ".join(shares))


# Batches at which the tensor-core GEMV is timed on the split layout (ops.split_palette_planes,
# kernel_plan.PGEMV_VARIANT_MMA_SPLIT: 6 decode operations per 4 weights where the stored layout
# takes 8) beside the same kernel on the tile-major planes; both tile-major.  Row
# "palette_gemv_mma_split_tiled": its time, time_vs_mma (against "palette_gemv_mma_tiled") and
# whether it gave that kernel's bits.  The benchmark's N(0, 0.02) palettes, 16 exponents from
# 108, fall in 8 halves; a palette that does not gets no row.
SPLIT_BATCHES = (1, 16)
SPLIT_ROW = (("palette_gemv_mma_split_tiled",),)


def _split_copies(tiled) -> list:
    """(lo, codes, weight) per tile-major copy whose palette the split layout takes."""
    from unweight import ops
    return [(*ops.split_palette_planes(q.sm, q.idx, q.palette), q) for q in tiled
            if ops.split_halves(q.palette) is not None]


def _time_split(torch, tiled, split, x, t_cublas, runs, r) -> None:
    """Times the GEMV on the split copies (made into `split` at the first call) into
    r["palette_gemv_mma_split_tiled"]."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    base = r.get("palette_gemv_mma_tiled", {})
    if "median_ms" not in base or not hasattr(kp, "PGEMV_VARIANT_MMA_SPLIT"):
        return
    try:
        split[:] = split or _split_copies(tiled)
    except Exception as ex:  # noqa: BLE001 - a failing transform is a finding
        r["palette_gemv_mma_split_tiled"] = {"error": f"split_palette_planes: {type(ex).__name__}: {ex}"}
        return
    if not split:
        return
    v = kp.PGEMV_VARIANT_MMA_SPLIT
    q0 = tiled[0]
    parts = ops.palette_gemv_parts(q0.rows, q0.cols, x.device, v)

    def call(lo, codes, q, variant=v):
        return torch.ops.unweight.palette_gemv(x, lo, codes, q.vpos, q.vexp, q.rows, q.cols, q.palette, parts, variant,
                                               True, q.vrow)
    try:
        lo, codes, q = split[0]
        want = call(q.sm, q.idx, q, kp.PGEMV_VARIANT_MMA).view(torch.int16)
        same = bool(torch.equal(call(lo, codes, q).view(torch.int16), want))
        t = bu.graph_time(torch, [lambda c=c: call(*c) for c in split], runs=runs)
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r["palette_gemv_mma_split_tiled"] = {"error": f"{type(ex).__name__}: {ex}"}
        return
    r["palette_gemv_mma_split_tiled"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "same_bits_as_mma": same,
                                         "time_vs_mma": t["median_ms"] / base["median_ms"]}


def _time_tiled(torch, h, ws, tiled, x, err, t_cublas, runs, r, key, path, ref) -> None:
    """Times `path` on the tile-major copies into r[key], with its time against the file-order
    run of `ref` (r's entry for it; `path` itself where it runs in file order) and whether it
    gave that run's bits."""
    try:
        want = h.fused_op(ws[0], x, err, ref).view(torch.int16)
        same = bool(torch.equal(h.fused_op(tiled[0], x, err, path).view(torch.int16), want))
        t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in tiled], runs=runs)
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r[key] = {"error": f"{type(ex).__name__}: {ex}"}
        return
    base = next((r[k] for k, p, *_ in LAYOUTS if p == ref and k in r), r.get("palette_fused"))
    r[key] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "same_bits_as_file_order": same,
              "weight_GBps": bu.encoded_bytes(tiled[0]) / (t["median_ms"] * 1e-3) / 1e9}
    if base and "median_ms" in base:
        r[key]["time_vs_file_order"] = t["median_ms"] / base["median_ms"]


def _time_layout(torch, h, ws, x, w, err, t_cublas, runs, r, times, key, path, y_one=None,
                 require_same: bool = True) -> None:
    """Times the palette kernel `path` into r[key] and times[path] (when it meets the accuracy
    bound and, given the one-tile kernel's result y_one (int16 view), gives its bits, or
    require_same is False: then whether it did is only recorded)."""
    try:
        acc = h.fused_vs_cublas(ws[0], x, w, err, path)
        same = y_one is None or bool(torch.equal(h.fused_op(ws[0], x, err, path).view(torch.int16), y_one))
        t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in ws], runs=runs)
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r[key] = {"error": f"{type(ex).__name__}: {ex}"}
        return
    r[key] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "accuracy": acc,
              "weight_GBps": bu.encoded_bytes(ws[0]) / (t["median_ms"] * 1e-3) / 1e9}
    if y_one is not None:
        r[key]["same_bits_as_palette_fused"] = same
    if acc.get("passed") and (same or not require_same):
        times[path] = t["median_ms"]


def _split_sweep(torch, ws, x, runs, t_cublas, wide: bool = True) -> dict:
    """The fused palette GEMM at every K split of a doubling ladder (and the planned one), with
    one- and two-tile stages: {"planned": s, "1:<splits>" / "2:<splits>": time / cuBLAS time}.
    Data for the split heuristic (kernel_plan.pmma_splits), not a dispatch choice."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    w0, M = ws[0], x.size(0)
    planned = ops.palette_splits(w0.rows, w0.cols, x.device, M)
    most = min(w0.cols // kp.PMMA_TILE_K, kp.PMMA_MAX_SPLITS)
    ladder = sorted({s for s in (1, 2, 4, 8, 16, 32, planned) if s <= most})
    work = torch.zeros(max(1, kp.pmma_workspace_elems(M, w0.rows, max(ladder))), dtype=torch.float32,
                       device=x.device)
    cnt = torch.zeros(kp.pmma_counters(w0.rows), dtype=torch.int32, device=x.device)
    out = {"planned": planned}
    for tiles in (1, kp.PMMA_SUB_WIDE) if wide else (1,):
        for sp in ladder:
            def call(q, sp=sp, tiles=tiles):
                return torch.ops.unweight.palette_matmul(x, q.sm, q.idx, q.vpos, q.vexp, work, cnt, q.rows, q.cols,
                                                         q.palette, sp, tiles, vrow=q.vrow)
            try:
                t = bu.graph_time(torch, [lambda q=q: call(q) for q in ws], runs=max(10, runs // 2))
                out[f"{tiles}:{sp}"] = t["median_ms"] / t_cublas
            except Exception as ex:  # noqa: BLE001 - a refused split is a finding
                out[f"{tiles}:{sp}"] = f"{type(ex).__name__}: {ex}"
    return out


def _gemv_parts_sweep(torch, ws, x, runs, t_cublas, skip) -> dict:
    """The palette GEMV (default and tensor-core variants) at parts 1, 2, 4, 8 (the tensor-core
    one at every count 1..8: at 3, 5, 6 and 7 a CTA holds one tile) and the planned one:
    {"<path>:planned": p, "<path>:<parts>": time / cuBLAS time}.  Data for the parts heuristics
    (kernel_plan.pgemv_parts, pgemv_mma_parts_any), not a dispatch choice."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.policy import GEMV_PATHS
    w0, out = ws[0], {}
    for path, tag in (("palette_gemv", "gemv"), ("palette_gemv_mma", "gemv:mma")):
        if tag in skip:
            continue
        v = GEMV_PATHS[path]
        out[f"{path}:planned"] = ops.palette_gemv_parts(w0.rows, w0.cols, x.device, v)
        counts = range(1, kp.PGEMV_MAX_PARTS + 1) if kp.pgemv_any_parts(v) else (1, 2, 4, 8)
        for parts in counts:
            def call(q, parts=parts, v=v):
                return torch.ops.unweight.palette_gemv(x, q.sm, q.idx, q.vpos, q.vexp, q.rows, q.cols, q.palette,
                                                       parts, v, q.tiled, q.vrow)
            out[f"{path}:{parts}"] = _sweep_point(torch, ws, call, runs, t_cublas)
    return out


def _sweep_point(torch, copies, call, runs, t_cublas):
    """One point of a sweep: call(q) over the copies timed, as time / cuBLAS time, or the
    error that refused it (a refused count is a finding, not a failure)."""
    try:
        t = bu.graph_time(torch, [lambda q=q: call(q) for q in copies], runs=max(10, runs // 2))
        return t["median_ms"] / t_cublas
    except Exception as ex:  # noqa: BLE001
        return f"{type(ex).__name__}: {ex}"


def _queue_units_sweep(torch, ws, tiled, x, runs, t_cublas) -> dict:
    """The queued tensor-core GEMV at 1, 2, 4, 8, 16 and 32 units per tile and the planned count,
    on the tile-major copies when made (the order the H200 holds every Llama-8B weight in), else
    on the planes as loaded: {"planned": u, "tiled:<units>" / "<units>": time / cuBLAS time}.  Its register-direct reference runs one part per warp at the same
    counts (palette_gemv_parts_sweep), so the two sweeps side by side say what handing the units
    out from a queue buys at each granularity.  Data for the units plan
    (kernel_plan.pgemv_mma_queue_units), not a dispatch choice."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    w0, M = ws[0], x.size(0)
    planned = ops.palette_gemv_queue_units(w0.rows, w0.cols, x.device)
    steps = kp.cdiv(w0.cols, kp.PGEMV_MMA_COLS)
    ladder = sorted({u for u in (1, 2, 4, 8, 16, 32, planned) if u <= steps})
    work = torch.zeros(max(1, kp.pgemv_mma_queue_workspace(w0.rows, max(ladder), M)), dtype=torch.float32,
                       device=x.device)
    cnt = torch.zeros(kp.pgemv_mma_queue_counters(w0.rows), dtype=torch.int32, device=x.device)
    out = {"planned": planned}
    for tag, copies in ((("tiled:", tiled),) if tiled else (("", ws),)):
        for units in ladder:
            def call(q, units=units):
                return torch.ops.unweight.palette_gemv_queue(x, q.sm, q.idx, q.vpos, q.vexp, work, cnt, q.rows, q.cols,
                                                             q.palette, units, q.tiled, q.vrow)
            out[f"{tag}{units}"] = _sweep_point(torch, copies, call, runs, t_cublas)
    return out


def _ratio(entry) -> str:
    if not entry:
        return "-"
    if "time_vs_cublas" in entry:
        return f"x{entry['time_vs_cublas']:.2f}"
    return "refused" if "refused" in entry else "error"


def run(torch, shapes, budget: "bu.Budget", batches=bu.BATCHES, encodings=("palette", "huffman"), runs: int = 25,
        out_path: str | None = None, log=print, skip: dict | None = None) -> dict:
    """Kernel benchmark within `budget`; a shape that fails is recorded and the next one runs.
    Returns the result dict (with the measured TuningTable under "_table", not serialized).
    skip: {"gemm:wide" | "gemm:xs" | "gemv": why} leaves that palette kernel out."""
    skip = dict(skip or {})
    from unweight.runtime.tuning_table import TuningTable
    l2 = bu.l2_bytes(torch)
    dev_name = bu.device_name(torch)
    table = TuningTable()
    res = {"benchmark": "kernels", "environment": bu.environment(torch), "l2_bytes": l2, "runs": runs,
           "batches": list(batches), "encodings": list(encodings), "rows": [],
           "skipped": [{"variant": t, "why": why} for t, why in sorted(skip.items())]}
    est = bu.WorkEstimate(5, 1e-8)  # the prior until two shapes are timed, then the run's own rate
    for name, N, K in shapes:
        need = est.need(N * K * len(batches))
        if budget.left() < need:
            res["skipped"].append({"shape": name, "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
            continue
        t0 = time.monotonic()
        try:
            rows = bench_shape(torch, name, N, K, batches, encodings, runs, l2, budget, table, dev_name, log, skip)
            res["rows"] += rows
            if not any("skipped" in r for r in rows):  # a shape cut short says nothing of the rate
                est.record(N * K * len(batches), time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a failing shape is a finding; the next one still runs
            res["rows"].append({"shape": name, "N": N, "K": K, "error": f"{type(e).__name__}: {e}"})
            bu.sync(torch)
            bu.empty_cache(torch)
        if out_path:
            bu.write_json(out_path, res)
    res["_table"] = table
    return res


def table_from_rows(rows, device_name: str, encodings=("palette", "huffman")):
    """TuningTable of a recorded run's rows (the dispatch choices bench_shape recorded)."""
    from unweight.runtime.tuning_table import PALETTE_GEMM, TuningTable, bucket, entry_key
    table = TuningTable()
    for r in rows:
        # Only palette has a fused kernel: for huffman, decode + cuBLAS has nothing to choose from.
        dec, fz = r.get("palette_decode_cublas") or {}, r.get("palette_fused") or {}
        if "palette" not in encodings or "cublas" not in r or "median_ms" not in dec:
            continue
        times = {"decode_cublas": dec["median_ms"]}
        if "median_ms" in fz and (fz.get("accuracy") or {}).get("passed"):
            times[PALETTE_GEMM] = fz["median_ms"]
        for key, path, _, same in LAYOUTS:
            lay = r.get(key) or {}
            if "median_ms" in lay and (lay.get("accuracy") or {}).get("passed") and (
                    lay.get("same_bits_as_palette_fused") or not same):
                times[path] = lay["median_ms"]
        table.record(device_name, r["N"], r["K"], "palette", r["M"], times)
        # The tile-major timings, where the run has their own decode + cuBLAS baseline.
        dec_t = r.get("palette_tiled_decode_cublas") or {}
        if "median_ms" in dec_t:
            times = {"decode_cublas": dec_t["median_ms"]}
            for key, path, ref, _ in TILED:
                lay = r.get(key) or {}
                if "median_ms" in lay and lay.get("same_bits_as_file_order") and ref in table.entries.get(
                        entry_key(device_name, r["N"], r["K"], "palette", bucket(r["M"])), {}).get("times_ms", {}):
                    times[path] = lay["median_ms"]
            table.record(device_name, r["N"], r["K"], "palette:tiled", r["M"], times)
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=bu.shapes_arg, default=None,
                    help="NxK,... (default: Llama-3.1-8B's o, qkv, mlp up, mlp down, lm_head)")
    ap.add_argument("--batches", nargs="+", type=bu.positive_int, default=list(bu.BATCHES))
    ap.add_argument("--encodings", nargs="+", default=["palette", "huffman"], choices=["palette", "huffman"])
    ap.add_argument("--runs", type=bu.positive_int, default=25, help="timed graph replays per variant (>= 20)")
    ap.add_argument("--budget", type=bu.positive_float, default=900.0, help="seconds; what would not fit is skipped")
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/kernels-<date>-<gpu>-<commit>.json)")
    ap.add_argument("--write-cache", nargs="?", const="", default=None, metavar="PATH",
                    help="record the dispatch choices in the user's tuning cache (or PATH)")
    ap.add_argument("--write-defaults", action="store_true",
                    help="record the dispatch choices in unweight/runtime/tuning_defaults.json")
    ap.add_argument("--from-json", metavar="RESULT", help="take the timings from a recorded run (no GPU)")
    args = ap.parse_args(argv)
    if args.from_json:
        return _from_json(args)
    out = bu.writable_path(args.out, "bench_kernels") if args.out else None
    torch = bu.require_gpu()
    out = out or bu.result_path("kernels", bu.machine_tag(torch.cuda.get_device_name(0)))
    with torch.no_grad():
        res = run(torch, args.shapes or bu.parse_shapes(None), bu.Budget(args.budget), args.batches, args.encodings,
                  args.runs, out)
    measured = res.pop("_table")
    table = []
    for r in res["rows"]:
        if "cublas" not in r:
            continue
        row = {"shape": r["shape"], "M": r["M"], "cublas_us": round(r["cublas"]["median_ms"] * 1e3, 1)}
        for e in args.encodings:
            row[f"{e[:3]}_fused"] = _ratio(r.get(e + "_fused"))
            row[f"{e[:3]}_dec+cublas"] = _ratio(r.get(e + "_decode_cublas"))
            row[f"{e[:3]}_auto"] = r.get(e + "_auto", {}).get("choice", "-")
        table.append(row)
    bu.print_table(table, list(table[0]) if table else ["shape"])
    print("wrote", bu.write_json(out, res))
    env = res["environment"]
    if bu.nothing_measured("bench_kernels", res, out):
        return 1  # no timing: nothing to record in a tuning table either
    return _write_tables(args, measured, bu.tuning_stamp(env, "bench_kernels"))


def _write_tables(args, measured, stamp: str) -> int:
    """Record `measured` in the user's cache (--write-cache) and/or the shipped defaults."""
    return bu.write_tuning(measured, args.write_cache, args.write_defaults, stamp, "bench_kernels")


def _from_json(args) -> int:
    doc = bu.read_result(args.from_json, "bench_kernels")
    if doc is None:
        return 2
    if not isinstance(doc, dict):
        print(f"{args.from_json}: no kernel rows or GPU name in it", file=sys.stderr)
        return 2
    kern = (doc.get("raw") or {}).get("kernels") or doc  # a gpu_check bench stage, or this script's own
    env = doc.get("env") or doc.get("environment") or {}
    gpu = env.get("gpu")
    if not gpu or not kern.get("rows"):
        print(f"{args.from_json}: no kernel rows or GPU name in it", file=sys.stderr)
        return 2
    measured = table_from_rows(kern["rows"], gpu, kern.get("encodings") or ("palette", "huffman"))
    for key, e in sorted(measured.entries.items()):
        print(f"{key}: {e['choice']} (M={e['M']})")
    for n, k in sorted({(int(r["N"]), int(r["K"])) for r in kern["rows"] if "palette_tiled_decode_cublas" in r}):
        print(f"{gpu}|{n}|{k}|palette plane order: {measured.plane_order(gpu, n, k)}")
    # A gpu_check bench stage holds the decode benchmark of the same run: its decoder choices too.
    import bench_decode
    dec = (doc.get("raw") or {}).get("decode") or {}
    if dec.get("rows"):
        decoders = bench_decode.decoders_from_rows(dec["rows"], gpu, dec.get("default_decoders"))
        bench_decode.print_choices(decoders)
        measured.update(decoders)
    return _write_tables(args, measured, bu.tuning_stamp(env, "bench_kernels", args.from_json, doc.get("started")))


if __name__ == "__main__":
    sys.exit(main())
