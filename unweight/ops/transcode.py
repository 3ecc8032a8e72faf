"""Load-time ops: Huffman decode tables, the checkpoint index and the huffman -> palette transcode.

    torch.ops.unweight.build_lut(table, lut, err, exp_lo, exp_hi)          CUDA
        table uint8 [4, exp_hi-exp_lo+1] code lengths -> lut uint16 [4, 4096] decode tables.
    torch.ops.unweight.exp_histogram(exps, hist)                            CPU, CUDA
        hist int64 [256] += counts of the uint8 exponent bytes exps [...].
    torch.ops.unweight.palette_encode(exps, idx, flags, row_counts, row_offsets, rows, cols, palette)   CPU, CUDA
        exps uint8 [rows, cols] -> idx uint8 [rows, ceil(cols/2)], flags uint8 [rows * blocks per row]
        (1 = verbatim block), row_offsets uint32 [rows + 1] (exclusive scan of verbatim blocks per row;
        row_counts uint32 [rows] is scratch).
    torch.ops.unweight.palette_verbatim(exps, flags, row_offsets, vpos, vexp, rows, cols)                CPU, CUDA
        vpos uint32 [nv], vexp uint8 [nv, PAL_BLOCK] of the flagged blocks.

transcode_to_palette() strings them together (it reads two values back to the host, so it is
a load-time function, never part of a forward).  Its result is bit-identical to the host
codec's ``tensor_codec.transcode_to_palette``: same grid, palette, idx, vpos and vexp.  The
CPU kernels of palette_encode / palette_verbatim are NumPy twins of the CUDA passes, so that
sequence (transcode_passes) runs in CPU tests; a load on CPU uses the codec itself.
build_index() builds a huffman tensor's checkpoint index on its device from the stream as
stored (torch ops after the decode op, so it runs on either device), byte for byte the host
codec's ``tensor_codec.with_index``.
"""
from __future__ import annotations

import contextlib
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

__all__ = ["build_lut", "build_index", "transcode_to_palette", "transcode_passes", "encode_palette",
           "encode_palette_stack", "encode_stack_passes", "split_bf16", "exponent_bytes", "exp_histogram",
           "palette_encode", "palette_verbatim", "TRANSCODE_CHUNK_WEIGHTS"]

# The most weights whose exponent bytes a transcode decodes at once (256 MiB of scratch, about
# as much again for the palette passes): a whole MoE expert stack (Kimi K2's gate/up is 11 G
# weights) would not fit beside a model that fills the GPU.  A larger stack decodes twice.
TRANSCODE_CHUNK_WEIGHTS = 1 << 28


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


