"""The C++ codec's crc32 (carry-less-multiply folding where the CPU has it, zlib otherwise)
equals zlib's crc32 for every length and alignment, on one thread and split across threads;
so do its per-row crcs."""
import zlib

import numpy as np
import pytest

from unweight import _C

SIZES = [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096 + 3, (1 << 20) + 5, (9 << 20) + 7]


@pytest.mark.parametrize("baseline", [False, True], ids=["dispatch", "baseline"])
def test_crc32_matches_zlib(baseline):
    buf = np.random.default_rng(0).integers(0, 256, size=(9 << 20) + 64, dtype=np.uint8)
    _C._force_baseline_cpu(baseline)
    try:
        for n in SIZES:
            for start in (0, 1, 3, 8):
                a = buf[start:start + n]
                want = zlib.crc32(a.tobytes())
                for threads in (1, 2):  # >= 8 MiB splits into pieces joined by crc32_combine
                    assert _C.crc32(a, threads) == want, (n, start, threads)
    finally:
        _C._force_baseline_cpu(False)


def test_split_histogram_returns_the_crc_of_the_input():
    w = np.random.default_rng(1).integers(0, 1 << 16, size=(513, 77), dtype=np.uint16)
    sm = np.empty(w.shape, np.uint8)
    hist = np.zeros((4, 256), np.int64)
    assert _C.split_histogram(w, sm, hist, 1) == zlib.crc32(w.tobytes())


@pytest.mark.parametrize("baseline", [False, True], ids=["dispatch", "baseline"])
def test_row_crcs_match_zlib_row_by_row(baseline):
    from unweight.codec.shard import row_crcs
    rng = np.random.default_rng(2)
    _C._force_baseline_cpu(baseline)
    try:
        for shape in ((1, 1), (3, 7), (513, 77), (4096, 40), (2, 1 << 16), (5, 0), (0, 9)):
            w = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
            want = [zlib.crc32(w[r].tobytes()) for r in range(shape[0])]
            for threads in (1, 2):
                got = row_crcs(w, threads)
                assert got.dtype == np.uint32 and got.tolist() == want, (shape, threads)
        cols = rng.integers(0, 1 << 16, size=(64, 100), dtype=np.uint16)[:, 10:60]  # a strided block
        assert row_crcs(cols).tolist() == [zlib.crc32(r.tobytes()) for r in cols]
    finally:
        _C._force_baseline_cpu(False)
