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

Order (parts_of): first, over every shape, the paths the dispatch chooses from at batch 1 and
16 (cuBLAS, decode + cuBLAS, the one-tile GEMM, every palette kernel on tile-major planes,
each held to its file-order bits); then the same at the other batches; then the rest (the
file-order copy layouts' times, the switched launch modes, the probes, the sweeps), against a
cuBLAS timed beside them ("cublas_extras").  A budget that runs out leaves the rest out first.

The "auto" entry is the path the measured dispatch (unweight/runtime/tuning_table.py) picks
from these very timings, in the plane order the same table holds the shape in.  --write-cache
records the choices in the user's tuning cache ($UNWEIGHT_TUNING_CACHE or
~/.cache/unweight/tuning.json, or PATH); --write-defaults in the shipped
unweight/runtime/tuning_defaults.json (entries of other devices are kept).  --from-json
rebuilds those choices from a recorded run instead of measuring (a result JSON of this script,
or a bench stage JSON of scripts/gpu_check.py, whose raw.kernels it reads, and whose raw.decode
gives the decoder choices as scripts/bench_decode.py records them): the same rule, from the
same timings, a fused time counted only where its accuracy check passed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

# The parts of the kernel benchmark, in the order run() takes each over every shape before the
# next: the dispatch's candidates at the batches the goals name (HEADLINE_BATCHES), the same at
# the other batches, then the rest ("extras").  A run cut short by its budget has then measured
# what the goals and the tuning table ask for on every shape it could, before any sweep or
# switched launch mode of the first shape.
HEADLINE_BATCHES = (1, 16)
PART_NAMES = ("headline", "buckets", "extras")


def parts_of(batches) -> list:
    """[(part name, core: whether it times the dispatch's candidates, batches)] of a run at
    `batches`, the empty ones left out."""
    head = [m for m in batches if m in HEADLINE_BATCHES]
    rest = [m for m in batches if m not in HEADLINE_BATCHES]
    return [(n, core, bs) for n, core, bs in (("headline", True, head), ("buckets", True, rest),
                                               ("extras", False, list(batches))) if bs]


class _Inputs:
    """One shape's inputs on the device: W (bf16 [N, K], the same seed in every part), its dense
    copies for cuBLAS and each encoding's copies as the GPU loaders hold them, rotating over >=
    4x the L2; the tile-major, split and writer-order palette copies are made by the first batch
    that times them."""

    def __init__(self, torch, h, N, K, encodings, l2):
        from unweight.codec import tensor_codec as tc
        from unweight.format import constants as C
        from unweight.runtime import scratch
        dev = bu.device(torch)
        self.N, self.K = N, K
        self.err = torch.zeros(1, dtype=torch.int32, device=dev)
        self.w = bu.bf16_weights(torch, N, K, seed=N + K)
        w_bits = h.bits(self.w)
        self.dense = [self.w] + [self.w.clone() for _ in range(bu.rotation_copies(N * K * 2, l2) - 1)]
        self.copies, self.encs = {}, {}
        for e in encodings:
            enc = self.encs[e] = tc.encode(w_bits, e)
            if e == "huffman":  # as the GPU loaders hold it: with the checkpoint index (prepare._add_index)
                enc = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
            ew = bu.as_gpu_loaders_hold(h.encoded_weight(enc, dev, self.err))
            self.copies[e] = [ew] + [bu.clone_encoded(ew)
                                     for _ in range(bu.rotation_copies(bu.encoded_bytes(ew), l2) - 1)]
        scratch.reserve(dev, N * K)
        self.tiled = []  # tile-major copies of the palette weights
        self.split = []  # their planes in the split layout (ops.split_palette_planes), where the palette allows
        self.writer = []  # tile-major in the writer's palette order (WRITER_ORDER_BATCHES)

    def tiled_copies(self):
        self.tiled = self.tiled or [bu.clone_encoded(q, tiled=True) for q in self.copies["palette"]]
        return self.tiled


