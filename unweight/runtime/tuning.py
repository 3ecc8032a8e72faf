"""Measured dispatch between the fused decompress-in-matmul kernels and decode + cuBLAS.

The choice for a compressed linear is looked up per forward under the key

    (device name, N, K, encoding, batch bucket)  ->  "decode_cublas" | "palette_gemm" | "huffman_gemm"

with N, K the weight's [N, K] shape, encoding "huffman" / "palette", and the batch bucket of
M = x.numel() // K one of BUCKETS ("1", "2-4", "5-16", "17-64", "65-256", ">256").

Rules (the issue's contract):
  * a fused path is chosen only from measurements, and only when it was strictly faster than
    decode + cuBLAS timed in the same run (``choose``); the lookup re-applies that rule to
    the recorded times, so a hand-edited or stale entry can never select a slower path;
  * no measurement for the device / shape / bucket -> decode + cuBLAS;
  * CPU tensors never reach the fused kernels (``fused_linear`` returns None), so CPU
    forwards stay decode + F.linear bit for bit.

Where the measurements live:
  * shipped defaults: ``unweight/runtime/tuning_defaults.json``, written by
    ``scripts/bench_kernels.py --write-defaults`` from a benchmark run;
  * the user's tuning cache: ``$UNWEIGHT_TUNING_CACHE`` or ``~/.cache/unweight/tuning.json``,
    written by ``tune()`` (or ``bench_kernels.py --write-cache``); its entries override the
    shipped ones key by key.

File format (both files)::

    {"schema": 1, "comment": "...",
     "entries": {"<device>|<N>|<K>|<encoding>|<bucket>":
                 {"M": 16, "choice": "palette_gemm",
                  "times_ms": {"decode_cublas": 0.031, "palette_gemm": 0.019}}}}

``fused_linear`` is registered with ``dispatch.register_linear_impl`` (behind the
caller-registered impls) when ``unweight.runtime.dispatch`` is imported.
"""
from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from typing import Iterable

log = logging.getLogger(__name__)

SCHEMA = 1
DECODE_CUBLAS = "decode_cublas"
PALETTE_GEMM = "palette_gemm"
HUFFMAN_GEMM = "huffman_gemm"
CHOICES = (DECODE_CUBLAS, PALETTE_GEMM, HUFFMAN_GEMM)

# (upper bound inclusive, name); the last bucket is open-ended.
_BUCKET_BOUNDS = ((1, "1"), (4, "2-4"), (16, "5-16"), (64, "17-64"), (256, "65-256"))
BUCKETS = tuple(name for _, name in _BUCKET_BOUNDS) + (">256",)
# The batch a bucket is measured at: its upper end (the slowest case a bucket must cover for
# the memory-bound fused kernels), 512 for the open bucket.
BUCKET_BATCH = {"1": 1, "2-4": 4, "5-16": 16, "17-64": 64, "65-256": 256, ">256": 512}

ENV_CACHE = "UNWEIGHT_TUNING_CACHE"
DEFAULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_defaults.json")
NO_MEASUREMENT_COMMENT = ("Shipped dispatch defaults, written by scripts/bench_kernels.py --write-defaults. "
                          "No GPU measurement exists yet, so there are no entries and every (device, shape, "
                          "batch) runs decode + cuBLAS.")


def bucket(M: int) -> str:
    """Batch bucket of M rows (M >= 1; M <= 0 maps to "1", an empty batch costs nothing)."""
    for hi, name in _BUCKET_BOUNDS:
        if M <= hi:
            return name
    return BUCKETS[-1]


