"""Encode and decode one BF16 matrix to and from its format-v1 planes (CPU, C++ codec).

All arrays are NumPy, on the host.  BF16 words travel as ``uint16`` so no dtype conversion
ever touches the bits.  The planes of an encoded tensor ``<name>`` are keyed by suffix
(``__hdr``, ``__sm``, ...) as listed in unweight.format.constants.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from .. import _C
from ..format import constants as C
from ..format.errors import ChecksumError, FormatError
from ..format.header import TensorHeader
from .crc import crc32_combine

ENCODINGS = ("huffman", "palette", "auto")


# Outputs of 1 MiB and more come from _C.host_empty rather than np.empty: NumPy advises
# MADV_HUGEPAGE on arrays >= 4 MiB, which can stall first touches in compaction, and the
# first touch of fresh pages costs as much as decoding; host_alloc in csrc/cpu_codec.cpp has
# the policy (pre-faulted pages, a bounded cache of freed buffers) and the measurements.
_HOST_MIN_BYTES = 1 << 20


def empty(shape, dtype, threads: int = 1) -> np.ndarray:
    """Uninitialized host array of `shape` and `dtype` (freed with the array); `threads`
    share the pre-faulting of a large one."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < _HOST_MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    return _C.host_empty(nbytes, threads).view(dtype).reshape(shape)


def release_host_cache() -> int:
    """Unmap the freed decode buffers the codec keeps for reuse (at most 128 MiB); returns the
    bytes released."""
    return int(_C.host_cache_clear())


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def row_crcs(w: np.ndarray, threads: int | None = None) -> np.ndarray:
    """uint32 [N]: crc32 of each row's bytes of a C-contiguous [N, K] array (N >= 1)."""
    return _C.crc32_rows(w.reshape(-1).view(np.uint8), w.shape[0], threads or default_threads())


@dataclasses.dataclass
class Encoded:
    """An encoded matrix: parsed header, planes by suffix, and statistics for reports."""

    header: TensorHeader
    planes: dict
    stats: dict

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.planes.values())


def tp_splits(n: int) -> int:
    """Ways the writer's grid lets a matrix's rows (n of them) split for tensor parallelism:
    the largest p in (8, 4, 2) that cuts n into p equal parts, each a multiple of PAL_BLOCK;
    1 if none."""
    return next((p for p in (8, 4, 2) if n % (C.PAL_BLOCK * p) == 0), 1)


