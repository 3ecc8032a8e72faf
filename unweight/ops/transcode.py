"""Load-time ops: Huffman decode tables and the huffman -> palette transcode.

    torch.ops.unweight.build_lut(table, lut, err, exp_lo, exp_hi)          CUDA
        table uint8 [4, exp_hi-exp_lo+1] code lengths -> lut uint16 [4, 4096] decode tables.
    torch.ops.unweight.exp_histogram(exps, hist)                            CPU, CUDA
        hist int64 [256] += counts of the uint8 exponent bytes exps [...].
    torch.ops.unweight.palette_encode(exps, idx, flags, row_counts, row_offsets, rows, cols, palette)   CUDA
        exps uint8 [rows, cols] -> idx uint8 [rows, ceil(cols/2)], flags uint8 [rows * blocks per row]
        (1 = verbatim block), row_offsets uint32 [rows + 1] (exclusive scan of verbatim blocks per row;
        row_counts uint32 [rows] is scratch).
    torch.ops.unweight.palette_verbatim(exps, flags, row_offsets, vpos, vexp, rows, cols)                CUDA
        vpos uint32 [nv], vexp uint8 [nv, PAL_BLOCK] of the flagged blocks.

transcode_to_palette() strings them together (it reads two values back to the host, so it is
a load-time function, never part of a forward).  Its result is bit-identical to the host
codec's ``tensor_codec.transcode_to_palette``: same grid, palette, idx, vpos and vexp.
"""
from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
import torch
from torch import Tensor

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.errors import FormatError
from ..format.header import TensorHeader
from ..runtime import kernel_plan as plan
from . import _ext

__all__ = ["build_lut", "transcode_to_palette", "encode_palette", "exp_histogram", "palette_encode", "palette_verbatim"]


# ------------------------------------------------------------------------ build_lut


@torch.library.custom_op("unweight::build_lut", mutates_args=("lut", "err"))
def build_lut_op(table: Tensor, lut: Tensor, err: Tensor, exp_lo: int, exp_hi: int) -> None:
    raise NotImplementedError(f"unweight::build_lut has no kernel for device {lut.device}")


@build_lut_op.register_fake
def _(table, lut, err, exp_lo, exp_hi):
    return None


@build_lut_op.register_kernel("cuda")
def _(table, lut, err, exp_lo, exp_hi):
    _ext.require_contiguous("build_lut", table, lut)
    if lut.dtype != torch.uint16 or lut.numel() != C.HUFF_NUM_CTX << C.HUFF_MAX_CODE_LEN:
        raise ValueError("build_lut: lut must be uint16 [4, 4096]")
    with torch.cuda.device_of(lut):
        _ext.cuda_module().huffman_build_lut(_ext.ptr(table), exp_lo, exp_hi, _ext.ptr(lut), _ext.ptr(err),
                                             _ext.stream(lut))


def build_lut(table: Tensor, exp_lo: int, exp_hi: int, err: Tensor) -> Tensor:
    """Huffman decode tables uint16 [4, 4096] on table's CUDA device (load time).

    table: uint8 [4, exp_hi-exp_lo+1] code lengths on the device; err: int32 [1] counter that
    invalid code lengths add to.
    """
    lut = torch.empty((C.HUFF_NUM_CTX, 1 << C.HUFF_MAX_CODE_LEN), dtype=torch.uint16, device=table.device)
    torch.ops.unweight.build_lut(table.contiguous(), lut, err, exp_lo, exp_hi)
    return lut


# ------------------------------------------------------------------------ exp_histogram


@torch.library.custom_op("unweight::exp_histogram", mutates_args=("hist",))
def exp_histogram(exps: Tensor, hist: Tensor) -> None:
    raise NotImplementedError(f"unweight::exp_histogram has no kernel for device {exps.device}")


@exp_histogram.register_fake
def _(exps, hist):
    return None


@exp_histogram.register_kernel("cpu")
def _(exps, hist):
    hist += torch.from_numpy(np.bincount(_ext.np_view(exps.contiguous()).reshape(-1), minlength=256).astype(np.int64))


