"""CPU tests of the fused palette GEMM on tensor cores (csrc/cuda/palette_matmul.cuh).

* launch geometry: kernel_plan.py's pmma_* mirror of csrc/cuda/kernel_plan.h, the K-split
  heuristic on the Llama-3-8B shapes, and the column order inside a tile (A and B fragments
  of every mma step contract over the same physical columns, each column exactly once);
* kernel body: ``unweight._cuda.emulate_palette_gemm`` runs the kernel's body through the
  warp emulator (csrc/cuda/emu: lanes, shuffles, ballots, cp.async groups, mma.sync m16n8k16)
  over the launch grid; its output is checked against fp32 references on odd shapes, on every
  finite BF16 bit pattern (exact, through one-hot activations), with heavy verbatim blocks,
  K splits, both palette decodes, and for determinism and batch invariance;
* the numerical bound as flash-attention states it: the kernel's largest error against an
  fp32 reference is at most twice that of a BF16 GEMM (torch's CPU bf16 matmul standing in
  for cuBLAS) against the same reference.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import bf16_to_f64, make_weights, wgmma_tile_wait

torch = pytest.importorskip("torch")
try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

needs_ext = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

LLAMA_8B = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]


def _x(M, K, seed):
    """bf16 bits [M, K] of N(0, 1) activations."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _pal(enc):
    return bytes(int(b) for b in enc.header.palette[: enc.header.pal_size])


def _emulate(x, enc, splits=1, general=False, stage_tiles=1, x_shared=False):
    p = enc.planes
    return _cuda.emulate_palette_gemm(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS],
                                      p[C.SUFFIX_VEXP], splits, general, stage_tiles, int(x_shared))


# The copy layouts besides the one-tile default: (stage_tiles, x_shared); all give its bits in
# the emulator (the wgmma layout, x_shared = PMMA_XS_WGMMA: the same k16 steps in the same order,
# each rounded once as the emulated mma.sync rounds them).
LAYOUTS = [(kp.PMMA_SUB_WIDE, False), (1, True), (1, kp.PMMA_XS_WGMMA)]


def all_finite_weights(seed):
    """The 65280 finite BF16 patterns (exponent != 255), shuffled into W [255, 256]."""
    pats = np.arange(65536, dtype=np.uint32)
    finite = pats[((pats >> 7) & 0xFF) != 0xFF].astype(np.uint16)
    return np.random.default_rng(seed).permutation(finite).reshape(255, 256)


def _fa_check(y, x, w):
    """flash-attention's criterion: max |kernel - fp32 ref| <= 2 max |bf16 GEMM - fp32 ref|."""
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    wt = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16)
    ref = (xt.float() @ wt.float().T).double()
    base = (xt @ wt.T).double()
    got = torch.from_numpy(bf16_to_f64(y))
    assert torch.isfinite(got).all()
    err, base_err = (got - ref).abs().max().item(), (base - ref).abs().max().item()
    assert err <= 2 * base_err + 1e-30, (err, base_err)
    return err, base_err


