"""Measure the dispatch table: fused kernels against decode + cuBLAS on this GPU.

    tune(shapes, device="cuda")   times every shape and batch bucket (a palette weight in both
                                  plane orders) and writes the user's tuning cache
                                  (runtime/tuning_table.py), read by the measured dispatch
                                  policy of models prepared afterwards;
                                  and times each shape's CUDA decoder variants (the same
                                  bits), so the policy decodes with the fastest.

A tool on top of the runtime (it builds modules and runs forwards); nothing in the runtime
imports it.  ``scripts/bench_kernels.py`` uses the same measurements for its tables.
"""
from __future__ import annotations

import logging
import statistics
from typing import Iterable

import numpy as np
import torch

from ..codec import tensor_codec as tc
from ..runtime import dispatch
from ..runtime.modules import CompressedLinear
from ..runtime.policy import DispatchPolicy
from ..runtime.prepare import prepare_module
from ..runtime import kernel_plan as kp
from ..runtime import scratch
from ..runtime.tuning_table import (BUCKET_BATCH, BUCKETS, DECODE_CUBLAS, TuningTable, candidates, decoder_names,
                                    default_cache_path, default_decoder, table_encoding)

log = logging.getLogger(__name__)

_DECODE_ONLY = DispatchPolicy(None)


def time_cuda(fn, warmup: int = 5, iters: int = 50) -> float:
    """Median milliseconds of fn() over `iters` runs after `warmup`, each between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def gaussian_bf16(rows: int, cols: int, seed: int = 0, std: float = 0.02) -> np.ndarray:
    """uint16 [rows, cols] BF16 bit patterns of N(0, std), rounded to nearest even (a
    trained-like weight for benchmarks)."""
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal((rows, cols), dtype=np.float32) * std).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


def synthetic_module(N: int, K: int, encoding: str, device, seed: int = 0) -> CompressedLinear:
    """A CompressedLinear [N, K] of N(0, 0.02) bf16 weights on `device`, ready to run (LUT built)."""
    enc = tc.encode(gaussian_bf16(N, K, seed), encoding)
    m = CompressedLinear(enc.header, device=torch.device(device), planes=enc.planes)
    prepare_module(m)
    return m


def measure(m: CompressedLinear, M: int, warmup: int = 5, iters: int = 50) -> dict:
    """Times (ms, CUDA-event medians) of decode_cublas and every fused candidate for module m
    (on CUDA) at batch M, measured back to back in this process.  A candidate whose launch
    fails (e.g. the x chunk exceeds this device's shared memory) is left out."""
    dev = m.device
    K, N = m.n_cols, m.n_rows
    x = torch.randn((M, K), device=dev).to(torch.bfloat16)
    w = m.encoded()
    times = {DECODE_CUBLAS: time_cuda(lambda: dispatch.linear([w], x, None, N, K, _DECODE_ONLY), warmup, iters)}
    # (a tile-major weight's candidates include the paths that run tile-major only)
    for cand in candidates(table_encoding(m.encoding_name, w.tiled), M, K, m.cols_per_chunk):
        try:
            times[cand] = time_cuda(lambda cand=cand: dispatch.fused(w, x, cand), warmup, iters)
        except RuntimeError as e:  # launcher refusal: not a candidate on this device
            log.info("unweight tune: %s skipped for [%d, %d] M=%d: %s", cand, N, K, M, e)
    return times


def measure_decoders(m: CompressedLinear, warmup: int = 5, iters: int = 50) -> dict:
    """Times (ms, CUDA-event medians) of decoding module m's weight (on CUDA) with each CUDA
    decoder variant of its encoding, back to back in this process: {variant name: ms}.
    Huffman's SCALAR reader (the fallback of shapes the vector readers cannot take) is left
    out; a variant whose launch fails is left out."""
    w = m.encoded()
    enc = m.encoding_name
    buf = scratch.weights(m.device, m.n_rows * m.n_cols)
    times = {}
    for name in decoder_names(enc):
        if enc == "huffman" and kp.HUFF_VARIANTS[name] == kp.HUFF_VARIANT_SCALAR:
            continue
        prev = dispatch.use_decoders(**{enc: name})
        try:
            times[name] = time_cuda(lambda: dispatch.decode_into([w], buf, m.n_rows, m.n_cols), warmup, iters)
        except RuntimeError as e:
            log.info("unweight tune: decoder %s skipped for [%d, %d]: %s", name, m.n_rows, m.n_cols, e)
        finally:
            dispatch.use_decoders(**prev)
    return times


def tune(module_shapes: Iterable, device="cuda", buckets: Iterable[str] | None = None, warmup: int = 5,
         iters: int = 50, path: str | None = None, save: bool = True, decoders: bool = True) -> TuningTable:
    """Measure and record the dispatch choice for every shape and batch bucket on `device`.

    module_shapes: compressed modules (CompressedLinear, timed with their own planes on
    `device`) and/or (N, K, encoding) tuples (timed on synthetic N(0, 0.02) weights encoded
    with the writer's grid).  buckets: subset of BUCKETS (default: every bucket the fused
    palette kernel takes, "1" .. "65-256"; ">256" has no fused candidate and stays
    decode_cublas unmeasured).  decoders: also time each shape's decoder variants (the
    decode of the decode + cuBLAS path; a module's own planes keep their checkpoint interval,
    a synthetic weight gets the one the GPU loaders add).
    The table at `path` (default: the user cache) is updated and, with save, written back;
    models prepared afterwards pick the new entries up.  Returns the updated table.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("tune() measures CUDA devices only (CPU always runs decode + F.linear)")
    path = path or default_cache_path()
    tab = TuningTable.load(path)
    if not tab.comment:
        tab.comment = "unweight tuning cache, written by unweight.tools.tune.tune()"
    name = DispatchPolicy().device_name(device)
    buckets = (list(buckets) if buckets is not None
               else [b for b in BUCKETS if BUCKET_BATCH.get(b, kp.PMMA_MAX_M + 1) <= kp.PMMA_MAX_M])
    with torch.no_grad():
        for i, item in enumerate(module_shapes):
            if isinstance(item, tuple):
                N, K, enc = item
                m = synthetic_module(int(N), int(K), enc, device, seed=i)
            else:
                m = item
            before = m.plane_order
            # A palette weight that can be held tile-major is timed in both orders: the table
            # then also says which order to hold it in (TuningTable.plane_order).
            for order in ("file", "tiled") if m.can_tile() else ("file",):
                m.set_plane_order(order)
                enc = table_encoding(m.encoding_name, order == "tiled")
                for b in buckets:
                    M = BUCKET_BATCH[b]
                    times = measure(m, M, warmup, iters)
                    choice = tab.record(name, m.n_rows, m.n_cols, enc, M, times)
                    log.info("unweight tune: %s [%d, %d] %s M=%d -> %s %s", name, m.n_rows, m.n_cols, enc, M, choice,
                             times)
            m.set_plane_order(before)
            if decoders:
                times = measure_decoders(m, warmup, iters)
                choice = tab.record_decoders(name, m.n_rows, m.n_cols, m.encoding_name, m.encoded().chk_interval,
                                             times, default_decoder(m.encoding_name))
                log.info("unweight tune: %s [%d, %d] %s decoder -> %s %s", name, m.n_rows, m.n_cols,
                         m.encoding_name, choice, times)
    if save:
        tab.save(path)
    return tab
