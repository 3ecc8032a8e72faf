"""torch.library custom ops of unweight (namespace ``unweight``).

Ops (all weights are BF16 bit patterns; planes as in docs/FORMAT.md):

    torch.ops.unweight.decode_huffman(sm, exp, off, table, lut, out, err, rows, cols, R, C, exp_lo, exp_hi)
    torch.ops.unweight.decode_palette(sm, idx, vpos, vexp, out, err, rows, cols, palette)
        Decode a whole [rows, cols] matrix into ``out`` (bf16 [rows, cols], mutated in place,
        typically a view of the per-device scratch buffer).  Return nothing.
    torch.ops.unweight.gather_rows_huffman(ids, sm, exp, off, table, rows, cols, R, C, exp_lo, exp_hi)
    torch.ops.unweight.gather_rows_palette(ids, sm, idx, vpos, vexp, rows, cols, palette)
        Embedding lookup: bf16 [ids.numel(), cols], decoding only the row groups the ids touch.

Each op has a fake (meta) impl so torch.compile / FakeTensor tracing works, a CPU impl that
hands zero-copy NumPy views (``tensor.numpy()``) to the C++ codec ``unweight._C``, and the
decode ops a CUDA impl calling the ``unweight._cuda`` pybind11 module with integer device
pointers and the current stream (``torch.cuda.current_stream().cuda_stream``).

Out-variant decode ops (``out`` mutated) exist so that a forward never allocates: the
caller passes a view of one preallocated scratch buffer, which also keeps CUDA-graph capture
allocation-free.  Data errors: the CPU impls raise unweight.FormatError (a host op can);
the CUDA impls cannot without a host sync, so they add to the int32 device counter ``err``
(read with unweight.runtime.dispatch.device_errors()).  Checkpoints are checksum-verified at
load, so a non-zero counter means memory corruption after load.

Tensor arguments by plane (device = the module's device):
    sm    uint8  [rows, cols]           exp   uint8 [stream bytes]     off  uint32 [n_seg + 1]
    table uint8  [4, exp_hi-exp_lo+1]   (code lengths, the header's table; CPU decode builds its LUT)
    lut   uint16 [4, 4096] on CUDA, or empty on CPU (prebuilt decode tables for the kernels)
    idx   uint8  [rows, (cols+1)//2]    vpos  uint32 [nv]              vexp uint8 [nv, 64]
    err   int32  [1] on the device
"""
from __future__ import annotations

import logging
from typing import List

import numpy as np
import torch
from torch import Tensor

from . import _C
from .format.errors import FormatError

log = logging.getLogger(__name__)

__all__ = ["decode_huffman", "decode_palette", "gather_rows_huffman", "gather_rows_palette", "cuda_module",
           "build_lut"]


def _threads() -> int:
    # The user's torch thread setting governs the codec too, so a model run with
    # torch.set_num_threads(1) stays on one core.
    return max(1, torch.get_num_threads())


def _np(t: Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a CPU tensor; bf16 is viewed as uint16 (bits, no conversion)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.uint16)
    return t.numpy()


