"""CPU tests of the CUDA kernels' logic (no GPU needed; runs in CI).

Two layers:
* launch geometry (unweight/runtime/kernel_plan.py, the mirror of csrc/cuda/kernel_plan.h):
  on odd shapes every thread -> work map covers every element exactly once, and (when
  unweight._cuda is built) the C++ plan agrees with the Python mirror;
* kernel bodies: unweight._cuda.emulate_* runs the very __host__ __device__ bodies of
  csrc/cuda/*.cuh on the host over the kernels' grids (the cooperative ones through the warp
  emulator of csrc/cuda/emu/); they must match the CPU codec
  bit for bit (decode, transcode).  The fused GEMM's tests are in test_fused_logic.py.
  Skipped when unweight._cuda is not built (no nvcc at install time).
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import aligned, all_bf16_patterns, make_weights

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

needs_ext = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

ODD = [1, 63, 65, 4097]


# ------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("rows", ODD)
@pytest.mark.parametrize("cols", ODD)
def test_huffman_split_covers_once(rows, cols):
    R, C_ = tc.choose_grid(rows, cols)
    ng, nc = kp.cdiv(rows, R), kp.cdiv(cols, C_)
    # whole grid and a sub-rectangle of segments (tensor-parallel shard)
    for g0, g1, c0, c1 in {(0, ng, 0, nc), (ng // 2, ng, nc // 2, nc), (0, max(1, ng // 3), 0, 1)}:
        nsel = (g1 - g0) * (c1 - c0)
        cover = np.zeros((rows, cols), np.int32)
        for i in range(nsel):  # segment i of the selection (huffman_chain: chains i * cps .. i * cps + cps - 1)
            g, c = kp.huffman_unit(i, g0, c0, g1 - g0)
            assert g0 <= g < g1 and c0 <= c < c1
            r0, r1, k0, k1 = kp.segment_rect(g, c, rows, cols, R, C_)
            cover[r0:r1, k0:k1] += 1
        want = np.zeros_like(cover)
        want[g0 * R:min(rows, g1 * R), c0 * C_:min(cols, c1 * C_)] = 1
        assert np.array_equal(cover, want)


@pytest.mark.parametrize("rows", ODD)
@pytest.mark.parametrize("cols", ODD)
def test_palette_split_covers_once(rows, cols):
    for r0, r1, k0, k1 in {(0, rows, 0, cols), (rows // 2, rows, cols // 3, cols)}:
        nr, nk = r1 - r0, k1 - k0
        t = np.arange(kp.pal_grid(nr, nk) * kp.PAL_THREADS)
        t = t[t < nr * kp.pal_threads_per_row(nk)]
        tpr = kp.pal_threads_per_row(nk)
        r, k = t // tpr, (t % tpr) * kp.PAL_VEC
        n = np.minimum(kp.PAL_VEC, nk - k)
        assert (n >= 1).all() and (n <= kp.PAL_VEC).all()
        # spot-check the vectorized mirror against the scalar function
        for tt in t[:: max(1, len(t) // 50)]:
            assert kp.pal_unit(int(tt), nk) == (int(tt // tpr), int((tt % tpr) * kp.PAL_VEC),
                                                int(min(kp.PAL_VEC, nk - (tt % tpr) * kp.PAL_VEC)))
        cover = np.zeros(nr * nk, np.int32)
        for j in range(kp.PAL_VEC):
            m = j < n
            np.add.at(cover, r[m] * nk + k[m] + j, 1)
        assert (cover == 1).all()


@pytest.mark.parametrize("rows", [1, 3, 33])
@pytest.mark.parametrize("cols", ODD + [8, 256, 264, 1024])
def test_wide_palette_split_covers_once(rows, cols):
    # The wide decode's threads are whole warps; at each step a warp's lanes take consecutive
    # chunks, and together the steps take every chunk of the rectangle exactly once.
    n_chunks = rows * kp.pal_threads_per_row(cols)
    total = kp.pal_wide_threads(rows, cols)
    assert total % kp.WARP == 0 and kp.pal_wide_grid(rows, cols) * kp.PAL_THREADS >= total
    seen = np.zeros(n_chunks, np.int32)
    for t in range(total):
        for s, unit in enumerate(kp.pal_wide_units(t, cols)):
            c = kp.pal_wide_chunk(t, s)
            assert c == (t // kp.WARP) * kp.WARP * kp.PAL_WIDE_STEPS + s * kp.WARP + t % kp.WARP
            assert unit == kp.pal_unit(c, cols)
            if c < n_chunks:
                seen[c] += 1
            else:
                assert unit[0] >= rows
    assert (seen == 1).all()


@pytest.mark.parametrize("cols", ODD + [31, 32, 33, 64, 128])
def test_block_splits_cover_once(cols):
    rows, B = 3, C.PAL_BLOCK
    bpr = kp.blocks_per_row(cols)
    # palette encode: thread per (row, block)
    cover = np.zeros((rows, cols), np.int32)
    for t in range(kp.enc_grid(rows, cols) * kp.ENC_THREADS):
        if t >= rows * bpr:
            continue
        r, b = divmod(t, bpr)
        cover[r, b * B:min(cols, b * B + B)] += 1
    assert (cover == 1).all()
    # verbatim patch / gather / correction: lanes of a block's warp
    for b in range(bpr):
        got = sorted(c for lane in range(kp.WARP) for c in kp.verbatim_lane_cols(b, lane, cols))
        assert got == list(range(b * B, min(cols, b * B + B)))
    assert kp.warp_grid(0) == 0 and kp.warp_grid(1) == 1 and kp.warp_grid(kp.WARPS_PER_CTA + 1) == 2


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4097, 16 * 256 * 1024 + 5, 10**9])
def test_hist_grid_stride_covers_once(n):
    grid = kp.hist_grid(n)
    assert 1 <= grid <= kp.HIST_MAX_CTAS
    nvec, stride = n // 16, grid * kp.HIST_THREADS
    # each vector index v is visited by thread v % stride at iteration v // stride: once;
    # the tail (n % 16 bytes) by CTA 0's threads
    assert stride >= 1 and (n - nvec * 16) < 16 <= kp.HIST_THREADS


@needs_ext
@pytest.mark.parametrize("ranges", [[(0, 1)], [(5, 300)], [(0, 4096), (128, 1)], [(7, 5000), (0, 0), (3, 129), (64, 64)]])
def test_prefetch_body_names_only_the_ranges(ranges):
    """The L2 prefetch body through the emulator: every line it names lies in the buffer (the
    emulator's bounds check), for ranges not starting on a line and an empty one."""
    buf = np.zeros(8192, dtype=np.uint8)
    _cuda.emulate_prefetch_l2(buf, [o for o, _ in ranges], [n for _, n in ranges])


@needs_ext
def test_prefetch_body_past_its_buffer_is_caught():
    buf = np.zeros(1000, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="outside every buffer"):
        _cuda.emulate_prefetch_l2(buf, [900], [200])
    with pytest.raises(ValueError, match="at most 4 ranges"):
        _cuda.emulate_prefetch_l2(buf, [0] * 5, [1] * 5)


@pytest.mark.parametrize("lines", [1, 255, 256, 257, 10**6])
def test_prefetch_grid_covers_every_line(lines):
    """Thread t takes lines t, t + stride, ...: each line once, with at most PREFETCH_MAX_CTAS CTAs."""
    grid = kp.prefetch_grid(lines)
    stride = grid * kp.PREFETCH_THREADS
    assert 1 <= grid <= kp.PREFETCH_MAX_CTAS and (stride >= lines or grid == kp.PREFETCH_MAX_CTAS)


@needs_ext
def test_cpp_plan_matches_python():
    for name in ("HUFF_THREADS", "PAL_VEC", "PAL_THREADS", "WARP_KERNEL_THREADS", "ENC_THREADS", "HIST_THREADS",
                 "HIST_MAX_CTAS", "SCAN_THREADS", "HUFF_VARIANT_DEFAULT", "HUFF_VARIANT_CHAIN", "HUFF_VARIANT_AHEAD",
                 "HUFF_VARIANT_AHEAD2", "HUFF_VARIANT_SCALAR", "HUFF_VARIANT_RING", "HUFF_RING_SLOTS",
                 "HUFF_VARIANT_RING_WIDE", "HUFF_RING_WIDE_THREADS", "HUFF_VARIANT_RING_MAX", "HUFF_RING_MAX_THREADS",
                 "HUFF_RING_MAX_CTAS_PER_SM", "HUFF_VARIANT_PAIR", "HUFF_PAIR_BITS", "HUFF_PAIR_THREADS",
                 "HUFF_PAIR_CTAS_PER_SM",
                 "HUFF_DEFAULT_VARIANT", "PAL_WIDE", "PAL_WIDE_STEPS",
                 "PAL_VARIANT_DEFAULT", "PAL_VARIANT_VEC8", "PAL_VARIANT_WIDE", "PAL_DEFAULT_VARIANT",
                 "PREFETCH_THREADS", "PREFETCH_MAX_CTAS", "PREFETCH_MAX_RANGES", "PREFETCH_LINE"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for v in range(kp.HUFF_VARIANT_PAIR + 1):
        assert _cuda.plan_huffman_ways(v) == kp.huffman_ways(v)
    for n in [0, 1, 63, 64, 65, 4097, 10**6, 10**10]:
        assert _cuda.plan_huffman_grid(n, 1 + n % 1000) == kp.huffman_grid(n, 1 + n % 1000)
        for threads in (kp.HUFF_RING_WIDE_THREADS, kp.HUFF_RING_MAX_THREADS, kp.HUFF_PAIR_THREADS):
            assert _cuda.plan_huffman_grid(n, 1 + n % 1000, threads) == kp.huffman_grid(n, 1 + n % 1000, threads)
        assert _cuda.plan_warp_grid(n) == kp.warp_grid(n)
        assert _cuda.plan_hist_grid(n) == kp.hist_grid(n)
        assert _cuda.plan_prefetch_grid(n) == kp.prefetch_grid(n)
    for a in ODD:
        for b in ODD:
            assert _cuda.plan_pal_grid(a, b) == kp.pal_grid(a, b)
            assert _cuda.plan_enc_grid(a, b) == kp.enc_grid(a, b)
            assert _cuda.plan_pal_wide_threads(a, b) == kp.pal_wide_threads(a, b)
            assert _cuda.plan_pal_wide_grid(a, b) == kp.pal_wide_grid(a, b)
            for t in (0, 1, 7, 8, 31, 32, 100, 1000, a * b // 3):
                assert tuple(_cuda.plan_pal_unit(t, b)) == kp.pal_unit(t, b)
                assert [tuple(u) for u in _cuda.plan_pal_wide_units(t, b)] == kp.pal_wide_units(t, b)
                assert tuple(_cuda.plan_huffman_unit(t, 2, 3, a)) == kp.huffman_unit(t, 2, 3, a)


@needs_ext
def test_module_without_gpu_is_clean():
    """Importing works without a GPU; device calls raise RuntimeError, never crash."""
    archs = _cuda.compiled_archs()
    assert all(isinstance(a, int) for a in archs)
    if _cuda.device_count() == 0:
        with pytest.raises(RuntimeError):
            _cuda.huffman_build_lut(16, 100, 120, 16, 16, 0)
    with pytest.raises(ValueError):
        _cuda.palette_decode(16, 16, 4, 8, 0, 4, 0, 8, b"", 0, 0, 0, 16, 8, 16, 0)


# ------------------------------------------------------------------------- kernel bodies
SHAPES = [(1, 1), (1, 63), (63, 65), (65, 64), (7, 4097), (129, 256), (300, 520)]


def _huff_args(enc):
    h, p = enc.header, enc.planes
    return (p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], h.rows, h.cols, h.rows_per_group, h.cols_per_chunk, h.table,
            h.exp_lo, h.exp_hi)


@needs_ext
@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_huffman_decode_matches_cpu(shape):
    w = make_weights(*shape, seed=shape[0] * 7 + shape[1])
    enc = tc.encode(w, "huffman", segment_weights=256)  # many small segments: more grid edges
    h, p = enc.header, enc.planes
    out = np.empty_like(w)
    assert _cuda.emulate_huffman_decode(*_huff_args(enc), 0, h.n_groups, 0, h.n_chunks, p[C.SUFFIX_SM], out,
                                        False) == 0
    assert np.array_equal(out, w)
    exps = np.empty(w.shape, np.uint8)
    assert _cuda.emulate_huffman_decode(*_huff_args(enc), 0, h.n_groups, 0, h.n_chunks, p[C.SUFFIX_SM], exps,
                                        True) == 0
    assert np.array_equal(exps, (w >> 7).astype(np.uint8))
    # sub-rectangle of segments, as a tensor-parallel shard decodes it
    g0, g1, c0, c1 = h.n_groups // 2, h.n_groups, h.n_chunks // 2, h.n_chunks
    R, C_ = h.rows_per_group, h.cols_per_chunk
    r0, r1, k0, k1 = g0 * R, min(h.rows, g1 * R), c0 * C_, min(h.cols, c1 * C_)
    sub = np.empty((r1 - r0, k1 - k0), np.uint16)
    sm_sub = np.ascontiguousarray(p[C.SUFFIX_SM][r0:r1, k0:k1])
    assert _cuda.emulate_huffman_decode(*_huff_args(enc), g0, g1, c0, c1, sm_sub, sub, False) == 0
    assert np.array_equal(sub, w[r0:r1, k0:k1])


@needs_ext
def test_emulated_huffman_flags_corruption_without_overrun():
    w = make_weights(65, 130, seed=3)
    enc = tc.encode(w, "huffman", segment_weights=256)
    h, p = enc.header, enc.planes
    out = np.empty_like(w)
    # flipped stream bytes: the CPU codec and the kernel body must agree that it is corrupt
    rng = np.random.default_rng(0)
    for _ in range(20):
        bad = p[C.SUFFIX_EXP].copy()
        pos = int(rng.integers(0, bad.size - C.STREAM_SLACK_BYTES))
        bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
        nerr = _cuda.emulate_huffman_decode(bad, *_huff_args(enc)[1:], 0, h.n_groups, 0, h.n_chunks,
                                            p[C.SUFFIX_SM], out, False)
        try:
            ref = np.empty_like(w)
            tc._C.huffman_decode(bad, p[C.SUFFIX_OFF], h.rows, h.cols, h.rows_per_group, h.cols_per_chunk,
                                 h.table, h.exp_lo, h.exp_hi, 0, h.n_groups, 0, h.n_chunks, p[C.SUFFIX_SM], ref, 1)
            cpu_ok = True
        except ValueError:
            cpu_ok = False
        assert (nerr == 0) == cpu_ok
        if cpu_ok:
            assert np.array_equal(out, ref)
    # an offset table that points past the stream: counted, never read out of bounds
    off = p[C.SUFFIX_OFF].copy()
    off[-1] = off[-1] + 1000
    short = p[C.SUFFIX_EXP][: max(C.STREAM_SLACK_BYTES, p[C.SUFFIX_EXP].size // 2)].copy()
    nerr = _cuda.emulate_huffman_decode(short, off, *_huff_args(enc)[2:], 0, h.n_groups, 0, h.n_chunks,
                                        p[C.SUFFIX_SM], out, False)
    assert nerr >= 1


def _pal(enc):
    return bytes(enc.header.palette[: enc.header.pal_size])


@needs_ext
@pytest.mark.parametrize("shape", SHAPES + [(33, 4096)])
def test_emulated_palette_decode_matches_cpu(shape):
    w = make_weights(*shape, seed=shape[0] + 13 * shape[1])
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    if shape[0] * shape[1] > 4000:
        assert h.num_verbatim > 0  # the generator's outliers exercise the patch kernel
    out = np.empty_like(w)
    assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], 0, h.rows, 0, h.cols, _pal(enc),
                                        p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out) == 0
    assert np.array_equal(out, w)
    # rectangles: odd origin (scalar path) and 8-aligned origin (vector path when cols % 8 == 0)
    for r0, r1, k0, k1 in {(h.rows // 3, h.rows, h.cols // 2, h.cols), (0, h.rows, (h.cols // 16) * 8, h.cols)}:
        sub = np.empty((r1 - r0, k1 - k0), np.uint16)
        assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], r0, r1, k0, k1, _pal(enc),
                                            p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], sub) == 0
        assert np.array_equal(sub, w[r0:r1, k0:k1])


@needs_ext
@pytest.mark.parametrize("shape", [(33, 4096), (70, 96), (17, 64), (130, 520), (9, 2048), (5, 8), (3, 4100)])
def test_emulated_wide_palette_decode(shape):
    """The wide variant (four 8-weight chunks per thread, register-table decode) on the shapes it
    takes (VEC8's alignment, whole chunks) and those it hands to VEC8 (an unaligned origin, a
    width with a short last chunk): the same bits, warps that span rows, paired and unpaired
    palettes, verbatim blocks patched."""
    w = make_weights(*shape, seed=shape[0] + 7 * shape[1])
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    sm, idx = (aligned(p[s]) for s in (C.SUFFIX_SM, C.SUFFIX_IDX))
    rects = {(0, h.rows, 0, h.cols), (h.rows // 3, h.rows, (h.cols // 64) * 32, h.cols),
             (0, h.rows, h.cols // 2 + 1, h.cols), (1, h.rows, 8, h.cols - h.cols // 3)}
    for r0, r1, k0, k1 in rects:
        if k0 >= k1 or r0 >= r1:
            continue
        width = k1 - k0
        # the output's row stride rounded up to 8 weights, so that a width that is not (k1 < cols)
        # still has VEC8's vector path, its last chunk short
        sub = aligned(np.zeros((r1 - r0, width + (-width) % kp.PAL_VEC), np.uint16))
        path = []
        assert _cuda.emulate_palette_decode(sm, idx, r0, r1, k0, k1, _pal(enc), p[C.SUFFIX_VPOS],
                                            p[C.SUFFIX_VEXP], sub, kp.PAL_VARIANT_WIDE, path) == 0
        assert np.array_equal(sub[:, :width], w[r0:r1, k0:k1])
        takes = h.cols % kp.PAL_VEC == 0 and k0 % kp.PAL_VEC == 0 and width % kp.PAL_VEC == 0
        assert path == [kp.PAL_VARIANT_WIDE if takes else kp.PAL_VARIANT_VEC8]


@needs_ext
@pytest.mark.parametrize("exps", [list(range(110, 126)), [0] + list(range(111, 126)), [120, 121, 122]])
def test_emulated_wide_palette_decode_of_palette_cases(exps):
    """Full palettes that pair and that cannot (the general decode), and a 3-entry palette
    whose unused nibbles must be counted as errors, by the wide path."""
    rng = np.random.default_rng(len(exps))
    e = rng.choice(exps, size=(40, 256))
    sm = rng.integers(0, 256, size=(40, 256), dtype=np.uint32)
    w = (((sm & 0x80) << 8) | (e.astype(np.uint32) << 7) | (sm & 0x7F)).astype(np.uint16)
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    assert h.num_verbatim == 0 and h.pal_size == len(exps)
    out = np.empty_like(w)
    for variant in (kp.PAL_VARIANT_WIDE, kp.PAL_VARIANT_VEC8):
        assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], 0, h.rows, 0, h.cols, _pal(enc),
                                            p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, variant) == 0
        assert np.array_equal(out, w)
    if h.pal_size < 16:
        # the smallest index past the palette and the largest, in low and high nibbles
        for col, nb in ((0, h.pal_size), (31, h.pal_size), (200, 15), (9, 15)):
            idx = p[C.SUFFIX_IDX].copy()
            sh = 4 * (col % 2)
            idx[5, col // 2] = (idx[5, col // 2] & ~np.uint8(0xF << sh)) | np.uint8(nb << sh)
            for variant in (kp.PAL_VARIANT_WIDE, kp.PAL_VARIANT_VEC8):
                assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], idx, 0, h.rows, 0, h.cols, _pal(enc),
                                                    p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, variant) == 1


@needs_ext
def test_emulated_wide_palette_decode_of_all_bf16_patterns():
    w = all_bf16_patterns(rows=256)
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    out = np.empty_like(w)
    path = []
    assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], 0, h.rows, 0, h.cols, _pal(enc),
                                        p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, kp.PAL_VARIANT_WIDE, path) == 0
    assert path == [kp.PAL_VARIANT_WIDE] and np.array_equal(out, w)
    with pytest.raises(RuntimeError, match="unknown palette decode variant"):
        _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], 0, h.rows, 0, h.cols, _pal(enc),
                                     p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, 7)