@exp_histogram.register_kernel("cuda")
def _(exps, hist):
    _ext.require_contiguous("exp_histogram", exps, hist)
    if hist.dtype != torch.int64 or hist.numel() != 256:
        raise ValueError("exp_histogram: hist must be int64 [256]")
    if exps.numel() == 0:
        return
    with torch.cuda.device_of(exps):
        # The kernel adds into unsigned 64-bit counters: the same bits as int64 for any count.
        _ext.cuda_module().exp_histogram(_ext.ptr(exps), exps.numel(), _ext.ptr(hist), _ext.stream(exps))


# ------------------------------------------------------------------------ palette encode passes


@torch.library.custom_op("unweight::palette_encode", mutates_args=("idx", "flags", "row_counts", "row_offsets"))
def palette_encode(exps: Tensor, idx: Tensor, flags: Tensor, row_counts: Tensor, row_offsets: Tensor, rows: int,
                   cols: int, palette: List[int]) -> None:
    raise NotImplementedError(f"unweight::palette_encode has no kernel for device {exps.device}")


@palette_encode.register_fake
def _(exps, idx, flags, row_counts, row_offsets, rows, cols, palette):
    return None


@palette_encode.register_kernel("cuda")
def _(exps, idx, flags, row_counts, row_offsets, rows, cols, palette):
    _ext.require_contiguous("palette_encode", exps, idx, flags, row_counts, row_offsets)
    with torch.cuda.device_of(exps):
        _ext.cuda_module().palette_encode_pass1(_ext.ptr(exps), rows, cols, bytes(palette), _ext.ptr(idx),
                                                _ext.ptr(flags), _ext.ptr(row_counts), _ext.ptr(row_offsets),
                                                _ext.stream(exps))


@torch.library.custom_op("unweight::palette_verbatim", mutates_args=("vpos", "vexp"))
def palette_verbatim(exps: Tensor, flags: Tensor, row_offsets: Tensor, vpos: Tensor, vexp: Tensor, rows: int,
                     cols: int) -> None:
    raise NotImplementedError(f"unweight::palette_verbatim has no kernel for device {exps.device}")


@palette_verbatim.register_fake
def _(exps, flags, row_offsets, vpos, vexp, rows, cols):
    return None


@palette_verbatim.register_kernel("cuda")
def _(exps, flags, row_offsets, vpos, vexp, rows, cols):
    _ext.require_contiguous("palette_verbatim", exps, flags, row_offsets, vpos, vexp)
    with torch.cuda.device_of(exps):
        _ext.cuda_module().palette_encode_pass2(_ext.ptr(exps), rows, cols, _ext.ptr(flags), _ext.ptr(row_offsets),
                                                vpos.numel(), _ext.ptr(vpos), _ext.ptr(vexp), _ext.stream(exps))


# ------------------------------------------------------------------------ transcode


def _palette_header(h: TensorHeader, palette: np.ndarray, nv: int) -> TensorHeader:
    return TensorHeader(encoding=C.ENC_PALETTE, rows=h.rows, cols=h.cols, rows_per_group=h.rows_per_group,
                        cols_per_chunk=h.cols_per_chunk, crc32=h.crc32, pal_size=len(palette), pal_block=C.PAL_BLOCK,
                        num_verbatim=nv, palette=bytes(palette.tobytes()).ljust(16, b"\0"))


def transcode_to_palette(header: TensorHeader, planes: dict, lut: Tensor, err: Tensor) -> tuple[TensorHeader, dict]:
    """Re-encode a Huffman tensor as palette on its device.  Load time: reads back to the host.

    header: the Huffman tensor's header; planes: {suffix: tensor} (``__sm`` uint8 [rows, cols],
    ``__exp`` uint8, ``__off`` uint32, ``__hdr``) on one device; lut: its uint16 [4, 4096] decode
    tables on CUDA (empty on CPU); err: the device's int32 [1] error counter.
    Returns (palette header, {suffix: tensor} on the same device, ``__sm`` shared).
    """
    sm = planes[C.SUFFIX_SM]
    dev = sm.device
    if dev.type != "cuda":
        host = {s: t.detach().cpu().numpy() for s, t in planes.items()}
        enc = tc.transcode_to_palette(header, host)
        return enc.header, {s: torch.from_numpy(np.ascontiguousarray(a)).to(dev) for s, a in enc.planes.items()}
    rows, cols = header.rows, header.cols
    before = int(err.item())
    exps = torch.empty((rows, cols), dtype=torch.uint8, device=dev)
    table = torch.from_numpy(np.ascontiguousarray(header.table, dtype=np.uint8)).to(dev)
    # The checkpoint index, when the tensor has one, lets the kernel decode S-weight chains in
    # parallel instead of whole segments: this pass is the transcode's decode.
    torch.ops.unweight.decode_huffman(sm, planes[C.SUFFIX_EXP], planes[C.SUFFIX_OFF], table, lut, exps, err,
                                      rows, cols, header.rows_per_group, header.cols_per_chunk,
                                      header.exp_lo, header.exp_hi, planes.get(C.SUFFIX_CHK), header.chk_interval)
    hdr, out = _palette_from_exponents(exps, sm, header)
    if int(err.item()) != before:
        raise FormatError("corrupt exponent stream found by the GPU decoder during the palette transcode")
    return hdr, out


