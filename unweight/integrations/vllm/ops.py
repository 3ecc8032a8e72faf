"""torch.library ops of the vLLM integration (namespace ``unweight_vllm``).

A layer's per-rank weight is a list of *pieces*: self-contained encoded tensors stacked along
rows (q, k, v of a merged qkv projection; gate, up of gate_up; one piece for everything else),
each the rank's own segments only (unweight.codec.shard).  The ops take the pieces as a flat
tensor list plus an int list of metadata, so one op call covers a whole merged layer and the
layer is decoded exactly once per forward:

    planes: 5 tensors per piece, on the layer's device
        huffman: sm uint8 [n, k], exp uint8 [bytes], off uint32 [n_seg + 1],
                 table uint8 [4, exp_hi - exp_lo + 1], lut uint16 [4, 4096] (CUDA) or empty
        palette: sm uint8 [n, k], idx uint8 [n, ceil(k/2)], vpos uint32 [nv], vexp uint8 [nv, 32],
                 an empty uint8 placeholder
    meta: META_LEN ints per piece: encoding, rows, cols, R, C, exp_lo, exp_hi, pal_size,
          palette[16]

    unweight_vllm::linear(x, planes, meta, bias, out_rows, cols) -> y   bf16 [..., out_rows]
    unweight_vllm::decode(planes, meta, out_rows, cols) -> w           bf16 [out_rows, cols]
    unweight_vllm::embedding(ids, planes, meta, out_rows, cols) -> e   bf16 [ids.numel(), cols]

``out_rows`` may exceed the pieces' rows (vocab padding of a vLLM vocab-parallel shard):
those rows are zero, as in vLLM's own padded embedding.  Every op has a fake impl, so vLLM's
torch.compile traces through them and CUDA graphs capture them; the decoded weight is a
temporary of the op, never a parameter.

The CPU linear impl multiplies with vLLM's own CPU GEMM dispatch (oneDNN on x86) when vLLM
is importable, so a compressed model computes with the same kernel, hence the same bits, as
vLLM serving the BF16 original; F.linear otherwise.
"""
from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _C
from ...format import constants as C
from ...format.errors import FormatError

log = logging.getLogger(__name__)

META_LEN = 8 + C.PAL_MAX_ENTRIES
PLANES_PER_PIECE = 5


from ...ops import _np, _threads  # noqa: E402 - one definition of the tensor<->codec bridge


def pieces(planes: List[Tensor], meta: List[int]):
    """Yield (encoding, rows, cols, R, C, lo, hi, palette list, 5 plane tensors) per piece."""
    n = len(meta) // META_LEN
    if len(planes) != n * PLANES_PER_PIECE:
        raise ValueError(f"unweight_vllm: {len(planes)} plane tensors for {n} pieces")
    for i in range(n):
        m = meta[i * META_LEN:(i + 1) * META_LEN]
        yield (m[0], m[1], m[2], m[3], m[4], m[5], m[6], list(m[8:8 + m[7]]),
               planes[i * PLANES_PER_PIECE:(i + 1) * PLANES_PER_PIECE])