# ------------------------------------------------------------------------------- geometry
def test_tile_column_order_matches_the_mma_fragments():
    """Lane (g, t) decodes W columns 16t + 4j + {0,1} into A registers 0 (row g) / 1 (row g+8)
    and 16t + 4j + {2,3} into registers 2 / 3 at mma step j, and loads x columns 16t + 4j +
    {0,1} / {2,3} into B registers 0 / 1.  Read through the PTX fragment layouts, every logical
    k of a step is then one physical column, the same in A and in B, and the 4 steps x 16 k
    cover the tile's 64 columns once."""
    covered = []
    for j in range(4):
        a_cols, b_cols = {}, {}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for i in range(8):  # A element i: register i // 2, half i & 1
                reg = i // 2
                assert g + 8 * (reg & 1) == g + (8 if (i >> 1) & 1 else 0)  # PTX row of a_i
                k = 2 * t + (i & 1) + (8 if i >= 4 else 0)                   # PTX column of a_i
                a_cols.setdefault(k, set()).add(16 * t + 4 * j + 2 * (reg >> 1) + (i & 1))
            for i in range(4):  # B element i: register i // 2
                k = 2 * t + (i & 1) + (8 if i >= 2 else 0)                   # PTX row of b_i
                b_cols.setdefault(k, set()).add(16 * t + 4 * j + 2 * (i // 2) + (i & 1))
        assert sorted(a_cols) == sorted(b_cols) == list(range(16))
        for k in range(16):
            assert len(a_cols[k]) == 1 and a_cols[k] == b_cols[k]
            covered += list(a_cols[k])
    assert sorted(covered) == list(range(64))


def test_splits_heuristic():
    for N, K in LLAMA_8B + [(64, 64), (65, 4096), (1, 128), (4097, 14336), (512, 256)]:
        n_kt = K // kp.PMMA_TILE_K
        for sms in (1, 8, 108, 132, 144):
            for M in (1, 64, 65, 256):
                s = kp.pmma_splits(N, K, sms, M)
                per = kp.pmma_split_tiles(K, s)
                assert 1 <= s <= max(1, n_kt)
                assert (s - 1) * per < n_kt <= s * per  # no empty split, every tile covered
                if s > 1:
                    assert per >= kp.PMMA_MIN_SPLIT_TILES
            # the split (hence the sum order, hence the bits) is the same for every batch of 1..64
            # (the wgmma variant's CTAs take 128 rows: 1..128)
            assert len({kp.pmma_splits(N, K, sms, M) for M in range(1, 65)}) == 1
            assert len({kp.pmma_splits(N, K, sms, M, True) for M in range(1, 129)}) == 1
            assert kp.pmma_workspace_max(N, K, sms) == max(
                kp.pmma_workspace_need(M, N, K, kp.pmma_splits(N, K, sms, M, wg), wg) for M in range(1, 257)
                for wg in (False, True))
    # batch 1 on an H100 (132 SMs): every shape fills the SMs (>= 2.9 CTAs per SM)
    plan = {(N, K): (kp.pmma_splits(N, K, 132), kp.pmma_grid_x(N, 1)) for N, K in LLAMA_8B}
    assert plan[(4096, 4096)] == (8, 64) and plan[(4096, 14336)] == (8, 64)
    assert plan[(14336, 4096)] == (2, 224) and plan[(6144, 4096)] == (6, 96)
    assert plan[(128256, 4096)] == (1, 2004)
    for s, gx in plan.values():
        assert s * gx >= 2.9 * 132
    # past 64 rows the batch chunks supply the CTAs and the split shrinks: partials stay small
    assert [kp.pmma_splits(4096, 4096, 132, M) for M in (64, 128, 256)] == [8, 4, 2]
    assert kp.pmma_grid_x(4096, 256) == 256
    assert [kp.pmma_ntiles(M) for M in (0, 1, 8, 9, 16, 17, 32, 33, 64, 65, 256, 257)] == \
        [0, 1, 1, 2, 2, 4, 4, 8, 8, 8, 8, 0]
    assert [kp.pmma_chunks(M) for M in (1, 64, 65, 128, 129, 256)] == [1, 1, 2, 2, 3, 4]
    # wgmma: up to 16 n-tiles (128 rows) per CTA, so half the chunks and twice the split past 64
    assert [kp.pmma_ntiles(M, True) for M in (1, 9, 17, 33, 64, 65, 128, 129, 256, 257)] == \
        [1, 2, 4, 8, 8, 16, 16, 16, 16, 0]
    assert [kp.pmma_chunks(M, True) for M in (1, 128, 129, 256)] == [1, 1, 2, 2]
    # (its splits plan for the three CTAs per SM its 8- and 16-n-tile kernels hold: one wave)
    assert [kp.pmma_splits(4096, 4096, 132, M, True) for M in (64, 128, 256)] == [6, 6, 3]
    for N, K in LLAMA_8B[:4]:
        assert kp.pmma_grid_x(N, 128, True) * kp.pmma_splits(N, K, 132, 128, True) <= 1.15 * 3 * 132
    assert kp.pmma_grid_x(4096, 256, True) == 128
    assert kp.pmma_supported(256, 4096) and not kp.pmma_supported(257, 4096) and not kp.pmma_supported(1, 4000)
    assert kp.pmma_workspace_elems(3, 100, 1) == 0 and kp.pmma_workspace_elems(3, 100, 4) == 1200
    # wgmma: x as stage images (its batch chunks' rows x K) after the partials, from a 16-byte boundary
    assert [kp.pmma_wg_x_rows(M) for M in (1, 8, 9, 33, 65, 128, 129, 256)] == [8, 8, 16, 64, 128, 128, 256, 256]
    assert kp.pmma_workspace_need(3, 100, 64, 4) == 1200
    assert kp.pmma_wg_x_at(3, 99, 2) == 596 and kp.pmma_workspace_need(3, 99, 64, 2, True) == 596 + 8 * 64 // 2
    assert kp.pmma_workspace_need(5, 100, 128, 1, True) == 8 * 128 // 2


@needs_ext
def test_cpp_plan_matches_python():
    for name in ("PMMA_WARPS", "PMMA_THREADS", "PMMA_TILE_N", "PMMA_ROWS", "PMMA_TILE_K", "PMMA_STAGES",
                 "PMMA_TILE_BYTES", "PMMA_SMEM_BYTES", "PMMA_CHUNK_M", "PMMA_MAX_M", "PMMA_CTAS_PER_SM",
                 "PMMA_MIN_SPLIT_TILES", "PMMA_MAX_SPLITS", "PMMA_WG_CTAS_PER_SM", "PMMA_SUB_WIDE", "PMMA_X_ROW_BYTES",
                 "PMMA_VROW_WINDOW"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    assert _cuda.PMMA_WG_CHUNK_M == kp.PMMA_WG_CHUNK_M and _cuda.PMMA_XS_WGMMA == kp.PMMA_XS_WGMMA
    assert _cuda.PMMA_WG_STAGES == kp.PMMA_WG_STAGES and _cuda.PMMA_WG_X_THREADS == kp.PMMA_WG_X_THREADS
    # three wgmma CTAs of 16 n-tiles share an SM's 227 KiB (1 KiB reserved each); two at four stages
    assert 3 * (kp.pmma_smem_bytes(1, 16, kp.PMMA_XS_WGMMA) + 1024) <= 228 * 1024
    assert [kp.pmma_stages(x, nt) for x, nt in ((0, 8), (1, 8), (2, 8), (2, 16))] == [4, 4, 4, 3]
    for tiles in (1, kp.PMMA_SUB_WIDE):
        for nt in (1, 2, 4, 8, 16):
            for xs in (0, 1, kp.PMMA_XS_WGMMA):
                assert _cuda.plan_pmma_smem_bytes(tiles, nt, xs) == kp.pmma_smem_bytes(tiles, nt, xs)
    assert kp.pmma_smem_bytes(1) == kp.PMMA_SMEM_BYTES
    for M in range(-1, 260):
        for wg in (False, True):
            assert _cuda.plan_pmma_ntiles(M, wg) == kp.pmma_ntiles(M, wg)
            assert _cuda.plan_pmma_chunks(M, wg) == kp.pmma_chunks(M, wg)
    for N in (1, 63, 64, 65, 4096, 6144, 14336, 128256, 10 ** 7):
        assert _cuda.plan_pmma_row_blocks(N) == kp.pmma_row_blocks(N)
        assert _cuda.plan_pmma_counters(N) == kp.pmma_counters(N)
        for M in (1, 64, 65, 200):
            for wg in (False, True):
                assert _cuda.plan_pmma_grid_x(N, M, wg) == kp.pmma_grid_x(N, M, wg)
        for K in (64, 128, 320, 4096, 14336, 65536 * 64):
            for sms in (1, 108, 132, 1000):
                assert _cuda.plan_pmma_workspace_max(N, K, sms) == kp.pmma_workspace_max(N, K, sms)
                for M in (1, 64, 100, 256):
                    assert _cuda.plan_pmma_splits(N, K, sms, M, True) == kp.pmma_splits(N, K, sms, M, True)
                    s = kp.pmma_splits(N, K, sms, M)
                    assert _cuda.plan_pmma_splits(N, K, sms, M) == s
                    assert _cuda.plan_pmma_split_tiles(K, s) == kp.pmma_split_tiles(K, s)
                    assert _cuda.plan_pmma_workspace_elems(M, N, s) == kp.pmma_workspace_elems(M, N, s)
                    assert _cuda.plan_pmma_wg_x_at(M, N, s) == kp.pmma_wg_x_at(M, N, s)
                    assert _cuda.plan_pmma_wg_x_rows(M) == kp.pmma_wg_x_rows(M)
                    for wg in (False, True):
                        assert _cuda.plan_pmma_workspace_need(M, N, K, s, wg) == kp.pmma_workspace_need(M, N, K, s, wg)


# ------------------------------------------------------------------------- kernel body
CASES = [(1, 64), (15, 64), (17, 128), (63, 192), (65, 320), (130, 256), (33, 1024)]


@needs_ext
@pytest.mark.parametrize("M", [1, 3, 8, 9, 17, 40, 64, 65, 130])
@pytest.mark.parametrize("N,K", CASES)
def test_emulated_gemm_meets_the_bf16_gemm_bound(M, N, K):
    w = make_weights(N, K, seed=N * 131 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M + K)
    splits = min(3, K // 64)
    for s in sorted({1, splits}):
        y = _emulate(x, enc, s)
        assert y.shape == (M, N) and y.dtype == np.uint16
        _fa_check(y, x, w)


@needs_ext
@pytest.mark.parametrize("M", [1, 17, 65])
@pytest.mark.parametrize("N,K", CASES)
def test_wide_stages_give_the_same_bits(M, N, K):
    """Two tiles per ring stage (whole 128-byte lines per copy, swizzled in shared memory)
    run the same mma sequence as one: the same bits, splits with an odd tile count included
    (K = 192 and 320 leave a stage holding only its first tile)."""
    w = make_weights(N, K, seed=N * 7 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M * 3 + K)
    for s in sorted({1, min(3, K // 64)}):
        assert np.array_equal(_emulate(x, enc, s, stage_tiles=kp.PMMA_SUB_WIDE), _emulate(x, enc, s))


@needs_ext
@pytest.mark.parametrize("M", [1, 3, 8, 9, 16, 33, 64, 65, 130, 256])
@pytest.mark.parametrize("N,K", CASES)
def test_shared_x_gives_the_same_bits(M, N, K):
    """x copied once per CTA into shared memory (zero-filled past M, swizzled) feeds the mma
    the same values as each warp's own loads: the same bits at every n-tile count, in the
    last partial batch chunk, with warps past N (N = 15, 17, 65) and on every split."""
    w = make_weights(N, K, seed=N * 5 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M * 7 + K)
    for s in sorted({1, min(3, K // 64), K // 64}):
        assert np.array_equal(_emulate(x, enc, s, x_shared=True), _emulate(x, enc, s))


@needs_ext
@pytest.mark.parametrize("M", [1, 9, 33, 64, 65, 130, 256])
@pytest.mark.parametrize("N,K", [(15, 64), (65, 320), (130, 448)])
def test_wgmma_gives_the_same_bits(M, N, K):
    """x rewritten as wgmma's stage images (zeros past M), copied per stage by the bulk-copy
    engine and multiplied by wgmma m64n(8 NT)k16 gives the mma.sync kernel's bits: at every
    n-tile count up to 16, in a last partial chunk of 128 rows (130), with warps past N and on
    every split."""
    w = make_weights(N, K, seed=N * 3 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M * 5 + K)
    for s in sorted({1, min(3, K // 64), K // 64}):
        assert np.array_equal(_emulate(x, enc, s, x_shared=kp.PMMA_XS_WGMMA), _emulate(x, enc, s))


@needs_ext
@pytest.mark.parametrize("M", [1, 33, 130, 256])
def test_wgmma_schedules_give_the_same_bits(M):
    """The wgmma GEMM's two schedules (ops.wgmma_tile_wait: each tile waiting for its own
    wgmmas, x refilled a stage earlier; or the default, a tile's wgmmas under the next tile's
    decode) run the same wgmmas in the same order: the same bits, with verbatim-heavy rows (the
    tiles that decode whole) and on every split."""
    rng = np.random.default_rng(M)
    f = (rng.standard_normal((130, 448)) * np.exp2(rng.integers(-6, 6, (130, 448)))).astype(np.float32)
    enc = tc.encode((f.view(np.uint32) >> 16).astype(np.uint16), "palette")
    assert enc.header.num_verbatim > 0
    x = _x(M, 448, seed=M + 3)
    for s in (1, 3, 7):
        with wgmma_tile_wait(False):
            want = _emulate(x, enc, s, x_shared=kp.PMMA_XS_WGMMA)
        with wgmma_tile_wait(True) as on:
            assert on
            assert np.array_equal(_emulate(x, enc, s, x_shared=kp.PMMA_XS_WGMMA), want)


@needs_ext
@pytest.mark.parametrize("general", [False, True])
def test_every_finite_bf16_pattern_decodes_exactly(general):
    """W holds all 65280 finite BF16 patterns (the exponent-255 ones are the next test's): a
    one-hot x row picks one column of W, a single exact product, so y must equal W's column
    bit for bit (-0 becomes +0: the accumulator starts at +0)."""
    w = all_finite_weights(0)
    enc = tc.encode(w, "palette")
    assert enc.header.num_verbatim > 0
    for c0 in range(0, 256, 64):
        x = np.zeros((64, 256), np.uint16)
        x[np.arange(64), c0 + np.arange(64)] = 0x3F80  # 1.0
        want = w[:, c0:c0 + 64].T.copy()
        want[want == 0x8000] = 0
        for stage_tiles, x_shared in [(1, False)] + LAYOUTS:
            y = _emulate(x, enc, splits=2 if c0 else 1, general=general, stage_tiles=stage_tiles, x_shared=x_shared)
            assert np.array_equal(y, want)


def check_ieee_specials(run, M, K):
    """run(x, enc) -> y bits: +inf, -inf and NaN weights give the float64 product's NaNs and
    infinities."""
    w = make_weights(40, K, seed=4, spread=False)
    w[3, 5], w[7, K - 58], w[9, K - 1] = 0x7F80, 0xFF80, 0x7FC1  # +inf, -inf, NaN
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=6)
    y = bf16_to_f64(run(x, enc))
    ref = bf16_to_f64(x) @ bf16_to_f64(w).T
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    inf = np.isinf(ref)
    assert np.array_equal(y[inf], ref[inf])


@needs_ext
def test_inf_and_nan_weights_follow_ieee():
    check_ieee_specials(_emulate, 5, 128)


@needs_ext
def test_decodes_agree_and_match_the_palette_cases():
    """The paired and the general palette decode are exact, so they agree bit for bit; both on a
    palette that pairs (16 consecutive exponents) and on one that cannot (zero exponent + 15)."""
    rng = np.random.default_rng(3)
    for exps in (np.arange(110, 126), np.r_[0, np.arange(111, 126)]):
        e = rng.choice(exps, size=(70, 192))
        sm = rng.integers(0, 256, size=(70, 192), dtype=np.uint32)
        w = (((sm & 0x80) << 8) | (e.astype(np.uint32) << 7) | (sm & 0x7F)).astype(np.uint16)
        enc = tc.encode(w, "palette")
        assert enc.header.pal_size == 16 and enc.header.num_verbatim == 0
        x = _x(9, 192, seed=8)
        y1, y2 = _emulate(x, enc), _emulate(x, enc, general=True)
        assert np.array_equal(y1, y2)
        _fa_check(y1, x, w)


@needs_ext
def test_heavy_verbatim_blocks_and_tail_rows():
    """Weights whose exponents spread over 40 values: most 32-column blocks are verbatim,
    rows with both blocks of a tile verbatim, and verbatim blocks in the last, partial row tile."""
    rng = np.random.default_rng(11)
    f = (rng.standard_normal((77, 384)) * np.exp2(rng.integers(-20, 20, (77, 384)))).astype(np.float32)
    w = (f.view(np.uint32) >> 16).astype(np.uint16)
    enc = tc.encode(w, "palette")
    bpr = 384 // 32
    assert enc.header.num_verbatim > 0.5 * 77 * bpr
    x = _x(12, 384, seed=12)
    for s in (1, 2, 6):
        y = _emulate(x, enc, s)
        _fa_check(y, x, w)
        for stage_tiles, x_shared in LAYOUTS:
            assert np.array_equal(_emulate(x, enc, s, stage_tiles=stage_tiles, x_shared=x_shared), y)
    # dropping the verbatim blocks must change the result (the kernel applies them)
    p = dict(enc.planes)
    y0 = _cuda.emulate_palette_gemm(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS][:0],
                                    p[C.SUFFIX_VEXP][:0], 1, False)
    assert not np.array_equal(y0, _emulate(x, enc))


@needs_ext
def test_deterministic_and_batch_invariant():
    w = make_weights(96, 512, seed=9)
    enc = tc.encode(w, "palette")
    x = _x(64, 512, seed=10)
    for s in (1, 4):
        ys = [_emulate(x, enc, s) for _ in range(2)]
        assert np.array_equal(ys[0], ys[1])
        # a row's sums use only that row of x in a fixed order: the same bits at any batch size
        for M in (1, 5, 8, 16, 33):
            assert np.array_equal(_emulate(np.ascontiguousarray(x[:M]), enc, s), ys[0][:M])
        assert np.array_equal(_emulate(np.ascontiguousarray(x[40:41]), enc, s)[0], ys[0][40])
    # past 64 rows the batch runs in chunks of 64 rows; with the same split each chunk's rows
    # get the bits they get alone
    x2 = _x(150, 512, seed=13)
    y2 = _emulate(x2, enc, 2)
    for m0 in (0, 64, 128):
        assert np.array_equal(_emulate(np.ascontiguousarray(x2[m0:m0 + 64]), enc, 2), y2[m0:m0 + 64])
    # the wgmma variant's chunks are 128 rows: each gets the bits it gets alone, which are the
    # mma.sync kernel's
    wg = kp.PMMA_XS_WGMMA
    y3 = _emulate(x2, enc, 2, x_shared=wg)
    assert np.array_equal(y3, y2)
    for m0 in (0, 128):
        assert np.array_equal(_emulate(np.ascontiguousarray(x2[m0:m0 + 128]), enc, 2, x_shared=wg), y3[m0:m0 + 128])


@needs_ext
def test_launcher_rejects_bad_arguments_without_a_gpu():
    base = {"x": 16, "ldx": 64, "M": 1, "sm": 16, "idx": 16, "N": 8, "K": 64, "palette": b"\x7f", "vpos": 0, "nv": 0,
            "vexp": 0, "splits": 1, "ws": 0, "counters": 0, "y": 16, "ldy": 8}

    def call(**kw):
        return _cuda.palette_gemm(**{**base, **kw})

    with pytest.raises(RuntimeError, match="M <= 256"):
        call(M=257)
    with pytest.raises(RuntimeError, match="K % 64"):
        call(K=96, ldx=96)
    with pytest.raises(RuntimeError, match="splits"):
        call(splits=2)
    with pytest.raises(RuntimeError, match="shared x goes with stage_tiles = 1"):
        call(stage_tiles=2, x_shared=1)
    with pytest.raises(RuntimeError, match="x_shared must be 0, 1 or 2"):
        call(x_shared=3)
    with pytest.raises(RuntimeError, match="shared x goes with stage_tiles = 1"):
        call(stage_tiles=2, x_shared=kp.PMMA_XS_WGMMA)
    with pytest.raises(RuntimeError, match="aligned"):
        call(sm=8)
    with pytest.raises(RuntimeError, match="workspace"):
        call(K=128, ldx=128, splits=2)
    with pytest.raises(RuntimeError, match="x row stride too large"):  # x offsets within a chunk are 32-bit
        call(ldx=(2**31 // kp.PMMA_CHUNK_M + 8) // 8 * 8)
    with pytest.raises(ValueError):  # null pointers are refused by the binding
        call(x=0)
    if _cuda.device_count() == 0:  # valid arguments, no device: an error, never a crash
        with pytest.raises(RuntimeError):
            call()


@needs_ext
@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1288, 5000])
def test_paired_warp_lower_bounds_agree_with_searchsorted(n):
    """The fused GEMM finds a tile range's verbatim entries with two lower bounds searched at
    once by the two half-warps (warp_lower_bound2); both, and the one-key warp_lower_bound,
    are numpy's searchsorted(side='left') for keys below, inside (hits and gaps, runs of equal
    entries) and above the array, and every lane ends with the result."""
    rng = np.random.default_rng(n)
    v = np.sort(rng.integers(0, 4 * n + 8, n)).astype(np.uint32)  # repeats included
    keys = np.concatenate([np.array([0, 1, 4 * n + 8, 4 * n + 9, 2 ** 32 + 5], np.uint64),
                           v.astype(np.uint64)[: 64], (v.astype(np.uint64) + 1)[-64:],
                           rng.integers(0, 4 * n + 10, 64).astype(np.uint64)])
    kb = keys[rng.permutation(keys.size)]
    out = _cuda.emulate_warp_lower_bounds(v, keys, kb)
    want_a = np.searchsorted(v.astype(np.uint64), keys, side="left")
    want_b = np.searchsorted(v.astype(np.uint64), kb, side="left")
    assert np.array_equal(out[:, 0], want_a)
    assert np.array_equal(out[:, 1], want_b)
    assert np.array_equal(out[:, 2], want_a)
    assert np.array_equal(out[:, 3], want_a)