@palette_encode.register_kernel("cpu")
def _(exps, idx, flags, row_counts, row_offsets, rows, cols, palette):
    e = _ext.np_view(exps.contiguous()).reshape(rows, cols)
    bpr = plan.blocks_per_row(cols)
    pmap = np.full(256, 16, dtype=np.uint8)  # 16: not in the palette
    pmap[np.asarray(palette, dtype=np.uint8)] = np.arange(len(palette), dtype=np.uint8)
    nib = np.zeros((rows, bpr * C.PAL_BLOCK), dtype=np.uint8)  # past the row: nibble 0, never a miss
    nib[:, :cols] = pmap[e]
    miss = (nib == 16).reshape(rows, bpr, C.PAL_BLOCK).any(axis=2)
    nib.reshape(rows, bpr, C.PAL_BLOCK)[miss] = 0  # a verbatim block's indices are 0 (FORMAT.md)
    _ext.np_view(idx)[...] = (nib[:, 0::2] | (nib[:, 1::2] << 4))[:, : (cols + 1) // 2]
    _ext.np_view(flags)[...] = miss.reshape(-1)
    counts = miss.sum(axis=1, dtype=np.uint32)
    _ext.np_view(row_counts)[...] = counts
    _ext.np_view(row_offsets)[0] = 0
    _ext.np_view(row_offsets)[1:] = np.cumsum(counts, dtype=np.uint32)


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


@palette_verbatim.register_kernel("cpu")
def _(exps, flags, row_offsets, vpos, vexp, rows, cols):
    bpr = plan.blocks_per_row(cols)
    ids = np.flatnonzero(_ext.np_view(flags)).astype(np.uint32)
    if ids.size != vpos.numel():
        raise ValueError("palette_verbatim: vpos does not hold the flagged blocks")
    e = np.zeros((rows, bpr * C.PAL_BLOCK), dtype=np.uint8)  # 0 past the end of the row, as the encoder pads
    e[:, :cols] = _ext.np_view(exps.contiguous()).reshape(rows, cols)
    _ext.np_view(vpos)[...] = ids
    _ext.np_view(vexp)[...] = e.reshape(rows * bpr, C.PAL_BLOCK)[ids]


# ------------------------------------------------------------------------ transcode


def _palette_header(h: TensorHeader, palette: np.ndarray, nv: int) -> TensorHeader:
    return TensorHeader(encoding=C.ENC_PALETTE, rows=h.rows, cols=h.cols, rows_per_group=h.rows_per_group,
                        cols_per_chunk=h.cols_per_chunk, crc32=h.crc32, pal_size=len(palette), pal_block=C.PAL_BLOCK,
                        num_verbatim=nv, palette=bytes(palette.tobytes()).ljust(16, b"\0"))


def transcode_to_palette(header: TensorHeader, planes: dict, lut: Tensor, err: Tensor, variant: int = 0,
                         chunk_weights: int = TRANSCODE_CHUNK_WEIGHTS) -> tuple[TensorHeader, dict]:
    """Re-encode a Huffman tensor (a matrix or a stack) as palette on its device.  Load time:
    reads back to the host.

    header: the Huffman tensor's header; planes: {suffix: tensor} (``__sm`` uint8 [rows, cols]
    or [E, rows, cols], ``__exp`` uint8, ``__off`` uint32, ``__hdr``, ``__chk`` when indexed) on
    one device; lut: its uint16 [4, 4096] decode tables on CUDA (empty on CPU); err: the
    device's int32 [1] error counter; variant: the CUDA Huffman decoder that writes the
    exponents (runtime.kernel_plan.HUFF_VARIANTS, 0 the extension's default; the same bytes
    whichever); chunk_weights: at most this many weights' exponents are decoded at once (a
    stack larger than that decodes twice: once for the histogram, once for the planes).
    Returns (palette header, {suffix: tensor} on the same device, ``__sm`` shared).
    """
    sm = planes[C.SUFFIX_SM]
    if sm.device.type != "cuda":
        host = {s: t.detach().cpu().numpy() for s, t in planes.items()}
        # Not checked against header.crc32, as the device passes are not: a tensor-parallel
        # block's header has none of its own, and the load check runs on what the mode holds.
        enc = tc.transcode_to_palette(header, host, verify=False)
        return enc.header, _tensors(enc.planes, sm.device)
    return transcode_passes(header, planes, lut, err, variant, chunk_weights)


def transcode_passes(header: TensorHeader, planes: dict, lut: Tensor, err: Tensor, variant: int = 0,
                     chunk_weights: int = TRANSCODE_CHUNK_WEIGHTS) -> tuple[TensorHeader, dict]:
    """transcode_to_palette's device passes, on whatever device the planes are (the CPU runs
    the ops' host kernels: the same sequence, for tests; loads on CPU use the codec).

    A stack [E, rows, cols] is transcoded as its rows taken as one [E*rows, cols] matrix, as the
    codec numbers its blocks (FORMAT.md "Stacked tensors"), matrices decoded in groups of at
    most chunk_weights weights (at least one matrix) so the exponent scratch stays bounded:
    a MoE layer's expert stack is gigabytes.  Raises FormatError when the decoder counts a
    corrupt stream (nothing is returned)."""
    sm = planes[C.SUFFIX_SM]
    table = _code_table(header, sm.device)
    before = int(err.item())
    hdr, out = _stack_palette(header, sm.device, chunk_weights,
                              lambda e0, e1: _exponents(header, planes, table, lut, err, e0, e1, variant))
    if int(err.item()) != before:
        raise FormatError("corrupt exponent stream found by the GPU decoder during the palette transcode")
    return hdr, {**out, C.SUFFIX_SM: sm}


def encode_palette_stack(w: Tensor, device, chunk_weights: int = TRANSCODE_CHUNK_WEIGHTS) -> tuple[TensorHeader, dict]:
    """Palette-encode a stack of BF16 matrices w [E, rows, cols] (bf16, or its bits as uint16;
    on the host or any device) on `device`: the codec's stack encoding of w on its grid
    (tensor_codec.choose_grid(rows, cols); the header's crc32 0, for planes held in memory).  On
    CUDA at most chunk_weights weights (whole matrices, at least one) are on the device at once
    beside the planes, a stack larger than that read twice (once for the palette's histogram,
    once for the planes); elsewhere the codec encodes it.  Returns (header with stack = E,
    {suffix: tensor on device}: sm [E, rows, cols], idx [E, rows, ceil(cols/2)], vpos, vexp)."""
    dev = torch.device(device)
    if w.dim() != 3 or w.element_size() != 2:
        raise ValueError(f"encode_palette_stack: need BF16 [E, rows, cols] matrices, got {tuple(w.shape)}")
    E, rows, cols = w.shape
    grid = tc.choose_grid(rows, cols)
    if dev.type != "cuda":
        enc = tc.encode(w.view(torch.uint16).cpu().numpy(), "palette", grid=grid)
        hdr = dataclasses.replace(enc.header, crc32=0)
        return hdr, _tensors({**enc.planes, C.SUFFIX_HDR: hdr.pack()}, dev)
    return encode_stack_passes(w, dev, chunk_weights)


def encode_stack_passes(w: Tensor, dev: torch.device, chunk_weights: int = TRANSCODE_CHUNK_WEIGHTS):
    """encode_palette_stack's device passes, on whatever device `dev` is (the CPU runs the ops'
    host kernels: the same sequence, for tests)."""
    E, rows, cols = w.shape
    grid = tc.choose_grid(rows, cols)
    like = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=grid[0], cols_per_chunk=grid[1],
                        crc32=0, stack=E)
    sm = torch.empty((E, rows, cols), dtype=torch.uint8, device=dev)

    def exponents(e0: int, e1: int) -> Tensor:
        sm[e0:e1], exps = split_bf16(w[e0:e1].view(torch.int16).to(dev))
        return exps.view(-1, cols)

    hdr, out = _stack_palette(like, dev, chunk_weights, exponents)
    return hdr, {**out, C.SUFFIX_SM: sm}


