"""CPU tests of the device CRC-32 (csrc/cuda/crc32.cuh; no GPU needed, runs in CI).

The kernel body runs through the warp emulator (unweight._cuda.emulate_crc32_ranges) over the
grid the device launches, its global loads checked against the 16-byte words around the
ranges; every result must be zlib's crc32.  The CRC arithmetic it rests on (x^-1, the powers
of x^8, the stride tables) is checked against zlib and against a bit-at-a-time model here.
"""
import zlib

import numpy as np
import pytest

from unweight.codec.crc import crc32_combine
from unweight.runtime import kernel_plan as kp

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

pytestmark = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

POLY = 0xEDB88320


def _emulate(buf: np.ndarray, offset: int, nbytes: int, ranges: int) -> list:
    return [int(c) for c in _cuda.emulate_crc32_ranges(buf, offset, nbytes, ranges)]


def _zlib(buf: np.ndarray, offset: int, nbytes: int, ranges: int) -> list:
    return [zlib.crc32(buf[offset + r * nbytes:offset + (r + 1) * nbytes].tobytes()) for r in range(ranges)]


def _bits_state(data: bytes, start: int = 0) -> int:
    """The raw CRC state (no inversions) after `data`, one bit at a time: the model the tables
    are checked against."""
    c = start
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
    return c


def test_plan_constants_agree_with_the_header():
    for name in ("CRC_THREADS", "CRC_STEPS", "CRC_STRIDE_BYTES", "CRC_PIECE_BYTES", "CRC_TABLE_WORDS",
                 "CRC_POW_TERMS", "CRC_INV_TERMS", "CRC_MAX_CTAS"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for n in (0, 1, 15, 16, 17, kp.CRC_PIECE_BYTES - 15, kp.CRC_PIECE_BYTES - 14, kp.CRC_PIECE_BYTES, 1 << 30):
        assert _cuda.plan_crc_pieces(n) == kp.crc_pieces(n)
    for p in (0, 1, 7, 8, 9, 8192, 8193, 1 << 40):
        assert _cuda.plan_crc_grid(p) == kp.crc_grid(p)


def test_pieces_cover_every_word_a_range_touches():
    for n in range(1, 3 * kp.CRC_PIECE_BYTES, 997):
        for align in range(16):
            words, per_piece = -(-(align + n) // 16), kp.CRC_PIECE_BYTES // 16
            assert (kp.crc_pieces(n) - 1) * per_piece < words <= kp.crc_pieces(n) * per_piece


def test_stride_tables_move_each_byte_over_the_rest_of_its_stride():
    u = _cuda.crc32_stride_table()
    assert u.shape == (16, 256) and u.dtype == np.uint32
    for k in (0, 1, 7, 15):
        for b in (0, 1, 0x80, 0xA5, 0xFF):
            msg = bytes([b]) + bytes(kp.CRC_STRIDE_BYTES - 1 - k)
            assert int(u[k, b]) == _bits_state(msg), (k, b)


@pytest.mark.parametrize("offset", [0, 1, 7, 15, 16, 33])
@pytest.mark.parametrize("nbytes", [1, 2, 15, 16, 17, 255, 511, 512, 513, 4095, 4097])
def test_ranges_of_any_length_and_alignment_give_zlibs_crc32(offset, nbytes):
    rng = np.random.default_rng(offset * 10007 + nbytes)
    ranges = 3
    buf = rng.integers(0, 256, size=offset + nbytes * ranges + 48, dtype=np.uint8)
    assert _emulate(buf, offset, nbytes, ranges) == _zlib(buf, offset, nbytes, ranges)


@pytest.mark.parametrize("offset", [0, 5, 16])
def test_ranges_over_several_pieces(offset):
    rng = np.random.default_rng(offset)
    for nbytes, ranges in ((kp.CRC_PIECE_BYTES, 2), (kp.CRC_PIECE_BYTES + 1, 2), (3 * kp.CRC_PIECE_BYTES - 7, 1),
                           (2 * kp.CRC_PIECE_BYTES + kp.CRC_STRIDE_BYTES * 5 + 3, 3)):
        buf = rng.integers(0, 256, size=offset + nbytes * ranges + 32, dtype=np.uint8)
        assert _emulate(buf, offset, nbytes, ranges) == _zlib(buf, offset, nbytes, ranges), (nbytes, ranges)


def test_every_byte_value_at_every_word_position():
    # 256 ranges of 16 bytes, each one byte value at each of the 16 positions: every table entry used
    buf = np.zeros(256 * 16 * 16 + 32, dtype=np.uint8)
    for v in range(256):
        for k in range(16):
            buf[(v * 16 + k) * 16 + k] = v
    assert _emulate(buf, 0, 16, 256 * 16) == _zlib(buf, 0, 16, 256 * 16)


def test_all_zero_and_all_one_bytes():
    for fill in (0x00, 0xFF):
        buf = np.full(3 * kp.CRC_PIECE_BYTES + 64, fill, dtype=np.uint8)
        assert _emulate(buf, 3, 3 * kp.CRC_PIECE_BYTES + 9, 1) == _zlib(buf, 3, 3 * kp.CRC_PIECE_BYTES + 9, 1)


def test_more_pieces_than_the_grid_has_warps():
    # 1-byte ranges: one piece each; more than CRC_MAX_CTAS x 8 warps, so warps take several
    ranges = kp.CRC_MAX_CTAS * (kp.CRC_THREADS // 32) + 5
    assert kp.crc_grid(ranges * kp.crc_pieces(1)) == kp.CRC_MAX_CTAS
    buf = np.random.default_rng(3).integers(0, 256, size=ranges + 32, dtype=np.uint8)
    assert _emulate(buf, 1, 1, ranges) == _zlib(buf, 1, 1, ranges)


def test_empty_ranges_and_no_ranges():
    buf = np.arange(64, dtype=np.uint8)
    assert _emulate(buf, 3, 0, 4) == [0, 0, 0, 0]
    assert _emulate(buf, 3, 5, 0) == []


def test_the_launch_reads_only_the_words_around_the_ranges():
    buf = np.random.default_rng(4).integers(0, 256, size=64, dtype=np.uint8)
    off = (-buf.ctypes.data) % 16  # the ranges start on a 16-byte word: nothing around them is read
    assert _emulate(buf[off:off + 32], 0, 16, 2) == _zlib(buf[off:], 0, 16, 2)
    with pytest.raises(ValueError, match="16-byte words"):  # unaligned: the word before is read
        _emulate(buf[off + 1:off + 33], 0, 16, 2)


def test_bad_arguments_are_refused():
    buf = np.zeros(64, dtype=np.uint8)
    with pytest.raises(ValueError):
        _emulate(buf, 0, -1, 1)
    with pytest.raises(ValueError):
        _emulate(buf, 0, 1 << 47, 1)


def test_combined_matrix_crcs_give_a_stacks_crc32():
    """What runtime/verify.py does with a stack's per-matrix crcs (codec.crc)."""
    rng = np.random.default_rng(5)
    mats = [rng.integers(0, 256, size=1000, dtype=np.uint8).tobytes() for _ in range(4)]
    c = zlib.crc32(mats[0])
    for m in mats[1:]:
        c = int(crc32_combine(c, zlib.crc32(m), len(m)))
    assert c == zlib.crc32(b"".join(mats))
