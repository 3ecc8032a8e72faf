"""Cut an encoded tensor into the encoded tensor of a sub-matrix, without decoding it.

Tensor parallelism gives each rank a block of rows (column-parallel layers, vocab-parallel
embeddings) or of columns (row-parallel layers) of every weight matrix.  A huffman tensor is
a grid of independently decodable segments (docs/FORMAT.md, "The segment grid"), so when the
block's edges lie on segment edges the rank's block *is* a set of segments: this module copies
those segments' bytes into a new, self-contained format-v1 tensor (same code table, same grid,
offsets rebased, chunk-major order kept) that any decoder reads like a whole tensor.  Palette
tensors split on any row and on any multiple of PAL_BLOCK columns.

Everything here is NumPy on the host; nothing imports torch or vLLM.

Checksums.  The header's crc32 covers the *whole* original tensor.  The crc32 of a shard's
bytes cannot be known without decoding them, and a rank must not decode the whole tensor.
Choice made here: ``shard_planes`` stores ``crc32 = 0`` unless it is told the shard's crc
(``crc32=``); :func:`shard_crc32` decodes *only the shard's segments* (the owning rank does
this once, at load) and returns its crc.  The link back to the original checksum is kept by
crc32 arithmetic: :func:`crc32_combine` joins the crcs of consecutive byte ranges, so the
crcs of the TP row-shards, in rank order, combine to the header's crc32
(:func:`combine_row_shard_crcs`), and per-row crcs of column shards combine likewise
(:func:`combine_col_shard_crcs`).  A TP group can therefore check the stored checksum of
every tensor at load while each rank decodes only its own segments.
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from ..format import constants as C
from ..format.errors import FormatError
from ..format.header import TensorHeader
from . import tensor_codec as tc
from .crc import combine_col_shard_crcs, combine_row_shard_crcs, crc32_combine

__all__ = ["ShardError", "shard_planes", "shard_source_ranges", "tp_shard_range", "tp_plan", "allowed_tp_sizes",
           "on_grid", "block_planes", "recoded_note", "decode_block",
           "row_grid", "col_grid", "shard_crc32", "crc32_combine", "combine_row_shard_crcs",
           "combine_col_shard_crcs", "row_crcs"]


class ShardError(ValueError):
    """A requested shard does not lie on the tensor's segment grid (message names the fix)."""


# ------------------------------------------------------------------------------ grid rules


def row_grid(header: TensorHeader) -> int:
    """Row granularity a shard boundary must be a multiple of (huffman R, palette 1)."""
    return header.rows_per_group if header.encoding == C.ENC_HUFFMAN else 1


def col_grid(header: TensorHeader) -> int:
    """Column granularity a shard boundary must be a multiple of (huffman C, palette PAL_BLOCK)."""
    return header.cols_per_chunk if header.encoding == C.ENC_HUFFMAN else C.PAL_BLOCK