def bench_shape(torch, name, N, K, batches, encodings, runs, l2, budget, dev_name, log, skip=(), core=True,
                rows=None, skipped=None):
    """One part of a shape's benchmark at `batches`; returns its rows (dicts, one per batch).
    core: cuBLAS, decode + cuBLAS of each encoding, the one-tile fused kernel, and the palette
    kernels on tile-major copies (with decode + cuBLAS on the same copies), each held to the
    bits of its file-order run; the file-order copy layouts are run for their accuracy and bits
    (what the tile-major rows and the tuning table are held to) but not timed.  Otherwise the
    rest, into the rows `rows` ({M: row}) the core parts made: see _extras.  A batch the budget
    leaves no time for gets a "skipped" row (core) or an entry in `skipped` (the rest)."""
    h = bu.import_helpers()
    # (the rest times palette kernels only: no other encoding is encoded for it)
    inp = _Inputs(torch, h, N, K, encodings if core else [e for e in encodings if e == "palette"], l2)
    dev = bu.device(torch)
    out = []
    for M in batches:
        r = {"shape": name, "N": N, "K": K, "M": M} if core else (rows or {}).get(M)
        if r is None:
            continue  # (the rest of a batch whose candidates were not timed)
        if budget.left() < 3 + 2e-9 * N * K * (1 + 2 * len(encodings)):
            why = f"{budget.left():.0f} s left"
            if core:
                out.append({**r, "skipped": why})
            elif skipped is not None:
                skipped.append({"shape": name, "M": M, "part": "extras", "why": why})
            continue
        x = torch.randn((M, K), device=dev).to(torch.bfloat16)
        errors_before = int(inp.err.item())
        if core:
            _core(torch, h, inp, r, x, runs, skip)
        else:
            _extras(torch, h, inp, r, x, runs, budget, skip, log)
        r["device_errors"] = r.get("device_errors", 0) + int(inp.err.item()) - errors_before
        out.append(r)
        if core:
            log(f"kernels {name} M={M}: cuBLAS {r['cublas']['median_ms'] * 1e3:.1f} us; " + "; ".join(
                f"{e} fused {_ratio(r.get(e + '_fused'))}, decode+cuBLAS {_ratio(r.get(e + '_decode_cublas'))}"
                for e in inp.copies) + "".join(f"; {key.replace('_', ' ')} {_ratio(r[key])}"
                                               for key, *_ in TILED if key in r))
        else:
            log(f"kernels {name} M={M} (the rest): cuBLAS {r['cublas_extras']['median_ms'] * 1e3:.1f} us" + "".join(
                f"; {key.replace('_', ' ')} {_ratio(r[key])}" for key, *_ in LAYOUTS + WRITER_ROW + PDL_KEYS
                + SPLIT_ROW if "median_ms" in (r.get(key) or {}) or "error" in (r.get(key) or {})))
    del inp
    bu.empty_cache(torch)
    return out


def _core(torch, h, inp, r, x, runs, skip) -> None:
    """The dispatch's candidates at batch x.size(0) into row r (see bench_shape)."""
    import torch.nn.functional as F

    from unweight.runtime import dispatch
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.policy import GEMV_PATHS, DispatchPolicy
    N, K, M = inp.N, inp.K, x.size(0)
    baseline = DispatchPolicy(None)
    if "palette" in inp.copies:  # the palette order the rows ran with (the loaders': paired where it can)
        r["palette"] = list(inp.copies["palette"][0].palette)
    t = bu.graph_time(torch, [lambda d=d: F.linear(x, d) for d in inp.dense], runs=runs)
    r["cublas"] = {**t, "weight_GBps": N * K * 2 / (t["median_ms"] * 1e-3) / 1e9}
    t_cublas = t["median_ms"]
    for e, ws in inp.copies.items():
        t = bu.graph_time(torch, [lambda q=q: dispatch.linear([q], x, None, N, K, baseline) for q in ws], runs=runs)
        r[f"{e}_decode_cublas"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas}
        try:
            acc = h.fused_vs_cublas(ws[0], x, inp.w, inp.err)
        except (ValueError, RuntimeError) as ex:  # no such kernel, or it refused this problem
            r[f"{e}_fused"] = {"refused": f"{type(ex).__name__}: {ex}"}
        else:
            try:
                t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x) for q in ws], runs=runs)
                r[f"{e}_fused"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "accuracy": acc,
                                   "weight_GBps": bu.encoded_bytes(ws[0]) / (t["median_ms"] * 1e-3) / 1e9}
            except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
                r[f"{e}_fused"] = {"error": f"{type(ex).__name__}: {ex}", "accuracy": acc}
        if e != "palette":
            continue
        # The other copy layouts in file order: accuracy and bits only (timed by _extras).
        y_one = None  # the one-tile kernel's result, computed once for the bit comparisons
        for key, path, tag, same in LAYOUTS:
            gemm = path not in GEMV_PATHS
            if tag in skip or not (gemm or kp.pgemv_supported(M, K, GEMV_PATHS[path])):
                continue
            if gemm and y_one is None:
                try:
                    y_one = h.fused_op(ws[0], x).view(torch.int16)
                except Exception as ex:  # noqa: BLE001 - the one-tile GEMM refused this batch
                    y_one = f"the one-tile GEMM for its bits: {type(ex).__name__}: {ex}"
            if gemm and isinstance(y_one, str):
                r[key] = {"error": y_one}
                continue
            _check_layout(torch, h, ws, x, inp, r, key, path, y_one if gemm else None)
        if "tiled" in skip or not kp.pal_tiled_ok(N, K):
            continue
        tiled = inp.tiled_copies()
        t = bu.graph_time(torch, [lambda q=q: dispatch.linear([q], x, None, N, K, baseline) for q in tiled],
                          runs=runs)
        r["palette_tiled_decode_cublas"] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas}
        for key, path, ref, tag in TILED:
            if file_order_passed(r, ref) and tag not in skip:
                _time_tiled(torch, h, ws, tiled, x, t_cublas, runs, r, key, path, ref)