@needs_ext
def test_emulated_palette_decode_flags_bad_index():
    w = make_weights(16, 64, seed=5, spread=False)
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    if h.pal_size == 16:
        pytest.skip("palette is full; no out-of-range nibble exists")
    idx = p[C.SUFFIX_IDX].copy()
    idx[3, 5] = (idx[3, 5] & 0xF0) | 0x0F
    out = np.empty_like(w)
    assert _cuda.emulate_palette_decode(p[C.SUFFIX_SM], idx, 0, h.rows, 0, h.cols, _pal(enc), p[C.SUFFIX_VPOS],
                                        p[C.SUFFIX_VEXP], out) >= 1


@needs_ext
@pytest.mark.parametrize("n", [0, 15, 16 * 4096 + 7, 1024 * 256 * 16 + 12345])
def test_emulated_exp_histogram_counts_every_byte(n):
    # The largest size takes the grid-stride loop past one pass of the 1024-CTA grid; the
    # odd tails are counted by CTA 0.
    e = np.random.default_rng(n).integers(0, 256, size=n, dtype=np.uint8)
    assert np.array_equal(_cuda.emulate_exp_histogram(e), np.bincount(e, minlength=256))


@needs_ext
@pytest.mark.parametrize("shape", SHAPES + [(40, 4096), (1100, 1090), "all"])
def test_emulated_transcode_matches_cpu_encoder(shape):
    """Huffman -> exponents -> histogram -> palette -> idx/vpos/vexp, vs the CPU transcode.
    The kernels' own bodies run through the warp emulator (shared-memory histograms, the
    scan's barriers, the compaction's ballots), with its race check.  (1100, 1090): more rows
    than the scan has threads, several ballot rounds per row; "all": every BF16 pattern, most
    blocks verbatim."""
    w = all_bf16_patterns() if shape == "all" else make_weights(*shape, seed=11 + shape[1])
    enc = tc.encode(w, "huffman")
    h, p = enc.header, enc.planes
    exps = np.empty(w.shape, np.uint8)
    assert _cuda.emulate_huffman_decode(*_huff_args(enc), 0, h.n_groups, 0, h.n_chunks, p[C.SUFFIX_SM], exps,
                                        True) == 0
    hist = _cuda.emulate_exp_histogram(exps)
    assert np.array_equal(hist, np.bincount(exps.reshape(-1), minlength=256))
    pal = tc.choose_palette(hist.astype(np.int64))
    idx, vpos, vexp = _cuda.emulate_palette_encode(exps, bytes(pal.tobytes()))
    ref = tc.transcode_to_palette(h, p)
    assert bytes(pal.tobytes()) == bytes(ref.header.palette[: ref.header.pal_size])
    assert np.array_equal(idx, ref.planes[C.SUFFIX_IDX])
    assert np.array_equal(vpos, ref.planes[C.SUFFIX_VPOS])
    assert np.array_equal(vexp, ref.planes[C.SUFFIX_VEXP])