def _n_groups(rows: int, R: int) -> int:
    return -(-rows // R)


# ------------------------------------------------------------------------ CUDA module

_CUDA_STATE: dict = {}


def cuda_module():
    """The compiled ``unweight._cuda`` module, or None when it is not built (cached)."""
    if "mod" not in _CUDA_STATE:
        try:
            from . import _cuda  # type: ignore[attr-defined]
            _CUDA_STATE["mod"] = _cuda
        except ImportError as e:
            log.debug("unweight._cuda not importable: %s", e)
            _CUDA_STATE["mod"] = None
    return _CUDA_STATE["mod"]


def _stream(t: Tensor) -> int:
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def build_lut(table: Tensor, exp_lo: int, exp_hi: int, err: Tensor) -> Tensor:
    """Huffman decode tables uint16 [4, 4096] on table's CUDA device (load time, not traced).

    table: uint8 [4, exp_hi-exp_lo+1] code lengths on the device; err: int32 [1] counter.
    """
    lut = torch.empty((4, 4096), dtype=torch.uint16, device=table.device)
    table = table.contiguous()
    cuda_module().huffman_build_lut(table.data_ptr(), exp_lo, exp_hi, lut.data_ptr(), err.data_ptr(),
                                    _stream(table))
    return lut


# ------------------------------------------------------------------------ decode_huffman


@torch.library.custom_op("unweight::decode_huffman", mutates_args=("out", "err"))
def decode_huffman(sm: Tensor, exp: Tensor, off: Tensor, table: Tensor, lut: Tensor, out: Tensor, err: Tensor,
                   rows: int, cols: int, rows_per_group: int, cols_per_chunk: int, exp_lo: int,
                   exp_hi: int) -> None:
    raise NotImplementedError(f"unweight::decode_huffman has no kernel for device {out.device}")


@decode_huffman.register_fake
def _(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    return None


@decode_huffman.register_kernel("cpu")
def _(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    try:
        _C.huffman_decode(_np(exp), _np(off), rows, cols, rows_per_group, cols_per_chunk, _np(table), exp_lo, exp_hi,
                          0, _n_groups(rows, rows_per_group), 0, _n_groups(cols, cols_per_chunk), _np(sm),
                          _np(out), _threads())
    except ValueError as e:
        err.add_(1)
        raise FormatError(f"huffman decode failed: {e}") from None


@decode_huffman.register_kernel("cuda")
def _(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    # bindings_cuda.cpp huffman_decode(exp, exp_bytes, off, rows, cols, R, C, lut, g0, g1, c0, c1,
    # sm, sm_stride, out, out_stride, err, stream, exp_only); raises RuntimeError on launch errors.
    cuda_module().huffman_decode(exp.data_ptr(), exp.numel(), off.data_ptr(), rows, cols, rows_per_group,
                                 cols_per_chunk, lut.data_ptr(), 0, _n_groups(rows, rows_per_group), 0,
                                 _n_groups(cols, cols_per_chunk), sm.data_ptr(), cols, out.data_ptr(), cols,
                                 err.data_ptr(), _stream(out), False)


# ------------------------------------------------------------------------ decode_palette


@torch.library.custom_op("unweight::decode_palette", mutates_args=("out", "err"))
def decode_palette(sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, out: Tensor, err: Tensor, rows: int,
                   cols: int, palette: List[int]) -> None:
    raise NotImplementedError(f"unweight::decode_palette has no kernel for device {out.device}")


@decode_palette.register_fake
def _(sm, idx, vpos, vexp, out, err, rows, cols, palette):
    return None


@decode_palette.register_kernel("cpu")
def _(sm, idx, vpos, vexp, out, err, rows, cols, palette):
    try:
        _C.palette_decode(_np(sm), _np(idx), rows, cols, 0, rows, np.asarray(palette, dtype=np.uint8), _np(vpos),
                          _np(vexp), _np(out), _threads())
    except ValueError as e:
        err.add_(1)
        raise FormatError(f"palette decode failed: {e}") from None


@decode_palette.register_kernel("cuda")
def _(sm, idx, vpos, vexp, out, err, rows, cols, palette):
    # bindings_cuda.cpp palette_decode(sm, idx, rows, cols, r0, r1, k0, k1, palette bytes, vpos, nv,
    # vexp, out, out_stride, err, stream).  vpos/vexp may be empty (nv == 0): pass null then.
    nv = vpos.numel()
    cuda_module().palette_decode(sm.data_ptr(), idx.data_ptr(), rows, cols, 0, rows, 0, cols, bytes(palette),
                                 vpos.data_ptr() if nv else 0, nv, vexp.data_ptr() if nv else 0, out.data_ptr(),
                                 cols, err.data_ptr(), _stream(out))


# ------------------------------------------------------------------------ embedding gathers


def _check_ids(ids: np.ndarray, rows: int):
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError(f"index out of range in self (embedding of {rows} rows, got ids in "
                         f"[{int(ids.min())}, {int(ids.max())}])")


def _runs(sorted_unique: np.ndarray):
    """Split sorted unique ints into runs of consecutive values: [(first, last + 1), ...]."""
    if sorted_unique.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(sorted_unique, breaks)]


@torch.library.custom_op("unweight::gather_rows_huffman", mutates_args=())
def gather_rows_huffman(ids: Tensor, sm: Tensor, exp: Tensor, off: Tensor, table: Tensor, rows: int, cols: int,
                        rows_per_group: int, cols_per_chunk: int, exp_lo: int, exp_hi: int) -> Tensor:
    raise NotImplementedError(f"unweight::gather_rows_huffman has no kernel for device {ids.device}")


@gather_rows_huffman.register_fake
def _(ids, sm, exp, off, table, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    return sm.new_empty((ids.numel(), cols), dtype=torch.bfloat16)


@gather_rows_huffman.register_kernel("cpu")
def _(ids, sm, exp, off, table, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    flat = ids.reshape(-1).to(torch.int64).numpy()
    _check_ids(flat, rows)
    R = rows_per_group
    out = np.empty((flat.size, cols), dtype=np.uint16)
    groups = flat // R
    sm_np, exp_np, off_np, tab = _np(sm), _np(exp), _np(off), _np(table)
    n_chunks = _n_groups(cols, cols_per_chunk)
    # Consecutive needed groups decode in one call (threads split its segments); groups
    # nobody asked for are never decoded.
    for g0, g1 in _runs(np.unique(groups)):
        r0, r1 = g0 * R, min(rows, g1 * R)
        buf = np.empty((r1 - r0, cols), dtype=np.uint16)
        try:
            _C.huffman_decode(exp_np, off_np, rows, cols, R, cols_per_chunk, tab, exp_lo, exp_hi, g0, g1, 0, n_chunks,
                              sm_np[r0:r1], buf, _threads())
        except ValueError as e:
            raise FormatError(f"huffman decode failed: {e}") from None
        sel = (groups >= g0) & (groups < g1)
        out[sel] = buf[flat[sel] - r0]
    return torch.from_numpy(out).view(torch.bfloat16)


@torch.library.custom_op("unweight::gather_rows_palette", mutates_args=())
def gather_rows_palette(ids: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, rows: int, cols: int,
                        palette: List[int]) -> Tensor:
    raise NotImplementedError(f"unweight::gather_rows_palette has no kernel for device {ids.device}")


@gather_rows_palette.register_fake
def _(ids, sm, idx, vpos, vexp, rows, cols, palette):
    return sm.new_empty((ids.numel(), cols), dtype=torch.bfloat16)


@gather_rows_palette.register_kernel("cpu")
def _(ids, sm, idx, vpos, vexp, rows, cols, palette):
    flat = ids.reshape(-1).to(torch.int64).numpy()
    _check_ids(flat, rows)
    out = np.empty((flat.size, cols), dtype=np.uint16)
    sm_np, idx_np, vpos_np, vexp_np = _np(sm), _np(idx), _np(vpos), _np(vexp)
    pal = np.asarray(palette, dtype=np.uint8)
    uniq = np.unique(flat)
    for r0, r1 in _runs(uniq):
        buf = np.empty((r1 - r0, cols), dtype=np.uint16)
        try:
            _C.palette_decode(sm_np[r0:r1], idx_np[r0:r1], rows, cols, r0, r1, pal, vpos_np, vexp_np, buf,
                              _threads())
        except ValueError as e:
            raise FormatError(f"palette decode failed: {e}") from None
        sel = (flat >= r0) & (flat < r1)
        out[sel] = buf[flat[sel] - r0]
    return torch.from_numpy(out).view(torch.bfloat16)
