"""Encoding and decoding a matrix a band of row groups at a time (what compress, verify and
decompress do for large tensors so memory holds one band, not the matrix): the same planes,
byte for byte, as encoding it at once; the same matrix and the same checksum verdict when
decoding it."""
import numpy as np
import pytest

from tests.conftest import bf16_gaussian
from unweight.codec import tensor_codec as tc
from unweight.format.errors import ChecksumError

SHAPES = [(1000, 512), (333, 768), (7, 100), (2048, 64), (4096, 1024)]
BANDS = [1, 100_000, 1 << 30]  # one row group per band, a few, everything in one


@pytest.mark.parametrize("shape", SHAPES)
def test_banded_encode_is_byte_identical(shape):
    w = bf16_gaussian(np.random.default_rng(0), shape)
    whole = tc.encode(w, "huffman", threads=2)
    for bb in BANDS:
        seen = []
        got = tc.encode(w, "huffman", threads=2, band_bytes=bb, done=lambda r0, r1, s=seen: s.append((r0, r1)))
        assert whole.planes.keys() == got.planes.keys()
        for k, a in whole.planes.items():
            assert np.array_equal(a, got.planes[k]), (shape, bb, k)
        assert got.stats == whole.stats
        bands = seen[: len(seen) // 2]  # each band is reported once per pass
        assert bands == seen[len(seen) // 2:] and bands[0][0] == 0 and bands[-1][1] == shape[0]
        assert all(r0 % whole.header.rows_per_group == 0 for r0, _ in bands)


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
@pytest.mark.parametrize("shape", SHAPES[:4])
def test_banded_decode_matches_and_checks(shape, encoding):
    w = bf16_gaussian(np.random.default_rng(1), shape)
    e = tc.encode(w, encoding, threads=2)
    for bb in BANDS:
        assert tc.decode_banded(e.header, e.planes, 2, band_bytes=bb).tobytes() == w.tobytes()
        assert tc.decode_banded(e.header, e.planes, 2, band_bytes=bb, keep=False) is None
    bad = dict(e.planes, __sm=e.planes["__sm"].copy())
    bad["__sm"][-1, -1] ^= 1  # only the crc32 can see a flipped sign/mantissa bit
    with pytest.raises(ChecksumError):
        tc.decode_banded(e.header, bad, 2, band_bytes=100_000, keep=False)