def allowed_tp_sizes(n: int, grid: int, limit: int = 64) -> list[int]:
    """TP sizes t <= limit that split n into t equal parts whose edges are multiples of grid."""
    return [t for t in range(1, limit + 1) if n % t == 0 and (t == 1 or (n // t) % grid == 0)]


def tp_shard_range(n: int, tp: int, rank: int, grid: int = 1, *, what: str = "tensor", axis: str = "rows"
                   ) -> tuple[int, int]:
    """[start, end) of rank's equal share of n along one axis, checked against the grid.

    Raises ShardError naming the allowed TP sizes when n does not split into tp equal parts
    whose edges are multiples of ``grid`` (the last edge may be n itself).
    """
    if tp < 1 or not 0 <= rank < tp:
        raise ShardError(f"{what}: bad tensor-parallel rank {rank} of {tp}")
    if n % tp:
        raise ShardError(f"{what}: {n} {axis} do not split into {tp} equal tensor-parallel shards; "
                         f"allowed --tensor-parallel-size values: {allowed_tp_sizes(n, grid)}")
    size = n // tp
    start = rank * size
    if tp > 1 and size % grid:
        raise ShardError(
            f"{what}: a {axis} shard of {size} is not a multiple of the segment grid ({grid} {axis}), so a rank "
            f"could not decode its shard alone; allowed --tensor-parallel-size values: "
            f"{allowed_tp_sizes(n, grid)} (or re-compress with a finer grid, or use --load-format unweight)")
    return start, start + size


def grid_cover(rng, n: int, grid: int) -> tuple[int, int]:
    """The smallest [start, end) on the segment grid (edges multiples of grid, or n) holding
    rng = (a, b) of an axis of n; rng None: the whole axis."""
    if rng is None:
        return 0, n
    a, b = int(rng[0]), int(rng[1])
    return a - a % grid, min(n, -(-b // grid) * grid)


def tp_plan(header: TensorHeader, tp: int, role: str, what: str = "tensor") -> list[tuple]:
    """Every rank's block of one encoded tensor under tensor parallelism, in rank order.

    role: "rows" (column-parallel layers, vocab-parallel embeddings, expert gate/up
    projections: each rank a block of rows), "cols" (row-parallel layers, expert down
    projections: a block of columns) or "full" (replicated).  Returns [(rows, cols)] with
    (start, end) ranges or None for a whole axis.  Raises ShardError naming the allowed TP
    sizes when the tensor's grid cannot serve tp.
    """
    if role == "full":
        return [(None, None)] * tp
    if role not in ("rows", "cols"):
        raise ValueError(f"{what}: unknown tensor-parallel role {role!r}")
    n, grid = (header.rows, row_grid(header)) if role == "rows" else (header.cols, col_grid(header))
    blocks = [tp_shard_range(n, tp, rank, grid, what=what, axis=role) for rank in range(tp)]
    return [(b, None) if role == "rows" else (None, b) for b in blocks]


def _edges_on_grid(a: int, b: int, n: int, grid: int) -> bool:
    """Whether [a, b) starts on the grid and ends on it or at the tensor's end n."""
    return a % grid == 0 and (b % grid == 0 or b == n)


def _in_bounds(rng, n: int, axis: str, where: str, hint: str = "") -> tuple[int, int]:
    """(a, b) of rng, or ShardError when it is empty or reaches outside [0, n)."""
    a, b = int(rng[0]), int(rng[1])
    if not 0 <= a < b <= n:
        raise ShardError(f"{where}: {axis} range [{a}, {b}) is empty or outside [0, {n}){hint}")
    return a, b


def _check_range(rng, n: int, grid: int, axis: str, where: str) -> tuple[int, int]:
    if rng is None:
        return 0, n
    a, b = _in_bounds(rng, n, axis, where)
    if not _edges_on_grid(a, b, n, grid):
        raise ShardError(f"{where}: {axis} range [{a}, {b}) is not on the segment grid (edges must be "
                         f"multiples of {grid} or the tensor end {n})")
    return a, b


# ------------------------------------------------------------------------------ slicing


@dataclasses.dataclass
class ShardSource:
    """Which bytes of the source planes a shard uses (for tests and load-time accounting).

    exp_ranges: [(byte_start, byte_end)] of ``__exp`` copied, in the shard's order (huffman).
    segments: source segment ids copied, in the shard's order (huffman).
    vpos_rows: indices into ``__vpos``/``__vexp`` kept (palette).
    """

    rows: tuple[int, int]
    cols: tuple[int, int]
    exp_ranges: list
    segments: list
    vpos_rows: np.ndarray | None = None


def shard_source_ranges(header: TensorHeader, off: np.ndarray | None, rows=None, cols=None,
                        where: str = "tensor") -> ShardSource:
    """The source byte ranges / segments a shard reads, after checking it lies on the grid."""
    r0, r1 = _check_range(rows, header.rows, row_grid(header), "rows", where)
    c0, c1 = _check_range(cols, header.cols, col_grid(header), "cols", where)
    if header.encoding != C.ENC_HUFFMAN:
        return ShardSource((r0, r1), (c0, c1), [], [])
    R, Cc, ng = header.rows_per_group, header.cols_per_chunk, header.n_groups
    g0, g1 = r0 // R, -(-r1 // R)
    k0, k1 = c0 // Cc, -(-c1 // Cc)
    segs, ranges = [], []
    for k in range(k0, k1):
        s0, s1 = k * ng + g0, k * ng + g1  # chunk-major: this chunk's groups are contiguous
        segs.extend(range(s0, s1))
        a, b = int(off[s0]), int(off[s1])
        if ranges and ranges[-1][1] == a:
            ranges[-1] = (ranges[-1][0], b)  # whole columns of groups: merge into one copy
        else:
            ranges.append((a, b))
    return ShardSource((r0, r1), (c0, c1), ranges, segs)


def shard_planes(header: TensorHeader, planes: dict, *, rows=None, cols=None, crc32: int = 0,
                 where: str = "tensor") -> tuple[TensorHeader, dict]:
    """Encoded planes of the sub-matrix ``[rows[0]:rows[1], cols[0]:cols[1]]`` of an encoded tensor.

    header, planes: as read from a checkpoint (planes keyed by suffix, NumPy arrays on the host;
        only the shard's bytes are read from them, so memory-mapped planes stay mostly unread).
    rows, cols: (start, end) or None for the whole axis.  Huffman: multiples of R / C or the
        tensor end; palette: any rows, columns multiples of PAL_BLOCK or the tensor end.
        ShardError otherwise.
    crc32: the shard's crc32 if known (see the module docstring), else 0; compute it with
        :func:`shard_crc32` before decoding with ``verify=True``.
    Returns (header, planes) of a self-contained format-v1 tensor (fresh arrays, no views into
    the source).  The huffman code table, the exponent range and the grid (R, C) are kept.
    """
    src = shard_source_ranges(header, planes.get(C.SUFFIX_OFF), rows, cols, where)
    (r0, r1), (c0, c1) = src.rows, src.cols
    n, k = r1 - r0, c1 - c0
    sm = np.ascontiguousarray(planes[C.SUFFIX_SM][r0:r1, c0:c1])
    new = dataclasses.replace(header, rows=n, cols=k, crc32=int(crc32))
    if header.encoding == C.ENC_HUFFMAN:
        off = planes[C.SUFFIX_OFF]
        exp = planes[C.SUFFIX_EXP]
        lens = np.diff(off.astype(np.int64))[src.segments]
        new_off = np.zeros(len(src.segments) + 1, dtype=np.uint32)
        new_off[1:] = np.cumsum(lens)
        parts = [exp[a:b] for a, b in src.exp_ranges]
        parts.append(np.zeros(C.STREAM_SLACK_BYTES, dtype=np.uint8))
        new_exp = np.concatenate(parts).astype(np.uint8, copy=False)
        out = {C.SUFFIX_HDR: new.pack(), C.SUFFIX_SM: sm, C.SUFFIX_EXP: new_exp, C.SUFFIX_OFF: new_off}
        if header.chk_interval:
            _shard_index(header, new, planes[C.SUFFIX_CHK], src.segments, out, where)
        return new, out
    # Palette: nibble pairs never straddle the edge because c0 is a multiple of 32 (even).
    idx = np.ascontiguousarray(planes[C.SUFFIX_IDX][r0:r1, c0 // 2: c0 // 2 + (k + 1) // 2])
    if k % 2 and c1 != header.cols:  # unreachable (c1 is a multiple of 32 unless it is the end)
        raise FormatError(f"{where}: odd shard width inside the tensor")
    bpr = -(-header.cols // C.PAL_BLOCK)
    b0, b1 = c0 // C.PAL_BLOCK, -(-c1 // C.PAL_BLOCK)
    vpos = planes[C.SUFFIX_VPOS].astype(np.int64)
    vr, vb = vpos // bpr, vpos % bpr
    keep = np.flatnonzero((vr >= r0) & (vr < r1) & (vb >= b0) & (vb < b1))
    new_bpr = b1 - b0
    new_vpos = ((vr[keep] - r0) * new_bpr + (vb[keep] - b0)).astype(np.uint32)
    new_vexp = np.ascontiguousarray(planes[C.SUFFIX_VEXP][keep])
    new.num_verbatim = int(keep.size)
    src.vpos_rows = keep
    out = {C.SUFFIX_HDR: new.pack(), C.SUFFIX_SM: sm, C.SUFFIX_IDX: idx, C.SUFFIX_VPOS: new_vpos,
           C.SUFFIX_VEXP: new_vexp}
    return new, out


def _shard_index(header: TensorHeader, new: TensorHeader, chk: np.ndarray, segments: list, out: dict,
                 where: str) -> None:
    """The shard's part of the checkpoint index: the rows of its segments.  Checkpoints count
    symbols from their own segment's start, so a row is valid as it stands in any tensor the
    segment lands in.  A shard of tail segments only (smaller than a full R x C) needs fewer
    checkpoints per row: the columns it drops are zero, as unused entries must be."""
    rows = np.ascontiguousarray(chk[segments])
    P = new.chk_cols
    if rows[:, P:].any():
        raise FormatError(f"{where}: checkpoint index has entries past the end of its segments")
    if P == 0:  # every segment of the shard fits in one chain: no index to carry
        new.chk_interval = 0
        out[C.SUFFIX_HDR] = new.pack()
        return
    out[C.SUFFIX_CHK] = np.ascontiguousarray(rows[:, :P])


def decode_block(header: TensorHeader, planes: dict, rows=None, cols=None, *, threads: int | None = None,
                 where: str = "tensor") -> np.ndarray:
    """rows x cols (ranges, None: a whole axis) of a 2-D encoded tensor, decoded: uint16, host.

    Any block, on the segment grid or not: the segments that hold it are sliced out
    (shard_planes over grid_cover's ranges), decoded and cut.  Not checksummed (a block has no
    stored crc32; the caller checks what the block contributes to the tensor's)."""
    (r0, r1), (c0, c1) = grid_cover(rows, header.rows, row_grid(header)), grid_cover(cols, header.cols,
                                                                                      col_grid(header))
    if (r0, r1, c0, c1) == (0, header.rows, 0, header.cols):  # (the whole tensor: no segments to cut)
        hs, ps = header, planes
    else:
        hs, ps = shard_planes(header, planes, rows=(r0, r1), cols=(c0, c1), where=where)
    w = tc.decode(hs, ps, threads=threads, verify=False, where=where)
    (a, b), (c, d) = rows or (0, header.rows), cols or (0, header.cols)
    if (a, b, c, d) == (r0, r1, c0, c1):
        return w
    return np.ascontiguousarray(w[a - r0:b - r0, c - c0:d - c0])


def on_grid(header: TensorHeader, rows=None, cols=None) -> bool:
    """Whether the block rows x cols (ranges, None: a whole axis) has its edges on the tensor's
    segment grid (multiples of it, or the tensor's end), so shard_planes can copy it."""
    return all(rng is None or _edges_on_grid(rng[0], rng[1], n, grid)
               for rng, n, grid in ((rows, header.rows, row_grid(header)), (cols, header.cols, col_grid(header))))


def recoded_note(header: TensorHeader, rows=None, cols=None) -> str:
    """The loaders' log line for a block block_planes recoded."""
    return (f"block rows {list(rows or (0, header.rows))} cols {list(cols or (0, header.cols))} is off the "
            f"{header.rows_per_group}x{header.cols_per_chunk} segment grid: decoded from the segments that hold it "
            f"and encoded anew")


def block_planes(header: TensorHeader, planes: dict, rows=None, cols=None, *, threads: int | None = None,
                 where: str = "tensor") -> tuple[TensorHeader, dict, bool]:
    """(header, planes, recoded) of the block rows x cols as a self-contained tensor in the
    tensor's encoding: its segments copied (shard_planes, crc32 0) when the block lies on the
    segment grid; otherwise the segments that hold it decoded, the block cut out and encoded
    anew with the writer's grid for its shape (its own code table and crc32; recoded True).
    The second way serves any equal split of a tensor for tensor parallelism, e.g. TP 16 of
    a 2048-column matrix written in 256-column chunks, at the cost of a decode and an encode
    of the block at load."""
    for rng, n, axis in ((rows, header.rows, "rows"), (cols, header.cols, "cols")):
        if rng is not None:
            _in_bounds(rng, n, axis, where, " (a tensor-parallel size larger than the tensor can share)")
    if on_grid(header, rows, cols):
        hs, ps = shard_planes(header, planes, rows=rows, cols=cols, where=where)
        return hs, ps, False
    w = decode_block(header, planes, rows=rows, cols=cols, threads=threads, where=where)
    enc = tc.encode(w, header.encoding_name, threads=threads)
    return enc.header, enc.planes, True


def with_crc(header: TensorHeader, planes: dict, crc: int) -> tuple[TensorHeader, dict]:
    """The same shard with its header's crc32 set (re-packs ``__hdr``)."""
    h = dataclasses.replace(header, crc32=int(crc) & 0xFFFFFFFF)
    out = dict(planes)
    out[C.SUFFIX_HDR] = h.pack()
    return h, out


def shard_crc32(header: TensorHeader, planes: dict, threads: int | None = None, where: str = "") -> int:
    """Decode a (shard) tensor once, checking its structure, and return the crc32 of its bytes.

    Raises FormatError on any structural error (bad codes, segment bit counts, palette
    indices).  Cost: one decode of this shard only.
    """
    from .tensor_codec import decode
    w = decode(header, planes, threads=threads, where=where, verify=False)
    return zlib.crc32(w.reshape(-1).view(np.uint8))


def row_crcs(w: np.ndarray, threads: int | None = None) -> np.ndarray:
    """uint32 [N]: crc32 of each row's bytes of a uint16 [N, K] matrix (column-shard checking),
    by the C++ codec's crc32 across `threads` (default: the codec's).  A crc32 call per row
    from Python cost several times the crc of the same bytes in one piece: 0.011-0.018 s
    against 0.0024 s for a TP-8 rank's share of one Llama 4 expert, some 10 s per Scout rank
    on 2 threads (scripts/bench_stack_load.py)."""
    w = np.ascontiguousarray(w)
    if w.shape[0] == 0:
        return np.zeros(0, dtype=np.uint32)
    return tc.row_crcs(w, threads)