def encode_palette(w: Tensor, grid: tuple[int, int], crc32: int | None = None) -> tuple[TensorHeader, dict]:
    """Palette-encode a bf16 [rows, cols] matrix on its device (load time: reads two counts back
    on CUDA; the host codec on CPU): the host codec's planes for the same matrix.  grid: the
    header's segment grid (rows_per_group, cols_per_chunk); crc32: the crc32 of w's bytes when
    the caller knows it (checked on CPU), else None: the header's field is 0, for a weight held
    in memory that no reader checks.  Returns (palette header, {suffix: tensor} on w's device)."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise ValueError("encode_palette: need a bf16 [rows, cols] matrix")
    w = w.contiguous()
    rows, cols = w.shape
    if w.device.type != "cuda":
        enc = tc.encode(w.view(torch.uint16).numpy(), "palette", grid=grid)
        if crc32 is not None and enc.header.crc32 != crc32:
            raise FormatError("encode_palette: the matrix's crc32 is not the one given")
        hdr = enc.header if crc32 is not None else dataclasses.replace(enc.header, crc32=0)
        planes = {s: torch.from_numpy(np.ascontiguousarray(a)) for s, a in enc.planes.items()}
        planes[C.SUFFIX_HDR] = torch.from_numpy(hdr.pack())
        return hdr, planes
    like = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=grid[0], cols_per_chunk=grid[1],
                        crc32=0 if crc32 is None else crc32)
    bits = w.view(torch.int16)
    exps = ((bits >> 7) & 0xFF).to(torch.uint8)
    sm = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)  # FORMAT.md: sign in bit 7, mantissa below
    return _palette_from_exponents(exps, sm, like)


def _palette_from_exponents(exps: Tensor, sm: Tensor, header: TensorHeader) -> tuple[TensorHeader, dict]:
    """The palette planes of a matrix given its exponent bytes exps uint8 [rows, cols] and
    sign+mantissa bytes sm on one CUDA device; header gives the shape, grid and crc32."""
    rows, cols, dev = header.rows, header.cols, exps.device
    hist = torch.zeros(256, dtype=torch.int64, device=dev)
    torch.ops.unweight.exp_histogram(exps, hist)
    palette = tc.choose_palette(hist.cpu().numpy())  # 16 of 256 bins: the host picks, exactly as the codec
    pal = [int(b) for b in palette]
    bpr = plan.blocks_per_row(cols)
    idx = torch.empty((rows, (cols + 1) // 2), dtype=torch.uint8, device=dev)
    flags = torch.empty(rows * bpr, dtype=torch.uint8, device=dev)
    row_counts = torch.empty(rows, dtype=torch.uint32, device=dev)
    row_offsets = torch.empty(rows + 1, dtype=torch.uint32, device=dev)
    torch.ops.unweight.palette_encode(exps, idx, flags, row_counts, row_offsets, rows, cols, pal)
    nv = int(row_offsets.view(torch.int32)[rows].item())  # int32 view: torch's CUDA uint32 support is partial
    vpos = torch.empty(nv, dtype=torch.uint32, device=dev)
    vexp = torch.empty((nv, C.PAL_BLOCK), dtype=torch.uint8, device=dev)
    torch.ops.unweight.palette_verbatim(exps, flags, row_offsets, vpos, vexp, rows, cols)
    hdr = _palette_header(header, palette, nv)
    return hdr, {C.SUFFIX_HDR: torch.from_numpy(hdr.pack()).to(dev), C.SUFFIX_SM: sm, C.SUFFIX_IDX: idx,
                 C.SUFFIX_VPOS: vpos, C.SUFFIX_VEXP: vexp}
