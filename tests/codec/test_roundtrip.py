"""Round-trip properties of the tensor codec: every uint16 bit pattern survives both
encodings bit for bit, and the C++ codec agrees with the pure-NumPy reference decoder."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unweight import _C
from unweight.codec import tensor_codec as tc
from unweight.codec.reference import decode_reference
from unweight.format import constants as C
from unweight.format.errors import FormatError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENCODINGS = ("huffman", "palette")
# The pure-Python reference decodes ~10^6 weights/s at best: keep it to small tensors.
REFERENCE_MAX = 20000

SPECIALS = np.array(
    [0x0000, 0x8000,                    # +0, -0
     0x7F80, 0xFF80,                    # +Inf, -Inf
     0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FC1, 0x7FAB, 0xFF81,  # NaNs, quiet and signalling, payloads
     0x0001, 0x8001, 0x007F, 0x807F, 0x0040,  # subnormals
     0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80],  # smallest normal, largest finite, +-1
    dtype=np.uint16)

DIMS = (1, 2, 3, 7, 63, 64, 65, 130)


@st.composite
def shapes(draw):
    if draw(st.integers(0, 4)) == 0:
        big = 4097
        small = draw(st.sampled_from((1, 2, 3, 5)))
        return (big, small) if draw(st.booleans()) else (small, big)
    return draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS))


def _values(kind: str, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "bits":  # uniformly random bit patterns: every exponent, ~8 bits of entropy
        w = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    elif kind == "trained":  # a narrow exponent distribution, like real weights
        w = rng.normal(0, 0.02, size=n).astype(np.float32).view(np.uint32) >> 16
    elif kind == "specials":
        w = rng.choice(SPECIALS, size=n).astype(np.uint32)
    elif kind == "exponents":  # every exponent 0..255 in turn, random sign and mantissa
        e = np.arange(n) % 256
        sm = rng.integers(0, 256, size=n)
        w = ((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)
    elif kind == "constant":  # one symbol in one context: the lone-symbol code path
        w = np.full(n, int(rng.integers(0, 1 << 16)))
    else:  # "mixed": mostly trained-like with sprinkled specials, to force verbatim blocks
        w = rng.normal(0, 1, size=n).astype(np.float32).view(np.uint32) >> 16
        hit = rng.random(n) < 0.02
        w[hit] = rng.choice(SPECIALS, size=int(hit.sum()))
    return w.astype(np.uint16).reshape(shape)


kinds = st.sampled_from(("bits", "trained", "specials", "exponents", "constant", "mixed"))


@st.composite
def cases(draw):
    shape = draw(shapes())
    w = _values(draw(kinds), shape, draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        grid = None
    else:
        grid = (draw(st.integers(1, shape[0] + 2)), draw(st.integers(1, shape[1] + 2)))
    return w, grid


def _check(w, enc, grid):
    e = tc.encode(w, enc, grid=grid, threads=2)
    h = e.header
    assert (h.rows, h.cols) == w.shape
    assert set(e.planes) == set(tc.planes_for(h))  # huffman: __chk when the segments exceed S weights
    out = tc.decode(h, e.planes, threads=2)
    assert out.dtype == np.uint16 and out.shape == w.shape
    np.testing.assert_array_equal(out, w)
    if w.size <= REFERENCE_MAX:
        np.testing.assert_array_equal(decode_reference(e.planes[C.SUFFIX_HDR], e.planes), out)
    return e


@SETTINGS
@given(cases(), st.sampled_from(ENCODINGS))
def test_round_trip(case, enc):
    w, grid = case
    _check(w, enc, grid)


@SETTINGS
@given(cases(), st.sampled_from(ENCODINGS), st.data())
def test_decode_rows(case, enc, data):
    w, grid = case
    e = tc.encode(w, enc, grid=grid, threads=1)
    rows = data.draw(st.lists(st.integers(0, w.shape[0] - 1), min_size=0, max_size=12))
    got = tc.decode_rows(e.header, e.planes, np.array(rows, dtype=np.int64))
    assert got.shape == (len(rows), w.shape[1])
    np.testing.assert_array_equal(got, w[rows])


@settings(max_examples=25, deadline=None)
@given(cases())
def test_transcode_to_palette_equals_direct_encode(case):
    w, grid = case
    h = tc.encode(w, "huffman", grid=grid, threads=1)
    t = tc.transcode_to_palette(h.header, h.planes, threads=1)
    d = tc.encode(w, "palette", grid=(h.header.rows_per_group, h.header.cols_per_chunk), threads=1)
    assert set(t.planes) == set(d.planes)
    for s in d.planes:
        assert t.planes[s].dtype == d.planes[s].dtype and t.planes[s].shape == d.planes[s].shape, s
        assert t.planes[s].tobytes() == d.planes[s].tobytes(), s


@settings(max_examples=20, deadline=None)
@given(cases(), st.sampled_from(ENCODINGS))
def test_encoding_does_not_depend_on_threads(case, enc):
    w, grid = case
    a = tc.encode(w, enc, grid=grid, threads=1).planes
    b = tc.encode(w, enc, grid=grid, threads=2).planes
    assert all(a[s].tobytes() == b[s].tobytes() for s in a)


@pytest.mark.parametrize("enc", ENCODINGS)
def test_every_exponent_with_every_sign_and_mantissa_byte(enc):
    # 256 x 256: row = sign+mantissa byte, column = exponent, so each (context, exponent)
    # pair occurs and every uint16 appears exactly once.
    sm = np.arange(256, dtype=np.uint16)[:, None]
    e = np.arange(256, dtype=np.uint16)[None, :]
    w = ((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)
    assert np.unique(w).size == 65536
    _check(w, enc, None)
    _check(w, enc, (3, 100))


@pytest.mark.parametrize("enc", ENCODINGS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 63), (63, 1), (65, 65), (1, 4097), (4097, 1)])
def test_special_values_odd_shapes(enc, shape):
    w = np.resize(SPECIALS, shape).astype(np.uint16)
    _check(w, enc, None)


@pytest.mark.parametrize("cols", [1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 40, 130])
@pytest.mark.parametrize("n_groups", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("baseline", [False, True], ids=["dispatch", "baseline"])
def test_fast_decoder_ways_groups_and_tails(cols, n_groups, baseline):
    # The CPU decoder runs 4 segments in lockstep (1 at a time at the grid's edge), refills
    # every 4 pairs and decodes a row's last cols % 8 weights one code at a time.  A
    # heavy-tailed exponent distribution gives 12-bit codes, so pairs that miss the pair table
    # (the slow path) occur in every position; a ragged last row group covers partial runs.
    rng = np.random.default_rng(cols * 100 + n_groups)
    R = 40
    rows = R * n_groups - (1 if n_groups > 2 else 0)
    e = np.clip(np.round(120 - rng.exponential(3.0, size=rows * cols)), 0, 255).astype(np.uint32)
    rare = rng.random(e.size) < 0.02  # a long tail of rare exponents: long codes
    e[rare] = rng.integers(0, 256, size=int(rare.sum()))
    sm = rng.integers(0, 256, size=rows * cols).astype(np.uint32)
    w = (((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)).astype(np.uint16).reshape(rows, cols)
    enc = tc.encode(w, "huffman", grid=(R, cols), threads=1)
    # Pairs longer than the pair table's 9 bits (two 5-bit codes) take the slow path.
    assert w.size < 200 or int(enc.header.table.max()) >= 5, "the case must exercise long codes"
    # Both builds of the loop: the one picked for this CPU, and the baseline x86-64 one.
    _C._force_baseline_cpu(baseline)
    try:
        for threads in (1, 2):
            assert tc.decode(enc.header, enc.planes, threads=threads).tobytes() == w.tobytes()
    finally:
        _C._force_baseline_cpu(False)
    if w.size <= REFERENCE_MAX:
        assert decode_reference(enc.planes[C.SUFFIX_HDR], enc.planes).tobytes() == w.tobytes()


@pytest.mark.parametrize("cols", [2048, 2049])
@pytest.mark.parametrize("baseline", [False, True], ids=["dispatch", "baseline"])
def test_huffman_decoder_big_output(cols, baseline):
    # From 16 MB of output the decoder prefetches the next row and, where a row starts on a
    # 32-byte boundary, writes it with streaming stores; an odd width puts rows on and off the
    # boundary in turn.  A row range decodes into a buffer of its own (plain stores).
    rng = np.random.default_rng(cols)
    rows = (16 << 20) // (2 * cols) + 70
    f = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).view(np.uint32)
    w = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
    w[rng.integers(0, rows, 50), rng.integers(0, cols, 50)] = 0x7FC1  # NaN payloads: long codes
    enc = tc.encode(w, "huffman", threads=2)
    _C._force_baseline_cpu(baseline)
    try:
        for threads in (1, 2):
            assert tc.decode(enc.header, enc.planes, threads=threads).tobytes() == w.tobytes()
        rows_sel = np.array([0, 1, rows // 2, rows - 1])
        assert tc.decode_rows(enc.header, enc.planes, rows_sel).tobytes() == w[rows_sel].tobytes()
    finally:
        _C._force_baseline_cpu(False)


@pytest.mark.parametrize("cols", [1, 31, 32, 33, 64, 95, 130])
@pytest.mark.parametrize("baseline", [False, True], ids=["dispatch", "baseline"])
def test_palette_decoder_rows_and_tails(cols, baseline):
    # The palette decoder maps 32 weights per step with a byte shuffle (AVX2 build) and
    # finishes each row one weight at a time; out-of-palette exponents make verbatim blocks.
    rng = np.random.default_rng(cols)
    rows = 37
    e = rng.choice(np.arange(112, 126), size=rows * cols).astype(np.uint32)
    e[rng.random(e.size) < 0.01] = 3  # rare: outside the 14-entry palette -> verbatim blocks
    sm = rng.integers(0, 256, size=rows * cols).astype(np.uint32)
    w = (((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)).astype(np.uint16).reshape(rows, cols)
    enc = tc.encode(w, "palette", threads=1)
    _C._force_baseline_cpu(baseline)
    try:
        for threads in (1, 2):
            assert tc.decode(enc.header, enc.planes, threads=threads).tobytes() == w.tobytes()
        # A nibble past the palette is corruption wherever it sits in a row.
        pal_size = enc.header.pal_size
        if pal_size < 16:
            for col in {0, cols - 1, min(cols - 1, 40)}:
                planes = dict(enc.planes)
                idx = planes[C.SUFFIX_IDX].copy()
                idx.reshape(rows, -1)[5, col // 2] |= np.uint8(15 << (4 * (col % 2)))
                planes[C.SUFFIX_IDX] = idx
                with pytest.raises(FormatError, match="palette index out of range"):
                    tc.decode(enc.header, planes, threads=1, verify=False)
    finally:
        _C._force_baseline_cpu(False)
    if w.size <= REFERENCE_MAX:
        assert decode_reference(enc.planes[C.SUFFIX_HDR], enc.planes).tobytes() == w.tobytes()


def test_freed_big_buffers_are_reused_and_released():
    # Buffers from 4 MiB go back to a bounded cache when freed and serve the next request of
    # the same size (no page touched); release_host_cache() unmaps them.
    import os
    tc.release_host_cache()
    a = tc.empty((1024, 3000), np.uint16)
    addr = a.ctypes.data
    a[:] = 1
    del a
    b = tc.empty((1024, 3000), np.uint16)
    assert b.ctypes.data == addr
    del b
    c = tc.empty((1024, 2900), np.uint16)  # a little smaller: the same buffer serves it
    assert c.ctypes.data == addr
    del c
    assert tc.release_host_cache() >= 1024 * 3000 * 2
    assert tc.release_host_cache() == 0
    # Still usable in a forked child (the cache's lock is held across fork()).
    d = tc.empty((1024, 3000), np.uint16)
    del d
    pid = os.fork()
    if pid == 0:
        e = tc.empty((1024, 3000), np.uint16)
        e[:] = 3
        os._exit(0 if int(e[-1, -1]) == 3 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_auto_picks_the_smaller():
    w = _values("trained", (64, 256), 1)
    a = tc.encode(w, "auto", threads=1)
    h = tc.encode(w, "huffman", threads=1)
    p = tc.encode(w, "palette", threads=1)
    assert a.nbytes == min(h.nbytes, p.nbytes)
    np.testing.assert_array_equal(tc.decode(a.header, a.planes), w)


def test_encode_refuses_bad_input():
    with pytest.raises(ValueError):
        tc.encode(np.zeros((0, 4), np.uint16))
    with pytest.raises(ValueError):
        tc.encode(np.zeros(8, np.uint16))
    with pytest.raises(ValueError):
        tc.encode(np.zeros((2, 2), np.uint16), "zstd")


def _grid_rule(rows, cols, seg):
    """FORMAT.md "Index cost and the writer's grid", written out independently."""
    if cols % 256 == 0:
        Cc = cols // 8
    else:
        Cc = cols
        for p in (4, 2):
            if cols % (32 * p) == 0 and cols // p >= 512:
                Cc = cols // p
                break
    p = next((p for p in (8, 4, 2) if rows % (32 * p) == 0), 1)
    if p > 1:
        unit = rows // p
        divisors = [d for d in range(1, unit + 1) if unit % d == 0]
        return next((d for d in divisors if d * Cc >= seg), unit), Cc
    R = 1
    while R * Cc < seg:
        R *= 2
    cap = 1
    while cap < rows:
        cap *= 2
    return min(R, cap), Cc


@pytest.mark.parametrize("rows,cols,chunk", [
    (4096, 4096, 512),       # K split 8 ways
    (1024, 768, 96),         # a multiple of 256: 8 chunks however narrow; R grows instead (R | 1024 / 8)
    (768, 512, 64),          # R = 768 / 8 = 96: the target is out of reach, segments of 6144
    (1152, 1152, 576),       # 1152 = 4.5 * 256: chunks >= 512 only, so 2; rows split 4 ways (R | 288)
    (100, 4096, 512),
    (7, 100, 100),           # R capped at the power of two >= rows
    (3, 5000, 5000),         # 5000 is no multiple of 128: one chunk
    (1, 64, 64),
    (4096, 1024, 128),
    (32, 8192, 1024),
    (11008, 4096, 512),      # an MLP down-projection
    (4096, 11008, 1376),     # 11008 = 8 * 1376 = 8 * 43 * 32
    (151936, 896, 896),      # an embedding: 896 = 3.5 * 256
    (7168, 2048, 256),       # a Kimi-K2 expert down-projection: TP 8 on chunk edges
    (2048, 7168, 896),       # its gate/up projections: R | 2048 / 8
])
@pytest.mark.parametrize("seg", [C.DEFAULT_SEGMENT_WEIGHTS, 4096, 8192])
def test_choose_grid_policy(rows, cols, chunk, seg):
    R, Cc = tc.choose_grid(rows, cols, seg)
    assert (R, Cc) == _grid_rule(rows, cols, seg)
    assert Cc == chunk
    # Both axes split 2, 4 and 8 ways on segment edges when they are multiples of 256.
    for n, unit in ((rows, R), (cols, Cc)):
        if n % 256 == 0:
            assert all((n // tp) % unit == 0 for tp in (2, 4, 8)), (n, unit)
    # A segment holds >= seg weights unless the tensor is too small or TP caps R at rows / 8:
    # the index costs <= 32 / seg bit per weight.
    assert R * Cc >= seg or R >= rows or (rows % 256 == 0 and R == rows // 8)


def test_large_outputs_are_plain_writable_arrays():
    # >= 1 MiB comes from _C.host_empty (malloc, or pre-faulted pages from 32 MiB); it must
    # still behave as an ordinary array for torch.from_numpy, slicing and writes, and free its
    # memory with the last view.
    a = tc.empty((1024, 4096), np.uint16)
    assert a.shape == (1024, 4096) and a.dtype == np.uint16 and a.flags.writeable and a.flags.c_contiguous
    a[:] = 7
    assert int(a.sum()) == 7 * a.size
    v = a[1:3]
    del a
    assert int(v.sum()) == 7 * v.size  # the view keeps the buffer alive
    assert tc.empty((3, 5), np.uint8).shape == (3, 5)
    assert tc.empty((0, 4096), np.uint16).shape == (0, 4096)
    # >= 32 MiB: a pre-faulted mapping (split across threads); released with its last view.
    b = tc.empty((5000, 4000), np.uint16, threads=2)
    b[-1, -1] = 9
    tail = b[-1:]
    del b
    assert int(tail[0, -1]) == 9
    w = _values("trained", (1100, 2048), 3)  # a 4.5 MB matrix: decoded into a malloc buffer
    e = tc.encode(w, "huffman", threads=2)
    assert tc.decode(e.header, e.planes, threads=2).tobytes() == w.tobytes()


def test_stack_slice_planes_decode_to_the_matrices():
    """codec.tensor_codec.stack_slice: any range of a stack's matrices, both encodings, with
    NaN payloads, infinities and subnormals, decodes to those matrices bit for bit from the
    stack's own bytes."""
    rng = np.random.default_rng(0)
    u = (rng.standard_normal((6, 96, 80)).astype(np.float32) * 0.02).view(np.uint32) >> 16
    u = u.astype(np.uint16)
    u[2, 5, 7], u[4, 0, 0], u[4, 1, 3], u[5, 95, 79] = 0x7FC1, 0xFF80, 0x0001, 0x8000
    for enc in ("huffman", "palette"):
        e = tc.encode(u, enc)
        for a, b in ((0, 3), (3, 6), (2, 4), (5, 6), (0, 6)):
            h, p = tc.stack_slice(e.header, e.planes, a, b)
            p = {k: np.array(v) for k, v in p.items()}
            tc.check_planes(h, p)
            assert (h.stack, h.crc32) == (b - a, 0)
            assert np.array_equal(tc.decode(h, p, verify=False).reshape(b - a, 96, 80), u[a:b]), (enc, a, b)
        with pytest.raises(IndexError):
            tc.stack_slice(e.header, e.planes, 4, 4)
