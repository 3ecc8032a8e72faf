"""The stacked-tensor golden files (format 1.1, written by scripts/make_golden.py).

A [2, 2, 8] stack: matrix 0 is the worked example, matrix 1 the same words with the sign
flipped.  Both decoders must give the stored originals, each matrix must decode alone, the
encoder must reproduce the bytes, and a 1.0 reader's plane checks must refuse the file.
"""
import hashlib
import json
import pathlib
import re
import zlib

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from unweight.codec import tensor_codec as tc
from unweight.codec.reference import decode_reference
from unweight.format import constants as C
from unweight.format.errors import FormatError
from unweight.format.header import TensorHeader

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
META = json.loads((HERE / "stack_example.json").read_text())
ENCODINGS = ("huffman", "palette")


def planes_of(enc: str) -> dict:
    return {k[1:]: v for k, v in load_file(str(HERE / META["files"][enc])).items()}


def original() -> np.ndarray:
    return np.array([[[int(x, 16) for x in row] for row in m] for m in META["values"]], dtype=np.uint16)


@pytest.mark.parametrize("enc", ENCODINGS)
def test_both_decoders_give_the_original(enc):
    with safe_open(str(HERE / META["files"][enc]), "np") as f:
        assert f.metadata()["unweight_format_version"] == "1.1"
    p = planes_of(enc)
    h = tc.encoded_header(p)
    assert (h.stack, h.rows, h.cols, h.version_minor) == (2, 2, 8, C.MINOR_STACK)
    assert h.shape == tuple(META["shape"]) and [h.rows_per_group, h.cols_per_chunk] == META["grid"]
    ref = decode_reference(p[C.SUFFIX_HDR], p)
    cpp = tc.decode(h, p, threads=1)
    np.testing.assert_array_equal(ref, original())
    np.testing.assert_array_equal(cpp, original())
    raw = cpp.astype("<u2").tobytes()
    assert zlib.crc32(raw) == META["crc32"] == h.crc32
    assert hashlib.sha256(raw).hexdigest() == META["sha256"]


@pytest.mark.parametrize("enc", ENCODINGS)
def test_each_matrix_decodes_alone(enc):
    p = planes_of(enc)
    h = tc.encoded_header(p)
    for e in range(2):
        np.testing.assert_array_equal(tc.decode_matrix(h, p, e, threads=1), original()[e])
        np.testing.assert_array_equal(decode_reference(p[C.SUFFIX_HDR], p, matrix=e), original()[e])
    with pytest.raises(IndexError):
        tc.decode_matrix(h, p, 2)


def test_matrix_one_reads_only_its_own_segments():
    # Matrix 1 decodes from its offsets alone: zeroing matrix 0's bytes must not matter.
    p = planes_of("huffman")
    h = tc.encoded_header(p)
    s0, s1 = tc.matrix_segments(h, 1)
    assert (s0, s1) == (4, 8)
    exp = p[C.SUFFIX_EXP].copy()
    exp[: p[C.SUFFIX_OFF][s0]] = 0
    np.testing.assert_array_equal(tc.decode_matrix(h, dict(p, **{C.SUFFIX_EXP: exp}), 1), original()[1])


@pytest.mark.parametrize("enc", ENCODINGS)
def test_reencoding_reproduces_the_bytes(enc):
    p = planes_of(enc)
    for threads in (1, 2):
        again = tc.encode(original(), enc, grid=tuple(META["grid"]), threads=threads).planes
        assert set(again) == set(p)
        for s in p:
            assert again[s].dtype == p[s].dtype and again[s].shape == p[s].shape, s
            assert again[s].tobytes() == p[s].tobytes(), f"{enc}: plane {s} changed"


def test_transcode_matches_the_palette_file():
    t = tc.transcode_to_palette(tc.encoded_header(planes_of("huffman")), planes_of("huffman"), threads=1)
    for s, a in planes_of("palette").items():
        assert t.planes[s].tobytes() == a.tobytes(), s


def test_stacked_segments_are_the_worked_examples():
    # Same exponents and contexts twice over: the same code, so each matrix's segments are
    # the worked example's bytes (FORMAT.md shows this).
    p = planes_of("huffman")
    wx = {k[1:]: v for k, v in load_file(str(HERE / "worked_example_huffman.safetensors")).items()}
    n = int(wx[C.SUFFIX_OFF][-1])
    assert p[C.SUFFIX_EXP][:n].tobytes() == p[C.SUFFIX_EXP][n:2 * n].tobytes() == wx[C.SUFFIX_EXP][:n].tobytes()
    assert p[C.SUFFIX_HDR][C.HEADER_BYTES:].tobytes() == wx[C.SUFFIX_HDR][C.HEADER_BYTES:].tobytes()


@pytest.mark.parametrize("enc", ENCODINGS)
def test_a_1_0_reader_refuses_a_stack(enc):
    # A 1.0 reader ignores the stack field (reserved to it) and so expects [N, K] planes.
    p = planes_of(enc)
    h = TensorHeader.parse(p[C.SUFFIX_HDR])
    h.stack = 0
    with pytest.raises(FormatError, match="plane __sm"):
        tc.check_planes(h, p)


def _hex(a: np.ndarray) -> str:
    return " ".join(f"{b:02x}" for b in np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def test_format_md_shows_the_stack_bytes():
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "FORMAT.md").read_text().lower())
    for enc in ENCODINGS:
        for s, a in planes_of(enc).items():
            if s == C.SUFFIX_SM or not a.size:
                continue
            shown = a[: C.HEADER_BYTES] if s == C.SUFFIX_HDR else a
            assert _hex(shown) in doc, f"FORMAT.md does not show the stacked {enc} {s} bytes: {_hex(shown)}"