def _check_layout(torch, h, ws, x, inp, r, key, path, y_one) -> None:
    """Runs the palette kernel `path` on the file-order planes for its accuracy against cuBLAS
    and, given the one-tile kernel's result y_one (int16 view), whether it gave those bits: r[key]
    (its time comes from _extras)."""
    try:
        acc = h.fused_vs_cublas(ws[0], x, inp.w, inp.err, path)
        same = y_one is None or bool(torch.equal(h.fused_op(ws[0], x, None, path).view(torch.int16), y_one))
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r[key] = {"error": f"{type(ex).__name__}: {ex}"}
        return
    r[key] = {"accuracy": acc, **({"same_bits_as_palette_fused": same} if y_one is not None else {})}


def file_order_passed(r: dict, path: str) -> bool:
    """Whether row r's file-order run of the palette path `path` passed its accuracy check and,
    where LAYOUTS requires it, gave the one-tile kernel's bits: the condition for a tile-major
    time of the same kernel to count."""
    e = r.get(_file_order_key(path)) or {}
    needs_same = any(p == path and same for _, p, _, same in LAYOUTS)
    return bool((e.get("accuracy") or {}).get("passed")) and (e.get("same_bits_as_palette_fused", True)
                                                              or not needs_same)


def _extras(torch, h, inp, r, x, runs, budget, skip, log) -> None:
    """The rest of row r at batch x.size(0), against a cuBLAS timing of its own
    (r["cublas_extras"]); a ratio between two of these rows is of timings made side by side.
    In this order: the tile-major tensor-core GEMV in the writer's palette order, the switched
    launch modes, the probes and the split layout (each against the kernel it varies, timed
    again here); the file-order copy layouts' times (into their rows, which _core checked); at
    batch 1, the sweeps.  Rows of the palette encoding only."""
    import torch.nn.functional as F
    if "palette" not in inp.copies:
        return
    ws, M = inp.copies["palette"], x.size(0)
    t = bu.graph_time(torch, [lambda d=d: F.linear(x, d) for d in inp.dense], runs=runs)
    r["cublas_extras"] = t
    t_cublas = t["median_ms"]
    tiled = inp.tiled_copies() if "palette_tiled_decode_cublas" in r else []
    if tiled:
        fresh = {}  # tile-major rows timed again here, for the ratios below

        def base_ms(key: str, path: str):
            if key not in fresh and "median_ms" in (r.get(key) or {}):
                fresh[key] = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in tiled],
                                           runs=runs)["median_ms"]
            return fresh.get(key)

        enc = inp.encs["palette"]
        if (M in WRITER_ORDER_BATCHES and base_ms("palette_gemv_mma_tiled", "palette_gemv_mma")
                and list(enc.header.palette[: enc.header.pal_size]) != list(ws[0].palette)):
            inp.writer = inp.writer or [bu.clone_encoded(h.encoded_weight(enc, x.device, inp.err), tiled=True)
                                        for _ in ws]
            key = "palette_gemv_mma_tiled_writer_order"
            _time_tiled(torch, h, ws, inp.writer, x, t_cublas, runs, r, key, "palette_gemv_mma", "palette_gemv_mma")
            if "median_ms" in r[key]:
                r[key]["time_vs_paired"] = r[key]["median_ms"] / fresh["palette_gemv_mma_tiled"]
        if M in PDL_BATCHES and "gemv:pdl" not in skip:
            _time_switched(torch, h, tiled, x, t_cublas, runs, r, PDL_ROWS, h.programmatic, "_pdl", "no_pdl")
        if M in PDL_WG_BATCHES and "gemm:wg" not in skip:
            _time_switched(torch, h, tiled, x, t_cublas, runs, r, PDL_WG_ROWS, h.programmatic, "_pdl", "no_pdl")
            _time_switched(torch, h, tiled, x, t_cublas, runs, r, WG_TILE_WAIT_ROWS, h.wgmma_tile_wait,
                           "_tile_wait", "step")
        if M in X_PREFETCH_BATCHES:
            _time_switched(torch, h, tiled, x, t_cublas, runs, r, X_PREFETCH_ROWS,
                           lambda on: h.gemv_x_prefetch(not on), "_no_x_prefetch", "x_prefetch")
        if M in PROBE_BATCHES and "gemv:probe" not in skip and base_ms("palette_gemv_mma_tiled", "palette_gemv_mma"):
            _time_probes(torch, tiled, x, runs, r, fresh["palette_gemv_mma_tiled"], log)
        if M in SPLIT_BATCHES and "gemv:mma_split" not in skip and base_ms("palette_gemv_mma_tiled",
                                                                           "palette_gemv_mma"):
            _time_split(torch, tiled, inp.split, x, t_cublas, runs, r, fresh["palette_gemv_mma_tiled"])
    for key, path, _, _ in LAYOUTS:
        if key in r and "accuracy" in r[key] and "median_ms" not in r[key]:
            _time_layout(torch, h, ws, x, t_cublas, runs, r, key, path)
    if M in SPLIT_SWEEP_BATCHES and budget.left() > 30:
        r["palette_split_sweep"] = _split_sweep(torch, ws, x, runs, t_cublas, wide="gemm:wide" not in skip)
    if M == 1 and budget.left() > 30:
        r["palette_gemv_parts_sweep"] = _gemv_parts_sweep(torch, ws, x, runs, t_cublas, skip)
        if "gemv:mma_queue" not in skip:
            r["palette_gemv_queue_sweep"] = _queue_units_sweep(torch, ws, tiled, x, runs, t_cublas)


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