# ------------------------------------------------------------------------------- slots
def _slots_planes(w):
    """The host planes of runtime/expert_slots.ExpertSlots for experts w [E, rows, cols]."""
    import torch  # noqa: F401  (ExpertSlots holds tensors)
    from unweight.runtime.expert_slots import ExpertSlots
    st = ExpertSlots.from_weights(w, "cpu")
    return st, (st.sm.numpy(), st.idx.numpy(), bytes(st.palette), st.vpos.numpy(), st.vexp.numpy())


@needs_ext
@pytest.mark.parametrize("cols", [64, 96, 100, 7])  # wide / VEC8 vector, then the scalar body (cols % 8 != 0)
def test_emulated_slots_decode_gives_each_slots_expert(cols):
    """The slot kernels' bodies over their grid (y = slot): slot s is expert ids[s], repeats
    and any order, every variant; each expert's padded verbatim list patches its own slot."""
    rng = np.random.default_rng(cols)
    w = np.stack([make_weights(24, cols, seed=e) for e in range(5)])
    w[1, 0, :4 if cols >= 4 else 1] = 0x0001  # verbatim blocks in experts 1 and 3 only
    w[3, 23, cols - 1] = 0xFF80
    st, (sm, idx, pal, vpos, vexp) = _slots_planes(w)
    assert vpos.shape[1] >= 1
    for variant in (kp.PAL_VARIANT_WIDE, kp.PAL_VARIANT_VEC8):
        for ids in ([3], [4, 1, 1, 0, 3], rng.integers(0, 5, size=9)):
            ids = np.asarray(ids, dtype=np.int64)
            out = np.zeros((len(ids), 24, cols), np.uint16)
            kind = []
            assert _cuda.emulate_palette_decode_slots(ids, sm, idx, pal, vpos, vexp, out, variant, kind) == 0
            assert np.array_equal(out, w[ids])
            assert kind[0] == (0 if cols % 8 else 1 if variant == kp.PAL_VARIANT_VEC8 else kind[0])
            assert variant == kp.PAL_VARIANT_VEC8 or cols % 8 or kind[0] in (2, 3)