def split_bf16(w: Tensor) -> tuple[Tensor, Tensor]:
    """(sign+mantissa bytes, exponent bytes), both uint8 of w's shape and device, of BF16
    weights w (bf16, or their bits as int16): FORMAT.md "The BF16 split"."""
    bits = w.view(torch.int16)
    sm = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)  # sign in bit 7, mantissa below
    return sm, exponent_bytes(bits)


def exponent_bytes(w: Tensor) -> Tensor:
    """The exponent bytes uint8 of BF16 weights w (bf16, or their bits as int16), w's shape and
    device: the low byte of the bits shifted right by 7."""
    return (w.view(torch.int16) >> 7).to(torch.uint8)


def _stack_palette(header: TensorHeader, dev, chunk_weights: int, exponents) -> tuple[TensorHeader, dict]:
    """(palette header, {hdr, idx, vpos, vexp} on dev) of the matrix or stack `header` describes
    (its shape, grid, crc32 and stack), from exponents(e0, e1): the exponent bytes uint8
    [(e1-e0)*rows, cols] of matrices e0 .. e1-1, asked for in groups of whole matrices of at
    most chunk_weights weights (at least one), twice when there is more than one group."""
    E, rows, cols = header.n_matrices, header.rows, header.cols
    _check_block_ids(E * rows * plan.blocks_per_row(cols))
    per = max(1, min(E, chunk_weights // max(1, rows * cols)))
    groups = [(e0, min(E, e0 + per)) for e0 in range(0, E, per)]
    hist = torch.zeros(256, dtype=torch.int64, device=dev)
    kept = None
    for e0, e1 in groups:
        exps = exponents(e0, e1)
        torch.ops.unweight.exp_histogram(exps, hist)
        kept = exps if len(groups) == 1 else None
    palette = tc.choose_palette(hist.cpu().numpy())  # 16 of 256 bins: the host picks, exactly as the codec
    idx, vpos, vexp = [], [], []
    for e0, e1 in groups:
        exps = kept if kept is not None else exponents(e0, e1)
        i, p, v = _palette_planes(exps, palette)
        idx.append(i)
        # Block ids count over the stack's rows taken as one matrix (uint32: the codec refuses
        # a stack with more blocks than that).
        vpos.append(p if e0 == 0 else _add_u32(p, e0 * rows * plan.blocks_per_row(cols)))
        vexp.append(v)
    hdr = _palette_header(header, palette, sum(p.numel() for p in vpos))
    if header.stack:
        hdr = dataclasses.replace(hdr, stack=header.stack, version_minor=C.MINOR_STACK)
    idx = idx[0] if len(idx) == 1 else torch.cat(idx)
    # (joined through int32 views: torch's CUDA uint32 support is partial)
    vpos = vpos[0] if len(vpos) == 1 else torch.cat([p.view(torch.int32) for p in vpos]).view(torch.uint32)
    return hdr, {C.SUFFIX_HDR: torch.from_numpy(hdr.pack()).to(dev),
                 C.SUFFIX_IDX: idx.view(header.shape[:-1] + (idx.shape[-1],)), C.SUFFIX_VPOS: vpos,
                 C.SUFFIX_VEXP: vexp[0] if len(vexp) == 1 else torch.cat(vexp)}


def _tensors(planes: dict, dev) -> dict:
    """{suffix: tensor on dev} of host planes (NumPy arrays)."""
    return {s: torch.from_numpy(np.ascontiguousarray(a)).to(dev) for s, a in planes.items()}


def _code_table(header: TensorHeader, dev) -> Tensor:
    """The header's code lengths uint8 [4, exp_hi-exp_lo+1] on dev (the decode op's table)."""
    return torch.from_numpy(np.ascontiguousarray(header.table, dtype=np.uint8)).to(dev)


# Side streams a stack's matrices decode on, round robin: one matrix's decode launches a thread
# per segment as stored (a few hundred for an expert's matrix) or a chain per S weights, far
# below what a GPU holds, so matrices one after another on one stream leave it mostly idle.
DECODE_STREAMS = 8
_STREAMS: dict = {}


def _side_streams(dev: torch.device) -> list:
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _STREAMS:
        _STREAMS[idx] = [torch.cuda.Stream(device=idx) for _ in range(DECODE_STREAMS)]
    return _STREAMS[idx]


def _exponents(header: TensorHeader, planes: dict, table: Tensor, lut: Tensor, err: Tensor, e0: int, e1: int,
               variant: int) -> Tensor:
    """uint8 [(e1-e0)*rows, cols]: the exponent bytes of matrices e0 .. e1-1 of a huffman
    tensor (a matrix: 0 .. 1), decoded on the planes' device; errors go to err.  On CUDA the
    matrices of a stack decode concurrently on side streams that the current stream waits for."""
    sm = planes[C.SUFFIX_SM]
    E, rows, cols = header.n_matrices, header.rows, header.cols
    out = torch.empty(((e1 - e0) * rows, cols), dtype=torch.uint8, device=sm.device)
    chk = planes.get(C.SUFFIX_CHK)
    streams = _side_streams(sm.device) if sm.device.type == "cuda" and e1 - e0 > 1 else []
    main = torch.cuda.current_stream(sm.device) if streams else None
    for st in streams:
        st.wait_stream(main)  # the planes and `out` were made on the current stream
    for e in range(e0, e1):
        # Matrix e is a 2-D tensor whose offsets are absolute in the shared stream and whose
        # index rows are its own segments' (FORMAT.md "Stacked tensors", "Checkpoint index").
        # The index, when the tensor has one, lets the kernel decode S-weight chains in
        # parallel instead of whole segments.
        s0, s1 = tc.matrix_segments(header, e)
        with torch.cuda.stream(streams[(e - e0) % len(streams)]) if streams else contextlib.nullcontext():
            torch.ops.unweight.decode_huffman(sm.view(E, rows, cols)[e], planes[C.SUFFIX_EXP],
                                              planes[C.SUFFIX_OFF][s0:s1 + 1], table, lut,
                                              out[(e - e0) * rows:(e - e0 + 1) * rows], err, rows, cols,
                                              header.rows_per_group, header.cols_per_chunk, header.exp_lo,
                                              header.exp_hi, None if chk is None else chk[s0:s1],
                                              header.chk_interval, variant)
    for st in streams:
        main.wait_stream(st)  # `out` is used (and freed) on the current stream after this
    return out


def build_index(header: TensorHeader, planes: dict, lut: Tensor, err: Tensor,
                chk_interval: int = C.LOAD_CHK_INTERVAL, variant: int = 0,
                band_weights: int = 1 << 26) -> tuple[TensorHeader, dict] | None:
    """The checkpoint index of a huffman matrix or stack (FORMAT.md "Checkpoint index"), built
    on the planes' device: (header with chk_interval, planes plus ``__chk`` uint16 [n_seg, P]
    (a stack: [E * n_seg, P]) and the new ``__hdr``, on that device), byte for byte what
    ``tensor_codec.with_index`` builds on the host; None when the tensor takes none (palette,
    indexed already, every segment one chain).  Load time: reads the error counter back.

    The stream is decoded to exponent bytes as stored (one chain per segment: the one serial
    pass, a stack's matrices concurrently on side streams), and the index is a function of the code lengths alone: each
    weight's length is looked up from its context (the sign+mantissa byte) and exponent, and
    an entry is the sum of S consecutive lengths of a segment (segments row-major inside,
    chunk-major in the plane), summed about band_weights weights at a time: several whole
    matrices of a stack, or a band of whole row groups of one matrix.  lut / err / variant: as
    transcode_to_palette's.  Raises FormatError when the decoder counts a corrupt stream."""
    if header.encoding != C.ENC_HUFFMAN or header.chk_interval:
        return None
    hdr = dataclasses.replace(header, chk_interval=chk_interval, version_minor=max(header.version_minor, C.MINOR_CHK))
    P, S = hdr.chk_cols, chk_interval
    if not P:
        return None
    sm = planes[C.SUFFIX_SM]
    dev = sm.device
    E, N, K, R, Cw = header.n_matrices, header.rows, header.cols, header.rows_per_group, header.cols_per_chunk
    ng, nc = header.n_groups, header.n_chunks
    lens = torch.from_numpy(tc.index_lens(header).reshape(-1)).to(dev)  # [ctx * 256 + exponent]
    table = _code_table(header, dev)
    chk = torch.zeros((E, nc, ng, P), dtype=torch.int32, device=dev)
    m = torch.arange(1, P + 1, device=dev) * S  # entry m-1 is used while m * S < the segment's weights
    # Units of work: several whole matrices of a stack at once when they fit in band_weights
    # (one set of torch launches for all of them: a MoE stack has hundreds), else bands of
    # whole row groups of one matrix.
    per = band_weights // max(1, N * K)
    if per >= 1:
        units = [(e0, min(E, e0 + per), 0, N) for e0 in range(0, E, per)]
    else:
        band = max(1, band_weights // max(1, R * K)) * R
        units = [(e, e + 1, r0, min(N, r0 + band)) for e in range(E) for r0 in range(0, N, band)]
    smv = sm.view(E, N, K)
    before = int(err.item())
    exps, held = None, None
    for e0, e1, r0, r1 in units:
        if held != (e0, e1):
            exps = _exponents(header, planes, table, lut, err, e0, e1, variant).view(e1 - e0, N, K)
            held = (e0, e1)
        g0, gb, nm = r0 // R, -(-(r1 - r0) // R), e1 - e0
        key = ((smv[e0:e1, r0:r1] >> C.HUFF_CTX_SHIFT) & (C.HUFF_NUM_CTX - 1)).to(torch.int32) << 8
        L = lens[key | exps[:, r0:r1].to(torch.int32)]  # uint8 [nm, r1 - r0, K]: each weight's code length
        rows_g = torch.clamp(N - torch.arange(g0, g0 + gb, device=dev) * R, max=R)  # rows of each group
        for c in range(nc):
            k0 = c * Cw
            w = min(Cw, K - k0)
            seg = torch.zeros((nm, gb * R, w), dtype=torch.uint8, device=dev)  # a matrix's short last group: 0s
            seg[:, :r1 - r0] = L[:, :, k0:k0 + w]
            flat = torch.zeros((nm * gb, (P + 1) * S), dtype=torch.uint8, device=dev)  # n_s <= n_max <= (P+1)*S
            flat[:, :R * w] = seg.view(nm * gb, R * w)
            sums = flat.view(nm, gb, P + 1, S).sum(dim=3, dtype=torch.int32)[:, :, :P]
            chk[e0:e1, c, g0:g0 + gb] = sums * (m[None, :] < (rows_g * w)[:, None])
    if int(err.item()) != before:
        raise FormatError("corrupt exponent stream found by the GPU decoder while building the checkpoint index")
    # uint16 entries (<= 12 * S <= 49152) through an int16 view: torch's CUDA uint16 support is partial.
    chk = torch.where(chk >= 1 << 15, chk - (1 << 16), chk).to(torch.int16).view(torch.uint16)
    return hdr, {**planes, C.SUFFIX_HDR: torch.from_numpy(hdr.pack()).to(dev),
                 C.SUFFIX_CHK: chk.view(E * header.n_segments, P)}


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
        return hdr, _tensors({**enc.planes, C.SUFFIX_HDR: hdr.pack()}, w.device)
    like = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=grid[0], cols_per_chunk=grid[1],
                        crc32=0 if crc32 is None else crc32)
    sm, exps = split_bf16(w)
    hdr, out = _stack_palette(like, w.device, rows * cols, lambda e0, e1: exps)
    return hdr, {**out, C.SUFFIX_SM: sm}


def _palette_planes(exps: Tensor, palette: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """(idx uint8 [rows, ceil(cols/2)], vpos uint32 [nv], vexp uint8 [nv, PAL_BLOCK]) of the
    exponent bytes exps uint8 [rows, cols] under `palette` (uint8 entries), on exps' device."""
    rows, cols, dev = exps.shape[0], exps.shape[1], exps.device
    bpr = plan.blocks_per_row(cols)
    _check_block_ids(rows * bpr)
    idx = torch.empty((rows, (cols + 1) // 2), dtype=torch.uint8, device=dev)
    flags = torch.empty(rows * bpr, dtype=torch.uint8, device=dev)
    row_counts = torch.empty(rows, dtype=torch.uint32, device=dev)
    row_offsets = torch.empty(rows + 1, dtype=torch.uint32, device=dev)
    torch.ops.unweight.palette_encode(exps, idx, flags, row_counts, row_offsets, rows, cols, [int(b) for b in palette])
    nv = int(row_offsets.view(torch.int32)[rows].item())  # int32 view: torch's CUDA uint32 support is partial
    vpos = torch.empty(nv, dtype=torch.uint32, device=dev)
    vexp = torch.empty((nv, C.PAL_BLOCK), dtype=torch.uint8, device=dev)
    torch.ops.unweight.palette_verbatim(exps, flags, row_offsets, vpos, vexp, rows, cols)
    return idx, vpos, vexp


def _check_block_ids(blocks: int) -> None:
    """ValueError when a palette tensor has more 32-weight blocks than uint32 verbatim ids
    number (the codec refuses the same tensors)."""
    if blocks > 0xFFFFFFFF:
        raise ValueError(f"a palette tensor of {blocks} blocks has more than uint32 verbatim ids can number")


def _add_u32(v: Tensor, base: int) -> Tensor:
    """v uint32 [n] + base (the sums < 2**32) as uint32, through int64 arithmetic on an int32
    view (torch's CUDA uint32 support is partial)."""
    q = (v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) + base
    return torch.where(q >= 1 << 31, q - (1 << 32), q).to(torch.int32).view(torch.uint32)