def default_cache_path() -> str:
    """The user's tuning cache: $UNWEIGHT_TUNING_CACHE, else ~/.cache/unweight/tuning.json."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return os.path.expanduser(env)
    return os.path.join(os.path.expanduser("~"), ".cache", "unweight", "tuning.json")


def _finite(t) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0


def choose(times_ms: dict) -> str:
    """The path to run from times measured in one run: the fastest fused path that is strictly
    faster than decode_cublas; decode_cublas when it was not measured (or not validly)."""
    base = times_ms.get(DECODE_CUBLAS)
    if not _finite(base):
        return DECODE_CUBLAS
    best, best_t = DECODE_CUBLAS, base
    for name in (PALETTE_GEMM, HUFFMAN_GEMM):  # fixed order: ties keep the earlier one
        t = times_ms.get(name)
        if _finite(t) and t < best_t:
            best, best_t = name, t
    return best


def candidates(encoding: str, M: int, K: int, cols_per_chunk: int) -> list[str]:
    """Fused paths that can run y = x @ W^T for this encoding and problem (besides decode_cublas)."""
    from . import kernel_plan as kp
    if encoding == "palette" and kp.gemm_supported(M, K):
        return [PALETTE_GEMM]
    if encoding == "huffman" and kp.huffman_gemm_supported(M, K, cols_per_chunk):
        return [HUFFMAN_GEMM]
    return []


def entry_key(device: str, N: int, K: int, encoding: str, bucket_name: str) -> str:
    return f"{device}|{int(N)}|{int(K)}|{encoding}|{bucket_name}"


class TuningTable:
    """The dispatch table: entries keyed by entry_key(), each {"M", "choice", "times_ms"}."""

    def __init__(self, entries: dict | None = None, comment: str = ""):
        self.entries: dict = dict(entries or {})
        self.comment = comment

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str) -> "TuningTable":
        """Read a table file; a missing file is an empty table, an unreadable one is logged and
        ignored (a broken cache must never break inference; it only loses the fused paths)."""
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            log.warning("unweight: ignoring unreadable tuning file %s (%s)", path, e)
            return cls()
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("entries", {}), dict):
            log.warning("unweight: ignoring tuning file %s (not schema %d)", path, SCHEMA)
            return cls()
        entries = {k: v for k, v in doc.get("entries", {}).items()
                   if isinstance(v, dict) and isinstance(v.get("times_ms"), dict)}
        return cls(entries, str(doc.get("comment", "")))

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "comment": self.comment, "entries": dict(sorted(self.entries.items()))}

    def save(self, path: str) -> str:
        """Write atomically (temp file + rename), creating the folder.  Returns the path."""
        path = os.path.expanduser(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    # ------------------------------------------------------------------ entries
    def record(self, device: str, N: int, K: int, encoding: str, M: int, times_ms: dict) -> str:
        """Store the times measured at batch M (into M's bucket) and return the choice they give."""
        times = {k: float(v) for k, v in times_ms.items() if k in CHOICES and _finite(v)}
        choice = choose(times)
        self.entries[entry_key(device, N, K, encoding, bucket(M))] = {"M": int(M), "choice": choice,
                                                                       "times_ms": times}
        return choice

    def lookup(self, device: str, N: int, K: int, encoding: str, M: int) -> str:
        """The path for a forward with M rows; decode_cublas when nothing was measured."""
        e = self.entries.get(entry_key(device, N, K, encoding, bucket(M)))
        if e is None:
            return DECODE_CUBLAS
        # Re-derived from the times, not read from e["choice"]: only a recorded win counts.
        return choose(e["times_ms"])

    def update(self, other: "TuningTable") -> "TuningTable":
        """Overlay other's entries on this table (other wins key by key).  Returns self."""
        self.entries.update(other.entries)
        return self


# ---------------------------------------------------------------------- process-wide table
_STATE: dict = {}


def table() -> TuningTable:
    """Shipped defaults overlaid with the user's cache (read once per process; reset() re-reads)."""
    t = _STATE.get("table")
    if t is None:
        t = TuningTable.load(DEFAULTS_PATH).update(TuningTable.load(default_cache_path()))
        _STATE["table"] = t
    return t


def reset():
    """Forget the loaded table and cached device names (after writing a cache, in tests)."""
    _STATE.clear()


def device_name(device) -> str:
    """torch.cuda.get_device_name of a CUDA device (cached per index; the dispatch key)."""
    import torch
    d = torch.device(device)
    idx = torch.cuda.current_device() if d.index is None else d.index
    names = _STATE.setdefault("names", {})
    n = names.get(idx)
    if n is None:
        n = names[idx] = torch.cuda.get_device_name(idx)
    return n


# ---------------------------------------------------------------------- dispatch hook
def fused_linear(m, x):
    """register_linear_impl hook: run a fused kernel when the table says it is faster here.

    m: CompressedLinear; x: [..., K].  Returns y [..., N] (bf16) or None (decode + cuBLAS, and
    always None off CUDA, for non-bf16 inputs, and for batches no fused kernel takes).
    """
    if x.device.type != "cuda":
        return None
    import torch
    if x.dtype != torch.bfloat16:
        return None
    K = m.n_cols
    M = x.numel() // K if K else 0
    if M < 1 or M > 16:  # no fused kernel above 16 rows: skip the lookup
        return None
    choice = table().lookup(device_name(x.device), m.n_rows, K, m.encoding_name, M)
    if choice == DECODE_CUBLAS:
        return None
    from .. import ops
    from ..format import constants as C
    from . import cuda_ops, dispatch
    from . import kernel_plan as kp
    if ops.cuda_module() is None:
        return None
    x2 = x.reshape(M, K)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    hdr, planes = m.owner().header, m.planes()
    if choice == PALETTE_GEMM and m.encoding == C.ENC_PALETTE and kp.gemm_supported(M, K):
        if x2.stride(0) % 8 or x2.data_ptr() % 16:
            x2 = x2.clone(memory_format=torch.contiguous_format)  # fresh, aligned: the kernel's 16-byte x loads
        y = cuda_ops.palette_gemm(x2, hdr, planes)
    elif choice == HUFFMAN_GEMM and m.encoding == C.ENC_HUFFMAN and m.lut().numel() and kp.hgemm_mtile(M):
        y = cuda_ops.huffman_gemm(x2, hdr, planes, lut=m.lut(), err=dispatch.error_counter(x.device))
    else:
        return None
    if m.bias is not None:
        y = y + m.bias.to(y.dtype)
    return y.view(*x.shape[:-1], m.n_rows)


# ---------------------------------------------------------------------- measurement
def time_cuda(fn, warmup: int = 5, iters: int = 50) -> float:
    """Median milliseconds of fn() over `iters` runs after `warmup`, each between CUDA events."""
    import torch
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


def _synthetic_module(N: int, K: int, encoding: str, device, seed: int = 0):
    """A CompressedLinear of trained-like N(0, 0.02) bf16 weights on `device` (LUT built)."""
    import numpy as np
    import torch

    from ..codec import tensor_codec as tc
    from . import loader
    from .modules import CompressedLinear
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal((N, K), dtype=np.float32) * 0.02).view(np.uint32)
    w = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
    enc = tc.encode(w, encoding)
    m = CompressedLinear(enc.header, device=torch.device(device), planes=enc.planes)
    loader._build_lut(m)
    return m