def _time_switched(torch, h, tiled, x, t_cublas, runs, r, rows, switch, suffix, ref) -> None:
    """Each (row, path) of `rows` that the core part timed, run with the process-wide `switch`
    off and on, side by side, into r[row + suffix]: its bits against the launch with it off
    (same_bits_as_<ref>), that launch's time (<ref>_ms) and the time against it (time_vs_<ref>).
    PDL_ROWS and PDL_WG_ROWS with h.programmatic ("_pdl", "no_pdl"); WG_TILE_WAIT_ROWS with
    h.wgmma_tile_wait ("_tile_wait", "step"); X_PREFETCH_ROWS with the L1 prefetch of x turned
    off ("_no_x_prefetch", "x_prefetch")."""
    for key, path in rows:
        if "median_ms" not in r.get(key, {}):
            continue
        calls = [lambda q=q: h.fused_op(q, x, None, path) for q in tiled]
        try:
            with switch(False):
                want = h.fused_op(tiled[0], x, None, path).view(torch.int16)
                t_off = bu.graph_time(torch, calls, runs=runs)["median_ms"]
            with switch(True):
                same = bool(torch.equal(h.fused_op(tiled[0], x, None, path).view(torch.int16), want))
                t = bu.graph_time(torch, calls, runs=runs)
        except Exception as ex:  # noqa: BLE001 - a failing launch mode is a finding
            r[key + suffix] = {"error": f"{type(ex).__name__}: {ex}"}
            continue
        r[key + suffix] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, f"same_bits_as_{ref}": same,
                           f"{ref}_ms": t_off, f"time_vs_{ref}": t["median_ms"] / t_off}


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