def _decode_cpu_into(planes, meta, out: np.ndarray) -> int:
    """Decode every piece into consecutive rows of ``out`` (uint16 view); return rows written."""
    r = 0
    for enc, n, k, R, Cc, lo, hi, pal, t in pieces(planes, meta):
        dst = out[r:r + n]
        try:
            if enc == C.ENC_HUFFMAN:
                _C.huffman_decode(_np(t[1]), _np(t[2]), n, k, R, Cc, _np(t[3]), lo, hi, 0, -(-n // R), 0,
                                  -(-k // Cc), _np(t[0]), dst, _threads())
            else:
                _C.palette_decode(_np(t[0]), _np(t[1]), n, k, 0, n, np.asarray(pal, dtype=np.uint8), _np(t[2]),
                                  _np(t[3]), dst, _threads())
        except ValueError as e:
            raise FormatError(f"unweight decode failed: {e}") from None
        r += n
    return r


def _decode_cuda_into(planes, meta, out: Tensor, err: Tensor) -> int:
    from ... import ops as uops  # registers torch.ops.unweight.* (CUDA kernels)
    r = 0
    for enc, n, k, R, Cc, lo, hi, pal, t in pieces(planes, meta):
        dst = out[r:r + n]
        if enc == C.ENC_HUFFMAN:
            uops.decode_huffman(t[0], t[1], t[2], t[3], t[4], dst, err, n, k, R, Cc, lo, hi)
        else:
            uops.decode_palette(t[0], t[1], t[2], t[3], dst, err, n, k, pal)
        r += n
    return r


def decode_weight(planes: List[Tensor], meta: List[int], out_rows: int, cols: int) -> Tensor:
    """bf16 [out_rows, cols] on the planes' device: the pieces stacked, zero rows after them."""
    dev = planes[0].device
    out = torch.empty((out_rows, cols), dtype=torch.bfloat16, device=dev)
    if dev.type == "cpu":
        r = _decode_cpu_into(planes, meta, _np(out))
    else:
        err = torch.zeros(1, dtype=torch.int32, device=dev)
        r = _decode_cuda_into(planes, meta, out, err)
    if r < out_rows:
        out[r:].zero_()
    return out


def _cpu_gemm(x: Tensor, w: Tensor, bias: Optional[Tensor]) -> Tensor:
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return F.linear(x, w, bias)

    class _Tmp(torch.nn.Module):
        pass

    tmp = _Tmp()
    tmp.weight = torch.nn.Parameter(w, requires_grad=False)
    if bias is not None:
        # the sgl path may convert a bias in place; keep the caller's tensor untouched
        tmp.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(tmp, remove_weight=False)
    return tmp.cpu_linear(x, tmp.weight, tmp.bias if bias is not None else None)


# ------------------------------------------------------------------------------ linear


@torch.library.custom_op("unweight_vllm::linear", mutates_args=())
def linear(x: Tensor, planes: List[Tensor], meta: List[int], bias: Optional[Tensor], out_rows: int,
           cols: int) -> Tensor:
    w = decode_weight(planes, meta, out_rows, cols)
    if x.device.type == "cpu":
        return _cpu_gemm(x, w, bias)
    return F.linear(x, w, bias)


@linear.register_fake
def _(x, planes, meta, bias, out_rows, cols):
    return x.new_empty((*x.shape[:-1], out_rows))


# ------------------------------------------------------------------------------ decode


@torch.library.custom_op("unweight_vllm::decode", mutates_args=())
def decode(planes: List[Tensor], meta: List[int], out_rows: int, cols: int) -> Tensor:
    return decode_weight(planes, meta, out_rows, cols)


@decode.register_fake
def _(planes, meta, out_rows, cols):
    return planes[0].new_empty((out_rows, cols), dtype=torch.bfloat16)


# ------------------------------------------------------------------------------ embedding


def _runs(sorted_unique: np.ndarray):
    if sorted_unique.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(sorted_unique, breaks)]


def _gather_cpu(ids: Tensor, planes, meta, out_rows: int, cols: int) -> Tensor:
    flat = ids.reshape(-1).to(torch.int64).numpy()
    out = np.zeros((flat.size, cols), dtype=np.uint16)
    base = 0
    for enc, n, k, R, Cc, lo, hi, pal, t in pieces(planes, meta):
        local = flat - base
        sel_all = (local >= 0) & (local < n)
        base += n
        if not sel_all.any():
            continue
        want = local[sel_all]
        # Decode only the row groups (huffman) or rows (palette) the ids touch.
        unit = R if enc == C.ENC_HUFFMAN else 1
        units = want // unit
        for u0, u1 in _runs(np.unique(units)):
            r0, r1 = u0 * unit, min(n, u1 * unit)
            buf = np.empty((r1 - r0, k), dtype=np.uint16)
            try:
                if enc == C.ENC_HUFFMAN:
                    _C.huffman_decode(_np(t[1]), _np(t[2]), n, k, R, Cc, _np(t[3]), lo, hi, u0, u1, 0,
                                      -(-k // Cc), np.ascontiguousarray(_np(t[0])[r0:r1]), buf, _threads())
                else:
                    _C.palette_decode(np.ascontiguousarray(_np(t[0])[r0:r1]),
                                      np.ascontiguousarray(_np(t[1])[r0:r1]), n, k, r0, r1,
                                      np.asarray(pal, dtype=np.uint8), _np(t[2]), _np(t[3]), buf, _threads())
            except ValueError as e:
                raise FormatError(f"unweight decode failed: {e}") from None
            m = np.zeros(flat.size, dtype=bool)
            m[sel_all] = (units >= u0) & (units < u1)
            out[m] = buf[local[m] - r0]
    # ids past the pieces' rows are vocab padding: zero rows (vLLM masks them anyway)
    return torch.from_numpy(out).view(torch.bfloat16).reshape(*ids.shape, cols)


@torch.library.custom_op("unweight_vllm::embedding", mutates_args=())
def embedding(ids: Tensor, planes: List[Tensor], meta: List[int], out_rows: int, cols: int) -> Tensor:
    if ids.device.type == "cpu":
        return _gather_cpu(ids, planes, meta, out_rows, cols)
    # GPU: decode the rank's shard once, then gather (the row-gather kernels of unweight.ops
    # take whole tensors; a shard is one, but padding ids need the zero rows of decode_weight).
    w = decode_weight(planes, meta, out_rows, cols)
    return F.embedding(ids, w)


@embedding.register_fake
def _(ids, planes, meta, out_rows, cols):
    return planes[0].new_empty((*ids.shape, cols), dtype=torch.bfloat16)
