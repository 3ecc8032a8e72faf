"""crc32 arithmetic: the crc32 of concatenated byte ranges from the ranges' own crc32s.

Used where a tensor's bytes are checked in pieces that no one holds together: tensor-parallel
shards (codec/shard.py, codec/shard_check.py) and row bands of a large matrix
(codec/tensor_codec.py encode/decode_banded).  NumPy only.
"""
from __future__ import annotations

import numpy as np

# zlib's crc32 is affine over GF(2): crc(A || B) = M_len(B) * crc(A) XOR crc(B), where M_n is
# the linear map "append n zero bytes" applied to the register (init/xorout cancel out, as in
# zlib's crc32_combine).  M_n is built by squaring the one-zero-bit operator; applying it is
# four 256-entry table lookups, vectorised over many crcs at once.

_POLY = 0xEDB88320


def _gf2_times(mat: np.ndarray, vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= int(mat[i])
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: np.ndarray) -> np.ndarray:
    return np.array([_gf2_times(mat, int(mat[n])) for n in range(32)], dtype=np.uint64)


_SHIFT_CACHE: dict = {}


def _shift_tables(nbytes: int) -> np.ndarray:
    """uint32 [4, 256]: byte-sliced tables of M_nbytes (crc register after nbytes zero bytes)."""
    t = _SHIFT_CACHE.get(nbytes)
    if t is not None:
        return t
    odd = np.zeros(32, dtype=np.uint64)
    odd[0] = _POLY
    for n in range(1, 32):
        odd[n] = 1 << (n - 1)
    odd = _gf2_square(_gf2_square(odd))  # 2, then 4 zero bits
    mat = np.zeros(32, dtype=np.uint64)
    for n in range(32):  # identity
        mat[n] = 1 << n
    length = nbytes
    cur = odd
    while length:
        cur = _gf2_square(cur)  # 1, 2, 4, ... zero bytes
        if length & 1:
            mat = np.array([_gf2_times(cur, int(mat[n])) for n in range(32)], dtype=np.uint64)
        length >>= 1
    tables = np.zeros((4, 256), dtype=np.uint32)
    for byte in range(4):
        for v in range(256):
            tables[byte, v] = _gf2_times(mat, v << (8 * byte))
    _SHIFT_CACHE[nbytes] = tables
    return tables


def _shift(crcs, nbytes: int):
    t = _shift_tables(nbytes)
    c = np.asarray(crcs, dtype=np.uint32)
    return (t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24]).astype(np.uint32)


def crc32_combine(crc_a, crc_b, len_b: int):
    """crc32 of A || B from crc32(A), crc32(B) and len(B) in bytes (arrays broadcast)."""
    if len_b == 0:
        return crc_a
    out = _shift(crc_a, len_b) ^ np.asarray(crc_b, dtype=np.uint32)
    return int(out) if np.ndim(out) == 0 else out


def combine_row_shard_crcs(crcs, nbytes) -> int:
    """crc32 of the whole tensor from the crcs of its row shards (rank order) and their byte sizes."""
    total = int(crcs[0])
    for c, n in zip(crcs[1:], nbytes[1:]):
        total = crc32_combine(total, int(c), int(n))
    return total


def combine_col_shard_crcs(per_rank_row_crcs, widths_bytes) -> int:
    """crc32 of the whole tensor from per-row crcs of its column shards.

    per_rank_row_crcs: list over ranks (column order) of uint32 [N] row crcs of that rank's
    columns; widths_bytes: each rank's row width in bytes.  Row r of the tensor is the
    concatenation of the ranks' row r, and the tensor is the rows in order.
    """
    rows = np.asarray(per_rank_row_crcs[0], dtype=np.uint32)
    for c, w in zip(per_rank_row_crcs[1:], widths_bytes[1:]):
        rows = np.asarray(crc32_combine(rows, np.asarray(c, dtype=np.uint32), int(w)), dtype=np.uint32)
    row_bytes = int(sum(widths_bytes))
    total = int(rows[0])
    for c in rows[1:]:
        total = crc32_combine(total, int(c), row_bytes)
    return total
