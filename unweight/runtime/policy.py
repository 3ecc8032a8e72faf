"""Dispatch policy: which path runs a compressed linear, decided per layer and batch bucket.

A policy is an explicit object handed to the compressed modules (runtime/prepare.py sets it)
or to the vLLM adapter, never state registered by an import.  ``DispatchPolicy(None)`` always
decodes into scratch and runs the dense GEMM; ``measured()`` consults the tuning table
(runtime/tuning_table.py) and runs a fused kernel where it was measured faster on this
device, or, for a shape not measured there, where the nearest measured shape's was (by a
margin; ``nearest``), and never one that failed its check on the device
(runtime/selftest.py).  CPU tensors never reach a fused kernel, so CPU forwards stay
decode + F.linear, bit for bit.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from ..format.header import TensorHeader
from . import kernel_plan as kp
from . import scratch
from .tuning_table import (DECODE_CUBLAS, PALETTE_GEMM, PALETTE_GEMM_WIDE, PALETTE_GEMM_XS, PALETTE_GEMM_WG,
                           PALETTE_GEMV, PALETTE_GEMV_DEEP, PALETTE_GEMV_STAGED, PALETTE_GEMV_MMA,
                           PALETTE_GEMV_MMA_STAGED, PALETTE_GEMV_MMA_PREFETCH, PALETTE_GEMV_MMA_BULK,
                           PALETTE_GEMV_MMA_QUEUE, GEMV_PATHS, TILED, TuningTable, bucket, load_table, split_key,
                           table_encoding)
from .weights import EncodedWeight

log = logging.getLogger(__name__)

ENV_NEAREST = "UNWEIGHT_NEAREST_SHAPES"

__all__ = ["DispatchPolicy", "measured", "DECODE_CUBLAS", "PALETTE_GEMM", "PALETTE_GEMM_WIDE", "PALETTE_GEMM_XS",
           "PALETTE_GEMM_WG",
           "PALETTE_GEMV", "PALETTE_GEMV_DEEP", "PALETTE_GEMV_STAGED", "PALETTE_GEMV_MMA", "PALETTE_GEMV_MMA_STAGED",
           "PALETTE_GEMV_MMA_PREFETCH", "PALETTE_GEMV_MMA_BULK", "PALETTE_GEMV_MMA_QUEUE", "GEMV_PATHS"]


class DispatchPolicy:
    """table: measured choices (None: never fused); dense_linear: the GEMM run after a decode,
    fn(x, w, bias) -> y (F.linear by default; vLLM passes its own CPU GEMM so a compressed
    model computes with the same kernel as vLLM's BF16 path); nearest: a palette shape the
    table did not measure on its GPU runs the choice of the nearest measured shape there
    (TuningTable.nearest_choice: a fused path only where it won by EXTRAPOLATE_MARGIN), where
    False runs decode + cuBLAS for it (None: False where UNWEIGHT_NEAREST_SHAPES is 0 / false /
    no, else True)."""

    def __init__(self, table: TuningTable | None = None, dense_linear: Callable | None = None,
                 nearest: bool | None = None):
        self.table = table
        if nearest is None:
            nearest = os.environ.get(ENV_NEAREST, "1").lower() not in ("0", "false", "no")
        self.nearest = nearest
        self._nearest: dict = {}  # (table key, M) -> the path nearest_choice gave
        self.dense_linear = dense_linear or F.linear
        self._names: dict[int, str] = {}
        self._refused: set = set()
        self._decoders: dict[tuple, int] = {}
        self._reported: set = set()  # (device name, N, K) of unmeasured shapes already named
        self._fused_checked: set = set()  # devices whose fused paths runtime/selftest.py checked
        self._faulty: set = set()  # (device, path, tiled, in_stack) that failed that check: never run

    def fused_checked(self, device) -> bool:
        """Whether runtime/selftest.py checked this policy's fused paths on `device`."""
        return scratch.device_key(device) in self._fused_checked

    def mark_fused_checked(self, device) -> None:
        self._fused_checked.add(scratch.device_key(device))

    def mark_faulty(self, device, path: str, tiled: bool, why: str, in_stack: bool = False) -> None:
        """Never run `path` on weights held in that plane order (in_stack: matrices of a 3-D
        expert stack) on `device` (its self-test failed: runtime/selftest.py); one warning."""
        key = (scratch.device_key(device), path, bool(tiled), bool(in_stack))
        if key in self._faulty:
            return
        self._faulty.add(key)
        order = "stack-matrix" if in_stack else "tile-major" if tiled else "file-order"
        msg = (f"unweight: the fused kernel {path} gave wrong results on {torch.device(device)} for {order} planes "
               f"({why}); layers it would run there take decode + cuBLAS, the BF16 model's results")
        warnings.warn(msg, stacklevel=2)
        log.warning(msg)

    def faulty(self, device, path: str, tiled: bool, in_stack: bool = False) -> bool:
        """Whether `path` failed its self-test on `device` for that plane order (mark_faulty)."""
        return bool(self._faulty) and (scratch.device_key(device), path, bool(tiled), bool(in_stack)) in self._faulty

    def device_name(self, device: torch.device) -> str:
        """torch.cuda.get_device_name of a CUDA device (cached per index: the table's key)."""
        idx = device.index if device.index is not None else torch.cuda.current_device()
        n = self._names.get(idx)
        if n is None:
            n = self._names[idx] = torch.cuda.get_device_name(idx)
        return n

    def linear_path(self, w: EncodedWeight, M: int, device: torch.device) -> str:
        """The path for y = x @ W^T with x of M rows on `device`.  Only palette weights have a
        fused kernel, for 1 <= M <= 256 (past that, or for Huffman weights, decode + cuBLAS is
        the design); a palette shape the kernel cannot take (K % 64 != 0) falls back with one
        warning per shape."""
        if (self.table is None or not self.table.entries or device.type != "cuda" or w.is_huffman
                or not 1 <= M <= kp.PMMA_MAX_M):
            return DECODE_CUBLAS
        if not kp.pmma_supported(M, w.cols):
            self._warn_uncovered(w)
            return DECODE_CUBLAS
        key = self._key(w, M, device)
        if key in self._refused:
            return DECODE_CUBLAS
        path = self.table.lookup(*key[:4], M)
        if path == DECODE_CUBLAS and self.nearest:
            path = self._nearest.get((key, M))
            if path is None:
                near = None if self.table.has(*key[:4], M) else self.table.nearest_choice(*key[:4], M)
                path = self._nearest[(key, M)] = near[0] if near is not None else DECODE_CUBLAS
        return DECODE_CUBLAS if self.faulty(device, path, w.tiled, w.in_stack) else path

    def unmeasured(self, w: EncodedWeight, device) -> bool:
        """Whether a palette weight the fused kernels could take has no measurement for its
        device, shape and plane order at batch 1 (a CUDA device): every batch then runs what
        the nearest measured shape chose (with `nearest`) or decode + cuBLAS, the BF16 model's
        bits at a fraction of its speed, until the table holds one (`unweight tune`)."""
        device = torch.device(device)
        if device.type != "cuda" or w.is_huffman or not kp.pmma_supported(1, w.cols):
            return False
        if self.table is None:
            return True
        name, N, K, enc, _ = self._key(w, 1, device)
        return self.table.best_ms(name, N, K, enc, bucket(1)) is None

    def report_unmeasured(self, ws) -> None:
        """One warning per GPU naming the palette matmul shapes among ws ([(EncodedWeight,
        device)]) that unmeasured() flags and no earlier call named."""
        miss = {}
        for w, device in ws:
            if self.unmeasured(w, device):
                name = self.device_name(torch.device(device))
                if (name, w.rows, w.cols) not in self._reported:
                    self._reported.add((name, w.rows, w.cols))
                    miss.setdefault(name, set()).add((w.rows, w.cols))
        for name, shapes in sorted(miss.items()):
            some = ", ".join(f"[{n}x{k}]" for n, k in sorted(shapes)[:4]) + (", ..." if len(shapes) > 4 else "")
            how = ("the fused kernel chosen for the nearest measured shape where it won there, else decode + "
                   "cuBLAS (the BF16 model's results at a fraction of its speed)" if self.nearest else
                   "decode + cuBLAS, the BF16 model's results at a fraction of its speed")
            log.warning("unweight: %d palette matmul shape(s) on %s have no measurement in the tuning table (%s): "
                        "they run %s; `unweight tune PATH` measures them", len(shapes), name, some, how)

    def measured_faster(self, N: int, K: int, M: int, path: str, device) -> bool:
        """Whether the table timed `path` strictly faster than decode + cuBLAS for a file-order
        palette [N, K] weight at batch M on `device`, or, for a shape it did not measure and
        with `nearest`, by EXTRAPOLATE_MARGIN for the nearest measured shape (for callers
        composing the kernel into something else than a linear, e.g. a MoE layer's routed
        experts)."""
        device = torch.device(device)
        if self.table is None or not self.table.entries or device.type != "cuda" or self.faulty(device, path, False):
            return False
        name = self.device_name(device)
        if self.nearest and not self.table.has(name, N, K, "palette", M):
            return self.table.nearest_faster(name, N, K, "palette", M, path)
        return self.table.faster(name, N, K, "palette", M, path)

    def stack_gain(self, rows: list, K: int, device, tiled: bool, M: int = 1) -> float | None:
        """How much faster palette [rows_i, K] weights that read one input run as one stacked
        [sum(rows), K] matrix at batch M on `device` (runtime/siblings.py), by the table: the
        members' time run apart over the stack's (> 1: stacking wins), or None where the stack
        was not measured with a fused path faster than decode + cuBLAS.  A member the table did
        not measure runs decode + cuBLAS: counted as its rows' share of the stack's
        decode + cuBLAS time (a low estimate: a smaller matrix takes more time per row)."""
        device = torch.device(device)
        if self.table is None or not self.table.entries or device.type != "cuda" or not rows:
            return None
        name, enc, b, N = self.device_name(device), table_encoding("palette", tiled), bucket(M), sum(rows)
        stacked = self.table.best_ms(name, N, K, enc, b)
        path = self.table.lookup(name, N, K, enc, M)
        if stacked is None or path == DECODE_CUBLAS or self.faulty(device, path, tiled):
            return None
        base = self.table.best_ms(name, N, K, enc, b, DECODE_CUBLAS)
        if base is None:
            return None
        apart = 0.0
        for n in rows:
            ms = self.table.best_ms(name, n, K, enc, b)
            apart += ms if ms is not None else base * n / N
        return apart / stacked

    def _key(self, w: EncodedWeight, M: int, device: torch.device) -> tuple:
        """(device name, N, K, table encoding, bucket): the table key of w at batch M; a
        tile-major weight is looked up under its own measurements."""
        return (self.device_name(device), w.rows, w.cols, table_encoding(w.encoding_name, w.tiled), bucket(M))

    def plane_order(self, N: int, K: int, device) -> str:
        """The order to hold a palette [N, K] matmul weight's planes in on `device` for
        plane_order="auto": "tiled" where the table measured it faster tile-major there
        (TuningTable.plane_order), or, for a shape it did not time at all and with `nearest`,
        where the nearest shape it timed in both orders was (TuningTable.nearest_order); else
        "file" (always on CPU, where the codec reads file order)."""
        device = torch.device(device)
        if self.table is None or not self.table.entries or device.type != "cuda":
            return "file"
        name = self.device_name(device)
        if not self.nearest or self.table.orders_timed(name, N, K):
            return self.table.plane_order(name, N, K)
        return self.table.nearest_order(name, N, K) or "file"

    def decoder(self, w: EncodedWeight | TensorHeader, device: torch.device) -> int:
        """The CUDA decoder variant for w (a weight or a tensor header: its rows, cols,
        encoding_name and chk_interval) on `device` (0: the extension's default): one the
        table measured faster than the default for this device, shape, encoding and checkpoint
        interval.  Every variant writes the same bits (on either plane order; the decoders are
        measured on file order)."""
        if self.table is None or not self.table.decoders or device.type != "cuda":
            return 0
        idx = device.index if device.index is not None else torch.cuda.current_device()
        key = (idx, w.rows, w.cols, w.encoding_name, w.chk_interval)
        v = self._decoders.get(key)
        if v is None:
            v = self._decoders[key] = self.table.decoder(self.device_name(device), w.rows, w.cols, w.encoding_name,
                                                         w.chk_interval)
        return v

    def _warn_uncovered(self, w: EncodedWeight) -> None:
        self._remember(("uncovered", w.rows, w.cols),
                       f"unweight: no fused kernel covers {w.name or 'a layer'} [{w.rows}x{w.cols}] (the palette GEMM "
                       f"needs in_features % {kp.PMMA_TILE_K} == 0); using decode + cuBLAS for it")

    def _remember(self, key, msg: str) -> None:
        """Adds key to the fallbacks; the first time, warns with msg (once per key)."""
        if key not in self._refused:
            self._refused.add(key)
            warnings.warn(msg, stacklevel=4)
            log.warning(msg)

    def refuse(self, w: EncodedWeight, M: int, device: torch.device, path: str, reason: str) -> None:
        """A fused launcher refused this problem: run decode + GEMM for it from now on (one warning)."""
        key = self._key(w, M, device)
        self._remember(key, f"unweight: {path} refused {w.name or 'a layer'} [{w.rows}x{w.cols}] at batch {M} on "
                            f"{key[0]} ({reason}); using decode + cuBLAS for it")

    def may_fuse(self, device) -> bool:
        """Whether any forward on `device` can take a fused kernel (else every output is the
        decode + dense GEMM result, bitwise the original model's)."""
        device = torch.device(device)
        if self.table is None or device.type != "cuda":
            return False
        name = self.device_name(device)
        for key, e in self.table.entries.items():
            dev, n, k, enc, _bucket = split_key(key)
            path = self.table.lookup(dev, n, k, enc, int(e.get("M", 1)))
            if dev == name and path != DECODE_CUBLAS and not self.faulty(device, path, enc.endswith(TILED)):
                return True
        return False


def resolve_plane_order(order: str, policy: DispatchPolicy | None, N: int, K: int, device) -> str:
    """"file" or "tiled": the order to hold a palette [N, K] matmul weight's planes in on
    `device` when asked for `order`; "auto" is the policy's measured choice
    (DispatchPolicy.plane_order), file order without a policy."""
    if order != "auto":
        return order
    return policy.plane_order(N, K, device) if policy is not None else "file"


def measured() -> DispatchPolicy:
    """Policy from the shipped tuning defaults overlaid with the user's cache."""
    return DispatchPolicy(load_table())
