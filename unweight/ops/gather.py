"""Embedding row gathers that decode only what the ids touch.

    torch.ops.unweight.gather_rows_huffman(ids, sm, exp, off, table, rows, cols, R, C, exp_lo, exp_hi,
                                           lut=None, err=None, chk=None, chk_interval=0)
    torch.ops.unweight.gather_rows_palette(ids, sm, idx, vpos, vexp, rows, cols, palette, err=None, vrow=None)
        ids: integer [...] on the planes' device, each in [0, rows); returns bf16 [ids.numel(), cols].
        CUDA also takes lut (uint16 [4, 4096], ops.build_lut) and err (int32 [1]) for Huffman, err
        for palette; chk / chk_interval: the Huffman checkpoint index, when the tensor has one;
        vrow: a palette weight's verbatim row index (ops.verbatim_rows), with which a thread
        finds its block's verbatim entry among its row's few rather than by a search of the
        whole list (the same bits; the CPU ignores it).

CPU: Huffman decodes the row groups holding the ids (consecutive groups in one call, so
threads split their segments); palette decodes the rows themselves; an id out of range raises
IndexError.  CUDA: one kernel with the ids on the device and no host sync (so an embedding
is CUDA-graph capturable): palette decodes each id's row; Huffman decodes, per id and column
chunk, only the chains of the checkpoint index that hold the row (without an index, the row's
segment up to the row).  An id out of range there gives a zero row and adds 1 to err, which
the runtime reads outside the forward (runtime/scratch.py).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from ..format.errors import FormatError
from . import _ext
from .decode import index_args, n_units

__all__ = ["gather_rows_huffman", "gather_rows_palette"]


def _host_ids(ids: Tensor, rows: int) -> np.ndarray:
    flat = ids.reshape(-1).to(torch.int64).numpy()
    if flat.size and (flat.min() < 0 or flat.max() >= rows):
        raise IndexError(f"index out of range in self (embedding of {rows} rows, got ids in "
                         f"[{int(flat.min())}, {int(flat.max())}])")
    return flat


def _runs(sorted_unique: np.ndarray):
    """Split sorted unique ints into runs of consecutive values: [(first, last + 1), ...]."""
    if sorted_unique.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(sorted_unique, breaks)]


def _device_ids(ids: Tensor, sm: Tensor) -> Tensor:
    """The ids as a contiguous int64 vector on the planes' device (a device op, no sync)."""
    _ext.same_device("gather_rows", sm, ids)
    return ids.reshape(-1).to(torch.int64).contiguous()


def _need_err(err, device) -> Tensor:
    if err is None or err.dtype != torch.int32 or err.numel() != 1 or err.device != device:
        raise ValueError(f"gather_rows on CUDA needs the int32 [1] error counter on {device} (runtime scratch)")
    return err


@torch.library.custom_op("unweight::gather_rows_huffman", mutates_args=("err",))
def gather_rows_huffman(ids: Tensor, sm: Tensor, exp: Tensor, off: Tensor, table: Tensor, rows: int, cols: int,
                        rows_per_group: int, cols_per_chunk: int, exp_lo: int, exp_hi: int,
                        lut: Optional[Tensor] = None, err: Optional[Tensor] = None, chk: Optional[Tensor] = None,
                        chk_interval: int = 0) -> Tensor:
    raise NotImplementedError(f"unweight::gather_rows_huffman has no kernel for device {ids.device}")


@gather_rows_huffman.register_fake
def _(ids, sm, exp, off, table, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, lut=None, err=None,
      chk=None, chk_interval=0):
    return sm.new_empty((ids.numel(), cols), dtype=torch.bfloat16)


@gather_rows_huffman.register_kernel("cuda")
def _gather_rows_huffman_cuda(ids, sm, exp, off, table, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, lut=None, err=None,
      chk=None, chk_interval=0):
    flat = _device_ids(ids, sm)
    out = torch.empty((flat.numel(), cols), dtype=torch.bfloat16, device=sm.device)
    if flat.numel() == 0 or cols == 0:
        return out
    err = _need_err(err, sm.device)
    _ext.require_contiguous("gather_rows_huffman", sm, exp, off)
    _ext.same_device("gather_rows_huffman", sm, exp, off)
    if lut is None or lut.numel() != 4 * 4096 or lut.device != sm.device:
        raise ValueError("gather_rows_huffman on CUDA needs the uint16 [4, 4096] decode tables (ops.build_lut)")
    pchk, S, P = index_args(chk, chk_interval, sm.device)
    with torch.cuda.device_of(sm):
        _ext.cuda_module().huffman_gather_rows(_ext.ptr(flat), flat.numel(), _ext.ptr(exp), exp.numel(), _ext.ptr(off),
                                               rows, cols, rows_per_group, cols_per_chunk, _ext.ptr(lut),
                                               _ext.ptr(sm), pchk, S, P, _ext.ptr(out), out.stride(0), _ext.ptr(err),
                                               _ext.stream(sm))
    return out


