"""Per-tensor header: pack/parse round trip, version refusal, crc protection."""
import zlib

import numpy as np
import pytest

from unweight.codec.reference import parse_header_reference
from unweight.format import constants as C
from unweight.format.errors import FormatError, VersionError
from unweight.format.header import TensorHeader


def _huffman_header():
    table = np.zeros((4, 5), dtype=np.uint8)
    table[0] = [2, 2, 2, 3, 3]
    table[1, 2] = 1
    return TensorHeader(encoding=C.ENC_HUFFMAN, rows=300, cols=4096, rows_per_group=2, cols_per_chunk=512,
                        crc32=0xDEADBEEF, max_code_len=12, num_ctx=4, exp_lo=120, exp_hi=124, table=table)


def _palette_header():
    return TensorHeader(encoding=C.ENC_PALETTE, rows=7, cols=65, rows_per_group=8, cols_per_chunk=65,
                        crc32=1, pal_size=3, pal_block=C.PAL_BLOCK, num_verbatim=2,
                        palette=bytes([126, 127, 0]).ljust(16, b"\0"))


def _refix(raw: np.ndarray) -> np.ndarray:
    b = bytearray(raw.tobytes())
    b[60:64] = zlib.crc32(bytes(b[:60]) + bytes(b[64:])).to_bytes(4, "little")
    return np.frombuffer(bytes(b), np.uint8).copy()


@pytest.mark.parametrize("make", [_huffman_header, _palette_header])
def test_round_trip(make):
    h = make()
    raw = h.pack()
    assert raw.dtype == np.uint8 and raw.ndim == 1
    assert raw.size == C.HEADER_BYTES + (0 if h.table is None else h.table.size)
    assert bytes(raw[:4]) == C.MAGIC
    g = TensorHeader.parse(raw)
    for f in ("encoding", "rows", "cols", "rows_per_group", "cols_per_chunk", "crc32", "exp_lo", "exp_hi",
              "pal_size", "num_verbatim", "palette", "version_major", "version_minor"):
        assert getattr(g, f) == getattr(h, f), f
    if h.table is not None:
        np.testing.assert_array_equal(g.table, h.table)
    assert g.pack().tobytes() == raw.tobytes()
    # The independent reference parser reads the same fields.
    r = parse_header_reference(raw)
    assert (r["rows"], r["cols"], r["rows_per_group"], r["cols_per_chunk"], r["crc32"]) == (
        h.rows, h.cols, h.rows_per_group, h.cols_per_chunk, h.crc32)


def test_field_offsets():
    raw = _huffman_header().pack().tobytes()
    assert raw[4:8] == bytes([1, 0, C.ENC_HUFFMAN, C.DTYPE_BF16])
    assert int.from_bytes(raw[8:12], "little") == 300
    assert int.from_bytes(raw[20:24], "little") == 512
    assert int.from_bytes(raw[24:28], "little") == 0xDEADBEEF
    assert raw[28:32] == bytes([12, 4, 120, 124])
    assert int.from_bytes(raw[56:60], "little") == 20
    assert int.from_bytes(raw[60:64], "little") == zlib.crc32(raw[:60] + raw[64:])


@pytest.mark.parametrize("major", [0, 2, 255])
def test_unknown_major_version_is_refused_by_name(major):
    raw = _huffman_header().pack()
    raw[4], raw[5] = major, 3
    raw = _refix(raw)
    for parse in (TensorHeader.parse, parse_header_reference):
        with pytest.raises(VersionError, match=rf"\b{major}\.3\b"):
            parse(raw)
    # Refused even with a stale crc: the version is read before the crc is checked.
    raw2 = _huffman_header().pack()
    raw2[4] = major
    with pytest.raises(VersionError):
        TensorHeader.parse(raw2)


def test_newer_minor_version_is_read():
    raw = _huffman_header().pack()
    raw[5] = 9
    h = TensorHeader.parse(_refix(raw))
    assert (h.version_major, h.version_minor) == (1, 9)
    assert parse_header_reference(_refix(raw))["version_minor"] == 9


@pytest.mark.parametrize("make", [_huffman_header, _palette_header])
def test_every_single_byte_change_is_rejected(make):
    raw = make().pack()
    for i in range(raw.size):
        bad = raw.copy()
        bad[i] ^= 0x10
        for parse in (TensorHeader.parse, parse_header_reference):
            with pytest.raises(FormatError):
                parse(bad)


def test_header_crc_mismatch_message():
    raw = _huffman_header().pack()
    raw[12] ^= 1
    with pytest.raises(FormatError, match="checksum|crc"):
        TensorHeader.parse(raw, "layer.0.weight")


@pytest.mark.parametrize("cut", [0, 10, 63])
def test_truncated_header(cut):
    raw = _huffman_header().pack()[:cut]
    with pytest.raises(FormatError):
        TensorHeader.parse(raw)
    with pytest.raises(FormatError):
        parse_header_reference(raw)


def test_table_length_must_match_field():
    raw = _huffman_header().pack()
    for bad in (raw[:-1], np.concatenate([raw, np.zeros(1, np.uint8)])):
        with pytest.raises(FormatError):
            TensorHeader.parse(bad)
        with pytest.raises(FormatError):
            parse_header_reference(bad)


@pytest.mark.parametrize("off,val", [(6, 3), (7, 2), (8, 0), (16, 0), (20, 0), (28, 11), (29, 2), (30, 125)])
def test_semantic_checks_behind_a_valid_crc(off, val):
    raw = _huffman_header().pack()
    raw[off:off + 1] = val
    if off in (8, 16, 20):
        raw[off:off + 4] = 0
    raw = _refix(raw)
    for parse in (TensorHeader.parse, parse_header_reference):
        with pytest.raises(FormatError):
            parse(raw)


@pytest.mark.parametrize("off,val", [(32, 0), (32, 17), (33, 64), (33, 16)])
def test_palette_parameter_checks(off, val):
    raw = _palette_header().pack()
    raw[off] = val
    raw = _refix(raw)
    for parse in (TensorHeader.parse, parse_header_reference):
        with pytest.raises(FormatError):
            parse(raw)


def test_duplicate_palette_entries():
    h = _palette_header()
    h.palette = bytes([5, 5, 6]).ljust(16, b"\0")
    for parse in (TensorHeader.parse, parse_header_reference):
        with pytest.raises(FormatError):
            parse(h.pack())