def col_splits(n: int, stacked: bool = False) -> int:
    """Column chunks the writer cuts n columns into: 8 when n is a multiple of 256 (row-parallel
    shards at TP 2, 4 and 8 start on chunk edges); otherwise the largest p in (4, 2) that
    leaves chunks of >= 512 columns, each a multiple of PAL_BLOCK (narrow chunks cost the
    CPU decoder up to ~15% on small matrices, so they are cut only where TP needs them); 1 if
    none.  stacked (the matrices of a 3-D stack): 16 where that leaves chunks of >= 512
    columns, each a multiple of PAL_BLOCK, so that each half of a fused [gate | up] column
    axis (Llama 4's gate_up_proj [E, H, 2I]) splits 8 ways on chunk edges too."""
    if stacked and n % (16 * C.PAL_BLOCK) == 0 and n // 16 >= 512:
        return 16
    if n % (8 * C.PAL_BLOCK) == 0:
        return 8
    return next((p for p in (4, 2) if n % (C.PAL_BLOCK * p) == 0 and n // p >= 512), 1)


def choose_grid(rows: int, cols: int, segment_weights: int = C.DEFAULT_SEGMENT_WEIGHTS,
                stacked: bool = False) -> tuple[int, int]:
    """Writer policy for the segment grid (R rows x C columns); readers take it from the header.

    The writer does not know whether a matrix will be column-parallel (split by rows) or
    row-parallel (split by columns), so both axes split on segment edges: C = cols /
    col_splits(cols), and R divides rows / p for p = tp_splits(rows).  Segments are kept large
    by growing R, never by widening C: R is the smallest divisor of rows / p with R * C >=
    segment_weights (rows / p itself when none is big enough).  Rows that do not split (p = 1)
    take the smallest power of two with R * C >= segment_weights, capped at the power of two
    >= rows.  With 8192 weights per segment (the default) one uint32 offset costs <= 0.004
    bit/weight wherever the target is reached; smaller segments buy GPU decode parallelism for
    ~32/segment_weights bit/weight.
    """
    C_ = cols // col_splits(cols, stacked)
    want = max(1, math.ceil(segment_weights / C_))
    p = tp_splits(rows)
    if p > 1:
        unit = rows // p
        R = next((d for d in range(min(want, unit), unit + 1) if unit % d == 0), unit)
    else:
        R = min(1 << (want - 1).bit_length(), 1 << (rows - 1).bit_length())
    return R, C_


def _entropy(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    if c.size == 0:
        return 0.0
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


def choose_palette(exp_counts: np.ndarray) -> np.ndarray:
    """The palette of a tensor: up to 16 most frequent exponents, by count desc then value asc."""
    present = np.flatnonzero(exp_counts)
    order = sorted(present, key=lambda e: (-int(exp_counts[e]), int(e)))
    return np.array(order[: C.PAL_MAX_ENTRIES], dtype=np.uint8)


def _stats(hist: np.ndarray, palette: np.ndarray) -> dict:
    exp_counts = hist.sum(axis=0)
    n = int(exp_counts.sum())
    cov = float(exp_counts[palette].sum()) / n if n else 1.0
    return {"exp_entropy": _entropy(exp_counts), "palette_coverage": cov}


def encode(w: np.ndarray, encoding: str = "huffman", segment_weights: int = C.DEFAULT_SEGMENT_WEIGHTS,
           threads: int | None = None, grid: tuple[int, int] | None = None,
           chk_interval: int = 0, band_bytes: int = 0, done=None) -> Encoded:
    """Encode a BF16 matrix, or a stack of matrices.

    w: uint16 [N, K] (BF16 bit patterns), or [E, N, K] with 1 <= E <= MAX_STACK (a stack:
        E matrices sharing one code table / palette, each cut on its own grid, so one of them
        decodes alone; FORMAT.md "Stacked tensors"), C-contiguous, host memory.
    encoding: "huffman", "palette" or "auto" (the smaller of the two).
    grid: (R, C) to use instead of choose_grid's (transcoding keeps the source grid).
    chk_interval: huffman 2-D matrices: S, the symbols between checkpoints of the ``__chk`` index
        (FORMAT.md "Checkpoint index"; C.DEFAULT_CHK_INTERVAL is the GPU decoder's choice); 0
        (the default) writes no index, nor does a grid whose segments hold at most S weights.
    band_bytes, done: huffman 2-D matrices: read w in bands of whole row groups of about
        band_bytes (0: at once), calling done(r0, r1) after each band's last read in each of the
        two passes, so a caller reading w from a memory map can drop its pages as it goes and
        hold the planes plus one band, not the matrix plus the planes.  Same bytes either way.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    threads = threads or default_threads()
    w = np.ascontiguousarray(w, dtype=np.uint16)
    if w.ndim not in (2, 3) or w.size == 0 or (w.ndim == 3 and w.shape[0] > C.MAX_STACK):
        raise ValueError(f"only non-empty 2-D tensors and 3-D stacks of at most {C.MAX_STACK} matrices are "
                         f"encoded, got shape {w.shape}")
    stack = w.shape[0] if w.ndim == 3 else 0
    rows, cols = w.shape[-2:]
    if stack and encoding != "huffman" and stack * rows * -(-cols // C.PAL_BLOCK) > 0xFFFFFFFF:
        raise ValueError(f"a palette stack of shape {w.shape} has more blocks than uint32 verbatim ids can "
                         f"name; split this tensor before compressing")
    sm = empty(w.shape, np.uint8, threads)
    R, C_ = grid or choose_grid(rows, cols, segment_weights, stacked=bool(stack))
    bands = _bands(rows, cols, R, band_bytes) if band_bytes and encoding == "huffman" and not stack else None
    hist = np.zeros((C.HUFF_NUM_CTX, 256), dtype=np.int64)
    if bands is None:
        crc = _C.split_histogram(w, sm, hist, threads)
    else:
        crc, part = None, np.zeros_like(hist)
        for r0, r1 in bands:
            c = _C.split_histogram(w[r0:r1], sm[r0:r1], part, threads)
            hist += part
            crc = c if crc is None else _crc32_combine(crc, c, (r1 - r0) * cols * 2)
            if done is not None:
                done(r0, r1)
    palette = choose_palette(hist.sum(axis=0))
    stats = _stats(hist, palette)
    enc_h = enc_p = None
    if encoding in ("huffman", "auto"):
        enc_h = _encode_huffman(w, sm, hist, crc, R, C_, threads, chk_interval, bands, done)
    if encoding in ("palette", "auto"):
        enc_p = _encode_palette(w, sm, palette, crc, R, C_, threads)
    for enc in (enc_h, enc_p):
        if enc is not None and stack:
            enc.header.stack = stack
            enc.header.version_minor = max(enc.header.version_minor, C.MINOR_STACK)
            enc.planes[C.SUFFIX_HDR] = enc.header.pack()
    if encoding == "huffman":
        out = enc_h
    elif encoding == "palette":
        out = enc_p
    else:
        out = enc_h if enc_h.nbytes <= enc_p.nbytes else enc_p
    if enc_p is not None:
        stats["verbatim_fraction"] = enc_p.stats["verbatim_fraction"]
    out.stats.update(stats)
    return out


def _encode_stack(w, R, C_, lens, codes, threads):
    """Huffman-encode the matrices of a stack w [E, N, K] one after another: their segments
    back to back in one stream, offsets counted from the stream's start (uint32 [E*S + 1])."""
    offs, parts, base = [], [], 0
    for e in range(w.shape[0]):
        off_e, stream_e = _C.huffman_encode(w[e], R, C_, lens, codes, threads)
        n = int(off_e[-1])
        if base + n > 0xFFFFFFFF:
            raise ValueError(f"the exponent stream of this {w.shape} stack reaches 4 GiB, more than uint32 "
                             f"offsets index")
        offs.append(off_e[:-1].astype(np.uint64) + base)
        parts.append(stream_e[:n])
        base += n
    off = np.concatenate(offs + [np.array([base], dtype=np.uint64)]).astype(np.uint32)
    stream = np.concatenate(parts + [np.zeros(C.STREAM_SLACK_BYTES, dtype=np.uint8)])
    return off, stream


def _bands(rows: int, cols: int, R: int, band_bytes: int) -> list:
    """[(r0, r1)] row bands of whole row groups, about band_bytes of BF16 each."""
    step = max(1, band_bytes // max(1, cols * 2 * R)) * R
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def _crc32_combine(a: int, b: int, len_b: int) -> int:
    return int(crc32_combine(a, b, len_b))


def _encode_bands(w, bands, R, C_, lens, codes, threads, chk_interval, done):
    """_C.huffman_encode_indexed of w, a band of row groups at a time: each band's segments are
    the whole matrix's segments of those groups (independent, same code), so the stream is the
    bands' per-chunk runs in chunk-major order."""
    parts = []
    for r0, r1 in bands:
        parts.append((r0, r1) + tuple(_C.huffman_encode_indexed(w[r0:r1], R, C_, lens, codes, threads, chk_interval)))
        if done is not None:
            done(r0, r1)
    n_chunks = -(-w.shape[1] // C_)
    runs, chks, lens_ = [], [], []
    for k in range(n_chunks):
        for r0, r1, off, stream, chk in parts:
            ng = -(-(r1 - r0) // R)
            a, b = int(off[k * ng]), int(off[(k + 1) * ng])
            runs.append(stream[a:b])
            chks.append(chk[k * ng:(k + 1) * ng])
            lens_.append(np.diff(off[k * ng:(k + 1) * ng + 1].astype(np.int64)))
    seg = np.concatenate(lens_)
    if int(seg.sum()) > 0xFFFFFFFF:
        raise ValueError(f"the exponent stream of this {w.shape} matrix reaches 4 GiB, more than uint32 offsets index")
    off = np.zeros(seg.size + 1, dtype=np.uint32)
    off[1:] = np.cumsum(seg)
    stream = np.concatenate(runs + [np.zeros(C.STREAM_SLACK_BYTES, dtype=np.uint8)])
    # A last band shorter than R has fewer checkpoints per segment; the whole matrix's index is
    # as wide as its largest segment needs, unused entries zero.
    P = max(c.shape[1] for c in chks)
    chk = np.zeros((seg.size, P), dtype=np.uint16)
    i = 0
    for c in chks:
        chk[i:i + c.shape[0], :c.shape[1]] = c
        i += c.shape[0]
    return off, stream, chk


def _encode_huffman(w, sm, hist, crc, R, C_, threads, chk_interval=0, bands=None, done=None) -> Encoded:
    rows, cols = w.shape[-2:]
    # C++ package-merge + canonical codes; unweight.codec.huffman is the Python twin the
    # tests compare it with.
    lens, codes = _C.huffman_tables(hist)
    present = np.flatnonzero(hist.sum(axis=0))
    lo, hi = int(present[0]), int(present[-1])
    chk = None  # the checkpoint index: uint16 [n_seg, P], 2-D matrices only
    try:
        if w.ndim == 3:
            off, stream = _encode_stack(w, R, C_, lens, codes, threads)
        elif bands is not None:
            off, stream, chk = _encode_bands(w, bands, R, C_, lens, codes, threads, chk_interval, done)
        else:
            off, stream, chk = _C.huffman_encode_indexed(w, R, C_, lens, codes, threads, chk_interval)
    except ValueError as e:  # the 4 GiB per-tensor stream limit of uint32 offsets
        raise ValueError(f"{e}; split this tensor before compressing") from None
    bits = float(stream.size - C.STREAM_SLACK_BYTES) * 8
    indexed = chk is not None and chk.shape[1] > 0  # none when every segment fits in one chain
    hdr = TensorHeader(encoding=C.ENC_HUFFMAN, rows=rows, cols=cols, rows_per_group=R, cols_per_chunk=C_,
                       crc32=crc, max_code_len=C.HUFF_MAX_CODE_LEN, num_ctx=C.HUFF_NUM_CTX,
                       exp_lo=lo, exp_hi=hi, table=lens[:, lo:hi + 1].copy(),
                       chk_interval=chk_interval if indexed else 0, version_minor=C.MINOR_CHK if indexed else 0)
    planes = {C.SUFFIX_HDR: hdr.pack(), C.SUFFIX_SM: sm, C.SUFFIX_EXP: stream, C.SUFFIX_OFF: off}
    if indexed:
        planes[C.SUFFIX_CHK] = chk
    return Encoded(hdr, planes, {"exp_bits_per_weight": bits / w.size,
                                 "index_bits_per_weight": (chk.size * 16 / w.size) if indexed else 0.0})


def _encode_palette(w, sm, palette, crc, R, C_, threads) -> Encoded:
    rows, cols = w.shape[-2:]
    pmap = np.full(256, -1, dtype=np.int16)
    pmap[palette] = np.arange(len(palette), dtype=np.int16)
    idx = empty(w.shape[:-1] + ((cols + 1) // 2,), np.uint8, threads)
    # A stack's blocks are numbered over its rows taken as one [E*N, K] matrix.
    vpos, vexp = _C.palette_encode(w.reshape(-1, cols), pmap, idx.reshape(-1, idx.shape[-1]), threads)
    nblocks = (w.size // cols) * -(-cols // C.PAL_BLOCK)
    hdr = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=R, cols_per_chunk=C_,
                       crc32=crc, pal_size=len(palette), pal_block=C.PAL_BLOCK, num_verbatim=len(vpos),
                       palette=bytes(palette.tobytes()).ljust(16, b"\0"))
    planes = {C.SUFFIX_HDR: hdr.pack(), C.SUFFIX_SM: sm, C.SUFFIX_IDX: idx, C.SUFFIX_VPOS: vpos,
              C.SUFFIX_VEXP: vexp}
    return Encoded(hdr, planes, {"verbatim_fraction": len(vpos) / nblocks if nblocks else 0.0})


# ----------------------------------------------------------------------------- decoding


def planes_for(header: TensorHeader) -> tuple:
    """Suffixes of the planes the tensor stores: the encoding's, plus ``__chk`` when indexed."""
    if header.encoding != C.ENC_HUFFMAN:
        return C.PALETTE_PLANES
    return C.HUFFMAN_PLANES + ((C.SUFFIX_CHK,) if header.chk_interval else ())


def plane_shapes(header: TensorHeader) -> dict:
    """{suffix: (NumPy dtype, shape)} of the planes the header describes, but its ``__hdr``
    (FORMAT.md, "Checkpoint container"); shape None for ``__exp``, whose length its offsets give."""
    k = header.cols
    want = {C.SUFFIX_SM: (np.uint8, header.shape)}
    if header.encoding == C.ENC_HUFFMAN:
        want[C.SUFFIX_OFF] = (np.uint32, (header.n_matrices * header.n_segments + 1,))
        want[C.SUFFIX_EXP] = (np.uint8, None)
        if header.chk_interval:
            want[C.SUFFIX_CHK] = (np.uint16, (header.n_matrices * header.n_segments, header.chk_cols))
    else:
        want[C.SUFFIX_IDX] = (np.uint8, header.shape[:-1] + ((k + 1) // 2,))
        want[C.SUFFIX_VPOS] = (np.uint32, (header.num_verbatim,))
        want[C.SUFFIX_VEXP] = (np.uint8, (header.num_verbatim, C.PAL_BLOCK))
    return want


def check_planes(header: TensorHeader, planes: dict, where: str = "") -> None:
    """Validate plane presence, dtypes and shapes against the header; FormatError otherwise."""
    at = f" of {where}" if where else ""
    want = plane_shapes(header)
    if header.encoding == C.ENC_HUFFMAN and not header.chk_interval and C.SUFFIX_CHK in planes:
        raise FormatError(f"plane {C.SUFFIX_CHK}{at} is present but the header has no checkpoint interval")
    for suf, (dt, shape) in want.items():
        if suf not in planes:
            raise FormatError(f"missing plane {suf}{at}")
        a = planes[suf]
        if a.dtype != dt or (shape is not None and tuple(a.shape) != shape):
            raise FormatError(f"plane {suf}{at} has dtype {a.dtype} shape {tuple(a.shape)}, "
                              f"expected {np.dtype(dt)} {shape}")
    if header.encoding == C.ENC_HUFFMAN:
        exp = planes[C.SUFFIX_EXP]
        off = planes[C.SUFFIX_OFF]
        if exp.ndim != 1 or off[0] != 0 or int(off[-1]) + C.STREAM_SLACK_BYTES != exp.size:
            raise FormatError(f"exponent stream length {exp.size} does not match its offsets{at}")
        if header.chk_interval and isinstance(off, np.ndarray):  # device stand-ins: shapes only
            check_index_bounds(header, off, planes[C.SUFFIX_CHK], where)


def index_sizes(header: TensorHeader) -> np.ndarray:
    """int64 [n_seg]: the checkpoints each segment uses, ceil(n_s / S) - 1 for its n_s weights
    (its row's entries past that count are 0)."""
    R, Cc, S = header.rows_per_group, header.cols_per_chunk, header.chk_interval
    ng, nc = header.n_groups, header.n_chunks
    rows = np.minimum(R, header.rows - np.arange(ng) * R)  # rows of each group
    cols = np.minimum(Cc, header.cols - np.arange(nc) * Cc)  # columns of each chunk
    n_s = (cols[:, None] * rows[None, :]).reshape(-1)  # chunk-major: s = c * ng + g
    return np.tile(-(-n_s // S) - 1, header.n_matrices)


def check_index_bounds(header: TensorHeader, off: np.ndarray, chk: np.ndarray, where: str = "") -> None:
    """The checks of the ``__chk`` index that need no decoding (FORMAT.md "Checkpoint index"):
    unused entries are 0, a used one is between S and 12 S bits, and a segment's checkpoints
    lie inside it.  Whether each one lands exactly on its symbol only a decoder that starts
    there can tell (the reference decoder and the CUDA kernels check it)."""
    at = f" of {where}" if where else ""
    S = header.chk_interval
    used = np.arange(chk.shape[1])[None, :] < index_sizes(header)[:, None]
    d = chk.astype(np.int64)
    seg_bits = np.diff(off.astype(np.int64)) * 8
    if (d[~used] != 0).any() or ((d < S) & used).any() or (d > S * C.HUFF_MAX_CODE_LEN).any() \
            or (d.sum(axis=1) >= np.maximum(seg_bits, 1)).any():
        raise FormatError(f"checkpoint index{at} does not fit its segments (unused entries not 0, an entry "
                          f"outside [{S}, {S * C.HUFF_MAX_CODE_LEN}] bits, or checkpoints past a segment's end)")


def decode(header: TensorHeader, planes: dict, threads: int | None = None, where: str = "",
           verify: bool = True) -> np.ndarray:
    """Decode the whole tensor: uint16 [N, K] (a stack: [E, N, K]) BF16 bit patterns, host memory.

    verify: compare the crc32 of the result with the header's (ChecksumError on mismatch).
    """
    threads = threads or default_threads()
    check_planes(header, planes, where)
    out = empty(header.shape, np.uint16, threads)
    at = f" in {where}" if where else ""
    try:
        if header.stack:
            for e in range(header.stack):
                _decode_matrix_into(header, planes, e, out[e], threads)
        elif header.encoding == C.ENC_HUFFMAN:
            _C.huffman_decode(planes[C.SUFFIX_EXP], planes[C.SUFFIX_OFF], header.rows, header.cols,
                              header.rows_per_group, header.cols_per_chunk, header.table, header.exp_lo,
                              header.exp_hi, 0, header.n_groups, 0, header.n_chunks, planes[C.SUFFIX_SM],
                              out, threads)
        else:
            _C.palette_decode(planes[C.SUFFIX_SM], planes[C.SUFFIX_IDX], header.rows, header.cols, 0,
                              header.rows, np.frombuffer(header.palette[: header.pal_size], np.uint8),
                              planes[C.SUFFIX_VPOS], planes[C.SUFFIX_VEXP], out, threads)
    except ValueError as e:
        raise FormatError(f"{e}{at}") from None
    if verify and _C.crc32(out.reshape(-1).view(np.uint8), threads) != header.crc32:
        raise ChecksumError(f"checksum mismatch{at}: decoded bytes differ from the original")
    return out


def decode_banded(header: TensorHeader, planes: dict, threads: int | None = None, where: str = "",
                  band_bytes: int = 64 << 20, keep: bool = True, done=None, each=None) -> np.ndarray | None:
    """decode(..., verify=True) a band of whole row groups (about band_bytes of output) at a
    time, the crc32 joined across bands, calling each(r0, r1, band) with the band's decoded
    rows (uint16 [r1 - r0, K], host), then done(r0, r1) after each band (a caller reading
    the planes from a memory map drops that band's ``__sm`` rows there).  keep: return the
    uint16 [N, K] matrix (host memory); otherwise only check it, holding one band of output.
    Stacks decode whole (decode)."""
    if header.stack:
        out = decode(header, planes, threads, where, verify=True)
        return out if keep else None
    threads = threads or default_threads()
    check_planes(header, planes, where)
    rows, cols = header.rows, header.cols
    huff = header.encoding == C.ENC_HUFFMAN
    R = header.rows_per_group if huff else 1
    out = empty((rows, cols), np.uint16, threads) if keep else None
    sm = planes[C.SUFFIX_SM]
    crc = None
    at = f" in {where}" if where else ""
    for r0, r1 in _bands(rows, cols, R, band_bytes):
        dst = out[r0:r1] if keep else empty((r1 - r0, cols), np.uint16, threads)
        try:
            if huff:
                _C.huffman_decode(planes[C.SUFFIX_EXP], planes[C.SUFFIX_OFF], rows, cols, R, header.cols_per_chunk,
                                  header.table, header.exp_lo, header.exp_hi, r0 // R, -(-r1 // R), 0,
                                  header.n_chunks, sm[r0:r1], dst, threads)
            else:
                _C.palette_decode(sm[r0:r1], planes[C.SUFFIX_IDX][r0:r1], rows, cols, r0, r1,
                                  np.frombuffer(header.palette[: header.pal_size], np.uint8), planes[C.SUFFIX_VPOS],
                                  planes[C.SUFFIX_VEXP], dst, threads)
        except ValueError as e:
            raise FormatError(f"{e}{at}") from None
        c = _C.crc32(dst.reshape(-1).view(np.uint8), threads)
        crc = c if crc is None else _crc32_combine(crc, c, (r1 - r0) * cols * 2)
        if each is not None:
            each(r0, r1, dst)
        if done is not None:
            done(r0, r1)
    if crc != header.crc32:
        raise ChecksumError(f"checksum mismatch{at}: decoded bytes differ from the original")
    return out


def matrix_segments(header: TensorHeader, e: int) -> tuple[int, int]:
    """The entries [s0, s1] (inclusive) of a stack's ``__off`` plane that index matrix e: its
    segments are s0 .. s1-1, its stream bytes off[s0] .. off[s1]."""
    s = header.n_segments
    return e * s, (e + 1) * s


def _decode_matrix_into(header: TensorHeader, planes: dict, e: int, out: np.ndarray, threads: int) -> None:
    n, k = header.rows, header.cols
    if header.encoding == C.ENC_HUFFMAN:
        # Matrix e is a 2-D huffman tensor whose offsets start at off[s0] instead of 0: its
        # segments' byte positions are absolute in the shared stream.
        s0, s1 = matrix_segments(header, e)
        _C.huffman_decode(planes[C.SUFFIX_EXP], planes[C.SUFFIX_OFF][s0:s1 + 1], n, k, header.rows_per_group,
                          header.cols_per_chunk, header.table, header.exp_lo, header.exp_hi, 0, header.n_groups, 0,
                          header.n_chunks, planes[C.SUFFIX_SM][e], out, threads)
    else:
        # Verbatim block ids count rows over the whole stack: matrix e is rows [e*N, (e+1)*N).
        _C.palette_decode(planes[C.SUFFIX_SM][e], planes[C.SUFFIX_IDX][e], header.n_matrices * n, k, e * n,
                          (e + 1) * n, np.frombuffer(header.palette[: header.pal_size], np.uint8),
                          planes[C.SUFFIX_VPOS], planes[C.SUFFIX_VEXP], out, threads)


def matrix_planes(header: TensorHeader, planes: dict, e: int) -> tuple[TensorHeader, dict]:
    """Matrix e of a stack as a tensor of its own: (header of an [N, K] matrix with crc32 0
    and no checkpoint index, planes).  The planes are views of the stack's where they can be
    (sign+mantissa and index bytes, the stream), with offsets and verbatim block ids rebased to
    the matrix, so a shard of it (codec.shard.shard_planes) reads only its own bytes."""
    if not header.stack or not 0 <= e < header.stack:
        raise IndexError(f"matrix {e} of a tensor of shape {header.shape}")
    h, out = stack_slice(header, planes, e, e + 1)  # a one-matrix stack, taken as a matrix
    new = dataclasses.replace(h, stack=0, chk_interval=0)
    out[C.SUFFIX_SM] = out[C.SUFFIX_SM][0]
    if C.SUFFIX_IDX in out:
        out[C.SUFFIX_IDX] = out[C.SUFFIX_IDX][0]
    out[C.SUFFIX_HDR] = new.pack()
    return new, out


def stack_slice(header: TensorHeader, planes: dict, e0: int, e1: int) -> tuple[TensorHeader, dict]:
    """Matrices [e0, e1) of a stack as a stack of their own (an expert-parallel rank's experts):
    (header with stack e1 - e0 and crc32 0, planes).  Views of the stack's planes where they
    can be, offsets and verbatim block ids rebased to matrix e0 (stacks carry no checkpoint
    index: FORMAT.md, "Stacked tensors").  Nothing is decoded or
    re-encoded; the stored crc32 covers the whole stack, so the slice's is 0 (its holder checks
    it against the stack's with the other ranks' slices)."""
    if not header.stack or not 0 <= e0 < e1 <= header.stack:
        raise IndexError(f"matrices [{e0}, {e1}) of a tensor of shape {header.shape}")
    new = dataclasses.replace(header, stack=e1 - e0, crc32=0)
    out = {C.SUFFIX_SM: planes[C.SUFFIX_SM][e0:e1]}
    if header.encoding == C.ENC_HUFFMAN:
        s0, s1 = matrix_segments(header, e0)[0], matrix_segments(header, e1 - 1)[1]
        off = planes[C.SUFFIX_OFF][s0:s1 + 1].astype(np.int64)
        out[C.SUFFIX_EXP] = planes[C.SUFFIX_EXP][off[0]:off[-1] + C.STREAM_SLACK_BYTES]
        out[C.SUFFIX_OFF] = (off - off[0]).astype(np.uint32)
    else:
        bpm = header.rows * (-(-header.cols // C.PAL_BLOCK))
        vpos = planes[C.SUFFIX_VPOS]
        a, b = np.searchsorted(vpos, [e0 * bpm, e1 * bpm])
        out[C.SUFFIX_IDX] = planes[C.SUFFIX_IDX][e0:e1]
        out[C.SUFFIX_VPOS] = (vpos[a:b].astype(np.int64) - e0 * bpm).astype(np.uint32)
        out[C.SUFFIX_VEXP] = planes[C.SUFFIX_VEXP][a:b]
        new = dataclasses.replace(new, num_verbatim=int(b - a))
    out[C.SUFFIX_HDR] = new.pack()
    return new, out


def decode_matrix(header: TensorHeader, planes: dict, e: int, threads: int | None = None,
                  where: str = "") -> np.ndarray:
    """Decode matrix e of a stack alone (an expert of a stacked MoE tensor): uint16 [N, K],
    host memory.  Reads only matrix e's segments / rows.  Not checksummed: the tensor's crc32
    covers the whole stack (``decode`` checks it)."""
    threads = threads or default_threads()
    if not header.stack or not 0 <= e < header.stack:
        raise IndexError(f"matrix {e} of a tensor of shape {header.shape}")
    check_planes(header, planes, where)
    out = np.empty((header.rows, header.cols), dtype=np.uint16)
    try:
        _decode_matrix_into(header, planes, e, out, threads)
    except ValueError as ex:
        raise FormatError(f"{ex}{' in ' + where if where else ''}") from None
    return out


def decode_rows(header: TensorHeader, planes: dict, rows: np.ndarray, threads: int = 1) -> np.ndarray:
    """Decode only the given rows (embedding gather): uint16 [len(rows), K].

    Decodes the row groups that hold the requested rows, never the whole matrix.
    """
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    out = np.empty((rows.size, header.cols), dtype=np.uint16)
    if rows.size == 0:
        return out
    if rows.min() < 0 or rows.max() >= header.rows:
        raise IndexError(f"row index out of range [0, {header.rows})")
    R = header.rows_per_group
    sm = planes[C.SUFFIX_SM]
    if header.encoding == C.ENC_PALETTE:
        pal = np.frombuffer(header.palette[: header.pal_size], np.uint8)
        for i, r in enumerate(rows):
            _C.palette_decode(np.ascontiguousarray(sm[r:r + 1]), np.ascontiguousarray(planes[C.SUFFIX_IDX][r:r + 1]),
                              header.rows, header.cols, int(r), int(r) + 1, pal, planes[C.SUFFIX_VPOS],
                              planes[C.SUFFIX_VEXP], out[i:i + 1], 1)
        return out
    groups = np.unique(rows // R)
    for g in groups:
        r0, r1 = int(g) * R, min(header.rows, (int(g) + 1) * R)
        buf = np.empty((r1 - r0, header.cols), dtype=np.uint16)
        _C.huffman_decode(planes[C.SUFFIX_EXP], planes[C.SUFFIX_OFF], header.rows, header.cols, R,
                          header.cols_per_chunk, header.table, header.exp_lo, header.exp_hi, int(g), int(g) + 1,
                          0, header.n_chunks, np.ascontiguousarray(sm[r0:r1]), buf, threads)
        sel = (rows // R) == g
        out[sel] = buf[rows[sel] - r0]
    return out


def index_lens(header: TensorHeader) -> np.ndarray:
    """uint8 [HUFF_NUM_CTX, 256]: a huffman header's code-length table widened to every
    exponent, what the C++ index builder (``_C.huffman_index``) takes."""
    lens = np.zeros((C.HUFF_NUM_CTX, 256), np.uint8)
    lens[:, header.exp_lo:header.exp_hi + 1] = header.table
    return lens


def with_index(header: TensorHeader, planes: dict, threads: int | None = None,
               chk_interval: int = C.DEFAULT_CHK_INTERVAL) -> Encoded:
    """The same huffman matrix, or stack, with the checkpoint index: the same planes (stream,
    offsets, code table, crc32) plus ``__chk`` (a stack's: each matrix's rows in turn,
    FORMAT.md "Stacked tensors"), and the header's chk_interval.  Anything that cannot carry an
    index (palette, segments of at most S weights) or already has one comes back as is.

    The tensor is decoded and the index summed from the decoded weights' code lengths
    (``_C.huffman_index``, the encoder's index without its stream).  The decode is not checked
    against the header's crc32 here: a tensor-parallel shard's header carries none (0, see
    codec/shard.py), and the loaders check each tensor, or each shard against the TP group's
    records, before they add the index, unless verification is off.  The GPU decoders check
    every chain against the index they are given.
    Files stay index-free unless asked (the index costs ~0.014 bit per weight on disk); the
    GPU loader adds it here, where it buys the decode kernels their parallelism."""
    if header.encoding != C.ENC_HUFFMAN or header.chk_interval:
        return Encoded(header, planes, {})
    hdr = dataclasses.replace(header, chk_interval=chk_interval, version_minor=max(header.version_minor, C.MINOR_CHK))
    if not hdr.chk_cols:  # every segment fits in one chain
        return Encoded(header, planes, {})
    threads = threads or default_threads()
    lens = index_lens(header)

    def index(w):
        return _C.huffman_index(w, header.rows_per_group, header.cols_per_chunk, lens, threads, chk_interval)

    if header.stack:
        # A matrix at a time: host memory holds one decoded expert, not the whole stack.
        check_planes(header, planes)
        buf = np.empty((header.rows, header.cols), dtype=np.uint16)
        rows = []
        for e in range(header.stack):
            _decode_matrix_into(header, planes, e, buf, threads)
            rows.append(index(buf))
        chk = np.concatenate(rows)
    else:
        chk = index(decode(header, planes, threads, verify=False))
    out = dict(planes)
    out[C.SUFFIX_HDR] = hdr.pack()
    out[C.SUFFIX_CHK] = chk
    return Encoded(hdr, out, {"index_bits_per_weight": chk.size * 16 / header.numel})


def transcode_to_palette(header: TensorHeader, planes: dict, threads: int | None = None,
                         verify: bool = True) -> Encoded:
    """Huffman -> palette using nothing but the compressed tensor (decode, then re-encode).
    verify: check the decoded weight against header.crc32 (False for a tensor-parallel block,
    whose header carries no crc32 of its own)."""
    if header.encoding == C.ENC_PALETTE:
        return Encoded(header, planes, {})
    w = decode(header, planes, threads, verify=verify)
    return encode(w, "palette", threads=threads, grid=(header.rows_per_group, header.cols_per_chunk))


def encoded_header(planes: dict, where: str = "") -> TensorHeader:
    if C.SUFFIX_HDR not in planes:
        raise FormatError(f"missing plane {C.SUFFIX_HDR} of {where}")
    return TensorHeader.parse(planes[C.SUFFIX_HDR], where)


def analyze(w: np.ndarray, threads: int | None = None) -> dict:
    """Exponent statistics of a BF16 matrix (uint16 [N, K]): entropy, palette coverage and
    the verbatim-block fraction palette encoding would give."""
    threads = threads or default_threads()
    w = np.ascontiguousarray(w, dtype=np.uint16)
    sm = np.empty(w.shape, dtype=np.uint8)
    hist = np.zeros((C.HUFF_NUM_CTX, 256), dtype=np.int64)
    _C.split_histogram(w, sm, hist, threads)
    palette = choose_palette(hist.sum(axis=0))
    st = _stats(hist, palette)
    if w.ndim == 3 and w.size:
        w = w.reshape(-1, w.shape[-1])  # a stack's blocks are those of its rows taken as one matrix
    if w.ndim == 2 and w.size:
        pmap = np.full(256, -1, dtype=np.int16)
        pmap[palette] = np.arange(len(palette), dtype=np.int16)
        idx = np.empty((w.shape[0], (w.shape[1] + 1) // 2), dtype=np.uint8)
        vpos, _ = _C.palette_encode(w, pmap, idx, threads)
        st["verbatim_fraction"] = len(vpos) / (w.shape[0] * -(-w.shape[1] // C.PAL_BLOCK))
    return st


def _st_dtype(a: np.ndarray) -> str:
    """safetensors dtype name of a plane array."""
    return {np.dtype(np.uint8): "U8", np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16"}[a.dtype]