def _time_probes(torch, tiled, x, runs, r, full_ms: float, log) -> None:
    """Times the probes on the tile-major copies into r["palette_gemv_mma_tiled_probe"], each as
    a share of full_ms (the full kernel timed beside them)."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    if not hasattr(ops, "palette_gemv_probe"):
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
    out = {"full_ms": full_ms, "parts": parts, "verbatim_blocks": int(w0.vpos.numel())}
    for name, call in calls.items():
        try:
            t = bu.graph_time(torch, [lambda q=q: call(q) for q in tiled], runs=runs)
        except Exception as ex:  # noqa: BLE001 - a refused probe is a finding
            out[name] = {"error": f"{type(ex).__name__}: {ex}"}
            continue
        out[name] = {**t, "share_of_full": t["median_ms"] / full_ms}
    r["palette_gemv_mma_tiled_probe"] = out
    shares = (f"{k} {out[k]['share_of_full']:.2f}" if "share_of_full" in out[k] else f"{k} error" for k in calls)
    log(f"kernels {w0.rows}x{w0.cols} M={x.size(0)}: tensor-core GEMV {full_ms * 1e3:.1f} us; "
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


def _time_split(torch, tiled, split, x, t_cublas, runs, r, mma_ms: float) -> None:
    """Times the GEMV on the split copies (made into `split` at the first call) into
    r["palette_gemv_mma_split_tiled"], against mma_ms (the kernel on the tile-major planes,
    timed beside it)."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    if not hasattr(kp, "PGEMV_VARIANT_MMA_SPLIT"):
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
                                         "time_vs_mma": t["median_ms"] / mma_ms}


def _time_tiled(torch, h, ws, tiled, x, t_cublas, runs, r, key, path, ref) -> None:
    """Times `path` on the tile-major copies into r[key], with whether it gave the bits of the
    file-order run of `ref` (`path` itself where it runs in file order) and, where that run is
    timed, its time against it (time_vs_file_order: of the two times against cuBLAS, each
    against the cuBLAS timed beside it)."""
    try:
        want = h.fused_op(ws[0], x, None, ref).view(torch.int16)
        same = bool(torch.equal(h.fused_op(tiled[0], x, None, path).view(torch.int16), want))
        t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in tiled], runs=runs)
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r[key] = {"error": f"{type(ex).__name__}: {ex}"}
        return
    r[key] = {**t, "time_vs_cublas": t["median_ms"] / t_cublas, "same_bits_as_file_order": same,
              "weight_GBps": bu.encoded_bytes(tiled[0]) / (t["median_ms"] * 1e-3) / 1e9}
    _vs_file_order(r, key, ref)


def _file_order_key(path: str) -> str:
    """The row key of the palette path `path` run on the file-order planes."""
    from unweight.runtime.tuning_table import PALETTE_GEMM
    return "palette_fused" if path == PALETTE_GEMM else next((k for k, p, *_ in LAYOUTS if p == path), "")


def _vs_file_order(r: dict, key: str, ref: str) -> None:
    """r[key]["time_vs_file_order"] where both r[key] and the file-order run of `ref` are timed."""
    base, e = r.get(_file_order_key(ref)) or {}, r.get(key) or {}
    if "time_vs_cublas" in base and "time_vs_cublas" in e:
        e["time_vs_file_order"] = e["time_vs_cublas"] / base["time_vs_cublas"]


def _time_layout(torch, h, ws, x, t_cublas, runs, r, key, path) -> None:
    """Times the palette kernel `path` on the file-order planes into r[key] (which _check_layout
    filled with its accuracy and bits)."""
    try:
        t = bu.graph_time(torch, [lambda q=q: h.fused_op(q, x, None, path) for q in ws], runs=runs)
    except Exception as ex:  # noqa: BLE001 - a failing kernel is a finding
        r[key]["error"] = f"{type(ex).__name__}: {ex}"
        return
    r[key].update({**t, "time_vs_cublas": t["median_ms"] / t_cublas, "part": "extras",
                   "weight_GBps": bu.encoded_bytes(ws[0]) / (t["median_ms"] * 1e-3) / 1e9})
    for tkey, _, ref, _ in TILED:
        if ref == path:
            _vs_file_order(r, tkey, ref)


