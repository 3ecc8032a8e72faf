"""Whole-matrix decode ops (out-variant: the caller passes the destination).

    torch.ops.unweight.decode_huffman(sm, exp, off, table, lut, out, err, rows, cols, R, C, exp_lo, exp_hi,
                                      chk=None, chk_interval=0, variant=0)
    torch.ops.unweight.decode_palette(sm, idx, vpos, vexp, out, err, rows, cols, palette, variant=0, tiled=False)
    torch.ops.unweight.decode_palette_slots(ids, sm, idx, vpos, vexp, out, err, palette, variant=0)
        (slot s of out [S, rows, cols] = matrix ids[s] of a palette stack; see its docstring)
        out: bf16 [rows, cols] (row-major, any row stride >= cols), mutated; returns nothing.
        decode_huffman with a uint8 `out` writes the exponent bytes only (the palette
        transcode's first pass).  chk / chk_interval: the checkpoint index (FORMAT.md
        "Checkpoint index"), with which the CUDA kernel decodes S-weight chains instead of
        whole segments; the CPU decoder does not need it.  variant: the CUDA decoder to run
        (runtime.kernel_plan.HUFF_VARIANTS; 0, the default, is what the runtime runs); every
        variant writes the same bits, and the CPU ignores it.  decode_palette's variant likewise
        picks the CUDA kernel (runtime.kernel_plan.PAL_VARIANTS; 0 the default).  tiled: sm and idx
        hold their bytes tile-major (ops/layout.py), the order the fused kernels stream fastest.

Planes (docs/FORMAT.md), on the device of ``out``:
    sm    uint8  [rows, cols]           exp   uint8 [stream bytes]     off  uint32 [n_seg + 1]
    table uint8  [4, exp_hi-exp_lo+1]   code lengths (the header's table; the CPU decoder builds
                                        its own tables from it)
    lut   uint16 [4, 4096] on CUDA (ops.build_lut), empty on CPU
    chk   uint16 [n_seg, P]             checkpoint index (optional, chk_interval = its S)
    idx   uint8  [rows, ceil(cols/2)]   vpos  uint32 [nv]              vexp uint8 [nv, 32]
    err   int32  [1] device error counter

Out-variant ops let a forward decode into a view of one preallocated scratch buffer, so
weights never allocate and CUDA-graph capture sees no allocation.  Data errors: the CPU
kernels raise FormatError (a host op can); the CUDA kernels cannot without a host sync, so
they add to ``err``, which the runtime reads outside the forward (runtime/scratch.py).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from ..format.errors import FormatError
from . import _ext
from .layout import untile_palette_planes

__all__ = ["decode_huffman", "decode_palette", "n_units", "index_args"]


def n_units(n: int, unit: int) -> int:
    """Row groups (or column chunks) of a grid: ceil(n / unit)."""
    return -(-n // unit)


def _check_huffman(sm, exp, off, lut, out, rows, cols, on_cuda: bool):
    _ext.require_rowmajor(out, "out", rows, cols)
    _ext.require_contiguous("decode_huffman", sm, exp, off)
    _ext.same_device("decode_huffman", out, sm, exp, off)
    if on_cuda and (lut.numel() != 4 * 4096 or lut.device != out.device):
        raise ValueError("decode_huffman on CUDA needs the uint16 [4, 4096] decode tables on the output's device "
                         "(ops.build_lut)")


def _cpu_huffman(sm, exp, off, table, out, rows, cols, R, C, exp_lo, exp_hi):
    try:
        _ext._C.huffman_decode(_ext.np_view(exp), _ext.np_view(off), rows, cols, R, C, _ext.np_view(table), exp_lo,
                               exp_hi, 0, n_units(rows, R), 0, n_units(cols, C), _ext.np_view(sm),
                               _ext.np_view(out), _ext.threads())
    except ValueError as e:
        raise FormatError(f"huffman decode failed: {e}") from None


def index_args(chk, chk_interval: int, device) -> tuple[int, int, int]:
    """(pointer, S, P) of a checkpoint index for the CUDA launchers; (0, 0, 0) without one."""
    if chk is None or not chk_interval or chk.numel() == 0:
        return 0, 0, 0
    if chk.dtype != torch.uint16 or chk.dim() != 2 or not chk.is_contiguous() or chk.device != device:
        raise ValueError(f"checkpoint index must be a contiguous uint16 [n_seg, P] tensor on {device}, got "
                         f"{chk.dtype} {tuple(chk.shape)} on {chk.device}")
    return _ext.ptr(chk), int(chk_interval), int(chk.size(1))


def _cuda_huffman(sm, exp, off, lut, out, err, rows, cols, R, C, exp_only: bool, chk, chk_interval, variant=0):
    pchk, S, P = index_args(chk, chk_interval, out.device)
    with torch.cuda.device_of(out):
        _ext.cuda_module().huffman_decode(_ext.ptr(exp), exp.numel(), _ext.ptr(off), rows, cols, R, C, _ext.ptr(lut),
                                          0, n_units(rows, R), 0, n_units(cols, C), _ext.ptr(sm), cols,
                                          _ext.ptr(out), out.stride(0), _ext.ptr(err), _ext.stream(out), exp_only,
                                          pchk, S, P, variant)


# ------------------------------------------------------------------------ decode_huffman


@torch.library.custom_op("unweight::decode_huffman", mutates_args=("out", "err"))
def decode_huffman(sm: Tensor, exp: Tensor, off: Tensor, table: Tensor, lut: Tensor, out: Tensor, err: Tensor,
                   rows: int, cols: int, rows_per_group: int, cols_per_chunk: int, exp_lo: int,
                   exp_hi: int, chk: Optional[Tensor] = None, chk_interval: int = 0, variant: int = 0) -> None:
    raise NotImplementedError(f"unweight::decode_huffman has no kernel for device {out.device}")


@decode_huffman.register_fake
def _(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, chk=None,
      chk_interval=0, variant=0):
    return None


@decode_huffman.register_kernel("cpu")
def _decode_huffman_cpu(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, chk=None,
      chk_interval=0, variant=0):
    if rows == 0 or cols == 0:
        return
    _check_huffman(sm, exp, off, lut, out, rows, cols, False)
    exponents_only = out.dtype == torch.uint8
    if not out.is_contiguous():
        raise ValueError("decode_huffman on CPU writes a contiguous [rows, cols] output")
    dst = torch.empty((rows, cols), dtype=torch.bfloat16) if exponents_only else out
    try:
        _cpu_huffman(sm, exp, off, table, dst, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi)
    except FormatError:
        err.add_(1)
        raise
    if exponents_only:
        _ext.np_view(out)[...] = (_ext.np_view(dst) >> 7) & 0xFF


@decode_huffman.register_kernel("cuda")
def _decode_huffman_cuda(sm, exp, off, table, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, chk=None,
      chk_interval=0, variant=0):
    if rows == 0 or cols == 0:
        return
    _check_huffman(sm, exp, off, lut, out, rows, cols, True)
    _cuda_huffman(sm, exp, off, lut, out, err, rows, cols, rows_per_group, cols_per_chunk, out.dtype == torch.uint8,
                  chk, chk_interval, variant)


# ------------------------------------------------------------------------ decode_palette


def _check_palette(sm, idx, vpos, vexp, out, rows, cols, palette):
    _ext.require_rowmajor(out, "out", rows, cols)
    _ext.require_contiguous("decode_palette", sm, idx, vpos, vexp)
    _ext.same_device("decode_palette", out, sm, idx, vpos, vexp)
    if not 1 <= len(palette) <= 16:
        raise ValueError(f"decode_palette: palette must have 1..16 entries, got {len(palette)}")


@torch.library.custom_op("unweight::decode_palette", mutates_args=("out", "err"))
def decode_palette(sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, out: Tensor, err: Tensor, rows: int,
                   cols: int, palette: List[int], variant: int = 0, tiled: bool = False) -> None:
    raise NotImplementedError(f"unweight::decode_palette has no kernel for device {out.device}")


@decode_palette.register_fake
def _(sm, idx, vpos, vexp, out, err, rows, cols, palette, variant=0, tiled=False):
    return None


@decode_palette.register_kernel("cpu")
def _decode_palette_cpu(sm, idx, vpos, vexp, out, err, rows, cols, palette, variant=0, tiled=False):
    if rows == 0 or cols == 0:
        return
    _check_palette(sm, idx, vpos, vexp, out, rows, cols, palette)
    if tiled:  # the C++ codec reads file order
        sm, idx = untile_palette_planes(sm, idx)
    if not out.is_contiguous():
        raise ValueError("decode_palette on CPU writes a contiguous [rows, cols] output")
    try:
        _ext._C.palette_decode(_ext.np_view(sm), _ext.np_view(idx), rows, cols, 0, rows,
                               np.asarray(palette, dtype=np.uint8), _ext.np_view(vpos), _ext.np_view(vexp),
                               _ext.np_view(out), _ext.threads())
    except ValueError as e:
        err.add_(1)
        raise FormatError(f"palette decode failed: {e}") from None


@decode_palette.register_kernel("cuda")
def _decode_palette_cuda(sm, idx, vpos, vexp, out, err, rows, cols, palette, variant=0, tiled=False):
    if rows == 0 or cols == 0:
        return
    _check_palette(sm, idx, vpos, vexp, out, rows, cols, palette)
    with torch.cuda.device_of(out):
        _ext.cuda_module().palette_decode(_ext.ptr(sm), _ext.ptr(idx), rows, cols, 0, rows, 0, cols, bytes(palette),
                                          _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp), _ext.ptr(out),
                                          out.stride(0), _ext.ptr(err), _ext.stream(out), variant, int(tiled))


# ------------------------------------------------------------------------ decode_palette_slots


def _check_slots(ids, sm, idx, vpos, vexp, out, palette):
    if sm.dim() != 3 or idx.dim() != 3 or vpos.dim() != 2 or vexp.dim() != 3 or out.dim() != 3 or ids.dim() != 1:
        raise ValueError("decode_palette_slots: ids 1-D; sm, idx, vexp, out 3-D; vpos 2-D")
    n, rows, cols = sm.shape
    if (tuple(idx.shape) != (n, rows, (cols + 1) // 2) or tuple(out.shape) != (ids.numel(), rows, cols)
            or vpos.shape[0] != n or tuple(vexp.shape) != (n, vpos.shape[1], 32)):
        raise ValueError(f"decode_palette_slots: shapes do not fit a stack {tuple(sm.shape)} and "
                         f"{ids.numel()} slots")
    if ids.dtype != torch.int64 or vpos.dtype != torch.uint32:
        raise ValueError("decode_palette_slots: ids must be int64 and vpos uint32")
    _ext.require_contiguous("decode_palette_slots", ids, sm, idx, vpos, vexp, out)
    _ext.same_device("decode_palette_slots", out, ids, sm, idx, vpos, vexp)
    if not 1 <= len(palette) <= 16:
        raise ValueError(f"decode_palette_slots: palette must have 1..16 entries, got {len(palette)}")


@torch.library.custom_op("unweight::decode_palette_slots", mutates_args=("out", "err"))
def decode_palette_slots(ids: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, out: Tensor, err: Tensor,
                         palette: List[int], variant: int = 0) -> None:
    """out[s] = matrix ids[s] of a palette stack (runtime/expert_slots.py): sm uint8 [n, rows,
    cols], idx uint8 [n, rows, ceil(cols/2)], vpos uint32 [n, V] (each matrix's verbatim block
    ids, ascending, one length), vexp uint8 [n, V, 32]; ids int64 [S]; out bf16 [S, rows, cols],
    mutated.  On CUDA the ids are read on the device (no host sync); an id outside [0, n) adds 1
    to err and leaves its slot unwritten.  On CPU such an id raises FormatError."""
    raise NotImplementedError(f"unweight::decode_palette_slots has no kernel for device {out.device}")


@decode_palette_slots.register_fake
def _(ids, sm, idx, vpos, vexp, out, err, palette, variant=0):
    return None


@decode_palette_slots.register_kernel("cpu")
def _decode_palette_slots_cpu(ids, sm, idx, vpos, vexp, out, err, palette, variant=0):
    _check_slots(ids, sm, idx, vpos, vexp, out, palette)
    n, rows, cols = sm.shape
    pal = np.asarray(palette, dtype=np.uint8)
    for s, e in enumerate(ids.tolist()):  # a host op may read the ids
        if not 0 <= e < n:
            err.add_(1)
            raise FormatError(f"decode_palette_slots: id {e} of slot {s} is outside the stack's {n} matrices")
        try:
            _ext._C.palette_decode(_ext.np_view(sm[e]), _ext.np_view(idx[e]), rows, cols, 0, rows, pal,
                                   _ext.np_view(vpos[e]), _ext.np_view(vexp[e]), _ext.np_view(out[s]), _ext.threads())
        except ValueError as ex:
            err.add_(1)
            raise FormatError(f"palette decode failed: {ex}") from None


@decode_palette_slots.register_kernel("cuda")
def _decode_palette_slots_cuda(ids, sm, idx, vpos, vexp, out, err, palette, variant=0):
    _check_slots(ids, sm, idx, vpos, vexp, out, palette)
    n, rows, cols = sm.shape
    with torch.cuda.device_of(out):
        _ext.cuda_module().palette_decode_slots(_ext.ptr(ids), ids.numel(), n, _ext.ptr(sm), _ext.ptr(idx), rows,
                                                cols, bytes(palette), _ext.ptr(vpos), vpos.shape[1], _ext.ptr(vexp),
                                                _ext.ptr(out), _ext.ptr(err), _ext.stream(out), variant)