def measure(m, M: int, warmup: int = 5, iters: int = 50) -> dict:
    """Times (ms, CUDA-event medians) of decode_cublas and every fused candidate for module m
    (on CUDA) at batch M, measured back to back in this process.  A candidate whose launch
    fails (e.g. the x chunk exceeds this device's shared memory) is left out."""
    import torch
    import torch.nn.functional as F

    from . import cuda_ops, dispatch
    dev = m.device
    K, N = m.n_cols, m.n_rows
    x = torch.randn((M, K), device=dev).to(torch.bfloat16)
    buf = torch.empty(N * K, dtype=torch.bfloat16, device=dev)
    times = {DECODE_CUBLAS: time_cuda(lambda: F.linear(x, dispatch.decode_into(m, buf)), warmup, iters)}
    hdr, planes = m.owner().header, m.planes()
    err = dispatch.error_counter(dev)
    for cand in candidates(m.encoding_name, M, K, m.cols_per_chunk):
        if cand == PALETTE_GEMM:
            fn = lambda: cuda_ops.palette_gemm(x, hdr, planes)  # noqa: E731
        else:
            fn = lambda: cuda_ops.huffman_gemm(x, hdr, planes, lut=m.lut(), err=err)  # noqa: E731
        try:
            times[cand] = time_cuda(fn, warmup, iters)
        except RuntimeError as e:  # launcher refusal: not a candidate on this device
            log.info("unweight tune: %s skipped for [%d, %d] M=%d: %s", cand, N, K, M, e)
    return times


def tune(module_shapes: Iterable, device="cuda", buckets: Iterable[str] | None = None, warmup: int = 5,
         iters: int = 50, path: str | None = None, save: bool = True) -> TuningTable:
    """Measure and record the dispatch choice for every shape and batch bucket on `device`.

    module_shapes: compressed modules (CompressedLinear, timed with their own planes on
    `device`) and/or (N, K, encoding) tuples (timed on synthetic N(0, 0.02) weights encoded
    with the writer's grid).  buckets: subset of BUCKETS (default: those with a fused
    candidate, "1" .. "5-16"; larger buckets have none and stay decode_cublas unmeasured).
    The table at `path` (default: the user cache) is updated and, with save, written back;
    the process-wide table is re-read afterwards.  Returns the updated table.
    """
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("tune() measures CUDA devices only (CPU always runs decode + F.linear)")
    path = path or default_cache_path()
    tab = TuningTable.load(path)
    if not tab.comment:
        tab.comment = "unweight tuning cache, written by unweight.runtime.tuning.tune()"
    name = device_name(device)
    buckets = list(buckets) if buckets is not None else ["1", "2-4", "5-16"]
    with torch.no_grad():
        for i, item in enumerate(module_shapes):
            if isinstance(item, tuple):
                N, K, enc = item
                m = _synthetic_module(int(N), int(K), enc, device, seed=i)
            else:
                m = item
            for b in buckets:
                M = BUCKET_BATCH[b]
                times = measure(m, M, warmup, iters)
                choice = tab.record(name, m.n_rows, m.n_cols, m.encoding_name, M, times)
                log.info("unweight tune: %s [%d, %d] %s M=%d -> %s %s", name, m.n_rows, m.n_cols,
                         m.encoding_name, M, choice, times)
    if save:
        tab.save(path)
    reset()
    return tab