@needs_ext
def test_emulated_slots_decode_counts_bad_ids_and_lists():
    """An id outside the stack leaves its slot unwritten and counts once; a list that is not
    ascending counts; an empty slot list launches nothing."""
    w = np.stack([make_weights(16, 64, seed=e) for e in range(3)])
    w[2, 5, 9] = w[2, 10, 40] = 0x0001  # two verbatim blocks in expert 2
    _, (sm, idx, pal, vpos, vexp) = _slots_planes(w)
    out = np.full((3, 16, 64), 0x1234, np.uint16)
    assert _cuda.emulate_palette_decode_slots(np.array([2, 3, -1], np.int64), sm, idx, pal, vpos, vexp, out) == 2
    assert np.array_equal(out[0], w[2]) and (out[1:] == 0x1234).all()
    assert vpos.shape[1] >= 2
    bad = vpos.copy()
    bad[2] = bad[2][::-1]
    assert _cuda.emulate_palette_decode_slots(np.array([2], np.int64), sm, idx, pal, bad, vexp, out[:1]) >= 1
    assert _cuda.emulate_palette_decode_slots(np.zeros(0, np.int64), sm, idx, pal, vpos, vexp,
                                              np.zeros((0, 16, 64), np.uint16)) == 0


# ------------------------------------------------------------------ paired palette order
@needs_ext
@pytest.mark.parametrize("shape", [(32, 256), (40, 1088)])
def test_emulated_kernels_take_the_paired_decode_on_a_reordered_palette(shape):
    """A writer-order palette that does not pair, held reordered (ops.paired_palette, the GPU
    loaders' order): the C++ table build agrees that it pairs (the wide decode runs its paired
    body, 3, where the stored order ran the general one, 2), and the decode, the tensor-core
    GEMV and the fused GEMM give the stored order's bits."""
    import torch

    from unweight import ops
    rows, cols = shape
    w = make_weights(rows, cols, seed=rows * cols)
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    pal = [int(b) for b in h.palette[: h.pal_size]]
    assert not ops.palette_pairs(pal)
    new, nib = ops.paired_palette(pal)
    idx2 = ops.remap_index(torch.from_numpy(p[C.SUFFIX_IDX]), nib).numpy()
    sm, vpos, vexp = p[C.SUFFIX_SM], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP]
    assert vpos.size > 0  # verbatim blocks too
    kinds = []
    for pl, ix in ((bytes(pal), p[C.SUFFIX_IDX]), (bytes(new), idx2)):
        out, kind = np.zeros((1, rows, cols), np.uint16), []
        assert _cuda.emulate_palette_decode_slots(np.zeros(1, np.int64), aligned(sm[None]), aligned(ix[None]), pl,
                                                  vpos[None], vexp[None], out, kp.PAL_VARIANT_WIDE, kind) == 0
        assert np.array_equal(out[0], w)
        kinds += kind
    assert kinds == [2, 3]
    x = (np.random.default_rng(1).standard_normal((3, cols)).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16)
    for run in (lambda pl, ix: _cuda.emulate_palette_gemv(x, sm, ix, pl, vpos, vexp, 1, False,
                                                         kp.PGEMV_VARIANT_MMA),
                lambda pl, ix: _cuda.emulate_palette_gemm(x, sm, ix, pl, vpos, vexp)):
        assert np.array_equal(run(bytes(pal), p[C.SUFFIX_IDX]), run(bytes(new), idx2))