# Batches at which the fused palette GEMM is timed at other K splits than its plan's
# (palette_split_sweep): batch 1, and 16 and 64, where the dispatch runs the GEMM and its CTAs
# hold 4 and 3 per SM (registers: 112-122 and 152-168 at 2-4 and 8 n-tiles, against 90-106 at
# one), so that a plan that is one wave at batch 1 may be a wave and a fraction there.
SPLIT_SWEEP_BATCHES = (1, 16, 64)
# The splits a sweep times besides the plan's: at batch 1 a doubling ladder at both stage
# widths; at 16 and 64, one-tile stages, the counts between (which the plan rounds to).
SPLIT_LADDER = {1: (1, 2, 4, 8, 16, 32), 16: (2, 3, 4, 6, 8, 12), 64: (2, 3, 4, 6, 8, 12)}


def _split_sweep(torch, ws, x, runs, t_cublas, wide: bool = True) -> dict:
    """The fused palette GEMM at the K splits of SPLIT_LADDER for this batch (and the planned
    one), with one- and (at batch 1) two-tile stages: {"planned": s, "1:<splits>" /
    "2:<splits>": time / cuBLAS time}.  Data for the split heuristic (kernel_plan.pmma_splits),
    not a dispatch choice."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    w0, M = ws[0], x.size(0)
    planned = ops.palette_splits(w0.rows, w0.cols, x.device, M)
    most = min(w0.cols // kp.PMMA_TILE_K, kp.PMMA_MAX_SPLITS)
    ladder = sorted({s for s in (*SPLIT_LADDER.get(M, SPLIT_LADDER[1]), planned) if s <= most})
    work = torch.zeros(max(1, kp.pmma_workspace_elems(M, w0.rows, max(ladder))), dtype=torch.float32,
                       device=x.device)
    cnt = torch.zeros(kp.pmma_counters(w0.rows), dtype=torch.int32, device=x.device)
    out = {"planned": planned}
    for tiles in (1, kp.PMMA_SUB_WIDE) if wide and M == 1 else (1,):
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
    """Kernel benchmark within `budget`: the parts of parts_of(batches), each over every shape
    before the next; a shape that fails is recorded and the next one runs.  Returns the result
    dict (with the measured TuningTable under "_table", not serialized), one row per shape and
    batch, each with "<encoding>_auto": the path the measured dispatch takes (_dispatch_choices).
    skip: {"gemm:wide" | "gemm:xs" | "gemv" | ...: why} leaves that palette kernel out."""
    skip = dict(skip or {})
    l2 = bu.l2_bytes(torch)
    dev_name = bu.device_name(torch)
    parts = parts_of(batches)
    res = {"benchmark": "kernels", "environment": bu.environment(torch), "l2_bytes": l2, "runs": runs,
           "batches": list(batches), "encodings": list(encodings),
           "parts": [{"part": n, "batches": bs} for n, _, bs in parts], "rows": [],
           "skipped": [{"variant": t, "why": why} for t, why in sorted(skip.items())]}
    by, failed = {}, []  # {(shape, M): row}; the rows of shapes whose part failed
    place = {name: i for i, (name, *_) in enumerate(shapes)}

    def save():
        res["rows"] = sorted(list(by.values()) + failed, key=lambda r: (place[r["shape"]], r.get("M", 0)))
        table = _dispatch_choices(res["rows"], dev_name, encodings)
        if out_path:
            bu.write_json(out_path, res)
        return table

    for part, core, bs in parts:
        est = bu.WorkEstimate(5, 1e-8)  # the prior until two shapes are timed, then the part's own rate
        for name, N, K in shapes:
            mine = {M: by[name, M] for M in bs if "cublas" in by.get((name, M), {})}
            if not (core or mine):
                continue  # the rest of a shape none of whose batches were timed
            need = est.need(N * K * len(bs))
            if budget.left() < need:
                res["skipped"].append({"shape": name, "part": part,
                                       "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
                continue
            t0, n_skipped = time.monotonic(), len(res["skipped"])
            try:
                rows = bench_shape(torch, name, N, K, bs, encodings, runs, l2, budget, dev_name, log, skip, core,
                                   mine, res["skipped"])
                by.update(((name, r["M"]), r) for r in rows)
                if not any("skipped" in r for r in rows) and len(res["skipped"]) == n_skipped:
                    est.record(N * K * len(bs), time.monotonic() - t0)  # (a shape cut short says nothing of the rate)
            except Exception as e:  # noqa: BLE001 - a failing shape is a finding; the next one still runs
                failed.append({"shape": name, "N": N, "K": K, "part": part, "error": f"{type(e).__name__}: {e}"})
                bu.sync(torch)
                bu.empty_cache(torch)
            save()
    res["_table"] = save()
    return res


def _row_times(r: dict, tiled: bool) -> dict | None:
    """{path: ms} the dispatch chooses from in row r, for the palette weight in file order or
    tile-major (None where that order's decode + cuBLAS was not timed).  A fused time counts
    where the kernel passed its accuracy check in file order and, tile-major, gave the file-order
    bits.  A time the extras part took is counted as its ratio to the cuBLAS timed beside it
    times the core part's cuBLAS time, so that the times in one entry share one time base."""
    from unweight.runtime.tuning_table import DECODE_CUBLAS, PALETTE_GEMM
    c = (r.get("cublas") or {}).get("median_ms")
    dec = r.get("palette_tiled_decode_cublas" if tiled else "palette_decode_cublas") or {}
    if c is None or "median_ms" not in dec:
        return None

    def ms(e):
        return e["time_vs_cublas"] * c if e.get("part") == "extras" else e["median_ms"]

    times = {DECODE_CUBLAS: dec["median_ms"]}
    if tiled:
        for key, path, ref, _ in TILED:
            e = r.get(key) or {}
            if "median_ms" in e and e.get("same_bits_as_file_order") and file_order_passed(r, ref):
                times[path] = ms(e)
        return times
    for path in [PALETTE_GEMM] + [p for _, p, _, _ in LAYOUTS]:
        e = r.get(_file_order_key(path)) or {}
        if "median_ms" in e and file_order_passed(r, path):
            times[path] = ms(e)
    return times


def _entry_key(path: str, tiled: bool) -> str:
    """The row key of the timing `path` (a dispatch path, or decode_cublas) in either order."""
    from unweight.runtime.tuning_table import DECODE_CUBLAS
    if path == DECODE_CUBLAS:
        return "palette_tiled_decode_cublas" if tiled else "palette_decode_cublas"
    return next((k for k, p, _, _ in TILED if p == path), "") if tiled else _file_order_key(path)


def _dispatch_choices(rows, device_name: str, encodings):
    """Each timed row's "<encoding>_auto": the path the measured dispatch runs at that batch
    ({"choice", "time_vs_cublas"}; palette's also "plane_order", the order
    TuningTable.plane_order holds the shape's weight in under these rows' table).  Returns that
    table (table_from_rows)."""
    from unweight.runtime.tuning_table import DECODE_CUBLAS, choose
    table = table_from_rows(rows, device_name, encodings)
    for r in rows:
        if "cublas" not in r:
            continue
        for e in encodings:
            if e != "palette":  # (no fused kernel to choose)
                if "time_vs_cublas" in (r.get(f"{e}_decode_cublas") or {}):
                    r[f"{e}_auto"] = {"choice": DECODE_CUBLAS,
                                      "time_vs_cublas": r[f"{e}_decode_cublas"]["time_vs_cublas"]}
                continue
            order = table.plane_order(device_name, r["N"], r["K"])
            times = _row_times(r, order == "tiled")
            if times is None:
                continue
            choice = choose(times, "palette:tiled" if order == "tiled" else "palette")
            r["palette_auto"] = {"choice": choice, "plane_order": order,
                                 "time_vs_cublas": r[_entry_key(choice, order == "tiled")]["time_vs_cublas"]}
    return table


def table_from_rows(rows, device_name: str, encodings=("palette", "huffman")):
    """TuningTable of a run's rows (live or recorded): the palette entries in both plane orders
    (_row_times).  Only palette has a fused kernel: for huffman, decode + cuBLAS has nothing to
    choose from, and a missing entry is decode + cuBLAS."""
    from unweight.runtime.tuning_table import TuningTable
    table = TuningTable()
    if "palette" not in encodings:
        return table
    for r in rows:
        for tiled in (False, True):
            times = _row_times(r, tiled)
            if times is not None:
                table.record(device_name, r["N"], r["K"], "palette:tiled" if tiled else "palette", r["M"], times)
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