@gather_rows_huffman.register_kernel("cpu")
def _gather_rows_huffman_cpu(ids, sm, exp, off, table, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi, lut=None, err=None,
      chk=None, chk_interval=0):
    flat = _host_ids(ids, rows)
    R = rows_per_group
    out = np.empty((flat.size, cols), dtype=np.uint16)
    groups = flat // R
    sm_np, exp_np, off_np, tab = _ext.np_view(sm), _ext.np_view(exp), _ext.np_view(off), _ext.np_view(table)
    n_chunks = n_units(cols, cols_per_chunk)
    for g0, g1 in _runs(np.unique(groups)):
        r0, r1 = g0 * R, min(rows, g1 * R)
        buf = np.empty((r1 - r0, cols), dtype=np.uint16)
        try:
            _ext._C.huffman_decode(exp_np, off_np, rows, cols, R, cols_per_chunk, tab, exp_lo, exp_hi, g0, g1, 0,
                                   n_chunks, sm_np[r0:r1], buf, _ext.threads())
        except ValueError as e:
            raise FormatError(f"huffman decode failed: {e}") from None
        sel = (groups >= g0) & (groups < g1)
        out[sel] = buf[flat[sel] - r0]
    return torch.from_numpy(out).view(torch.bfloat16)


@torch.library.custom_op("unweight::gather_rows_palette", mutates_args=("err",))
def gather_rows_palette(ids: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, rows: int, cols: int,
                        palette: List[int], err: Optional[Tensor] = None, vrow: Optional[Tensor] = None) -> Tensor:
    raise NotImplementedError(f"unweight::gather_rows_palette has no kernel for device {ids.device}")


@gather_rows_palette.register_fake
def _(ids, sm, idx, vpos, vexp, rows, cols, palette, err=None, vrow=None):
    return sm.new_empty((ids.numel(), cols), dtype=torch.bfloat16)


@gather_rows_palette.register_kernel("cuda")
def _gather_rows_palette_cuda(ids, sm, idx, vpos, vexp, rows, cols, palette, err=None, vrow=None):
    flat = _device_ids(ids, sm)
    out = torch.empty((flat.numel(), cols), dtype=torch.bfloat16, device=sm.device)
    if flat.numel() == 0 or cols == 0:
        return out
    err = _need_err(err, sm.device)
    _ext.require_contiguous("gather_rows_palette", sm, idx, vpos, vexp)
    _ext.same_device("gather_rows_palette", sm, idx, vpos, vexp)
    vr = _ext.vrow_ptr("gather_rows_palette", vrow, sm, rows + 1)
    with torch.cuda.device_of(sm):
        _ext.cuda_module().palette_gather_rows(_ext.ptr(flat), flat.numel(), _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                               bytes(palette), _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp),
                                               _ext.ptr(out), out.stride(0), _ext.ptr(err), _ext.stream(sm),
                                               vr)
    return out


@gather_rows_palette.register_kernel("cpu")
def _gather_rows_palette_cpu(ids, sm, idx, vpos, vexp, rows, cols, palette, err=None, vrow=None):
    flat = _host_ids(ids, rows)
    out = np.empty((flat.size, cols), dtype=np.uint16)
    sm_np, idx_np, vpos_np, vexp_np = _ext.np_view(sm), _ext.np_view(idx), _ext.np_view(vpos), _ext.np_view(vexp)
    pal = np.asarray(palette, dtype=np.uint8)
    for r0, r1 in _runs(np.unique(flat)):
        buf = np.empty((r1 - r0, cols), dtype=np.uint16)
        try:
            _ext._C.palette_decode(sm_np[r0:r1], idx_np[r0:r1], rows, cols, r0, r1, pal, vpos_np, vexp_np, buf,
                                   _ext.threads())
        except ValueError as e:
            raise FormatError(f"palette decode failed: {e}") from None
        sel = (flat >= r0) & (flat < r1)
        out[sel] = buf[flat[sel] - r0]
    return torch.from_numpy(out).view(torch.bfloat16)
