"""CPU tests of the palette GEMV on CUDA cores (csrc/cuda/palette_gemv.cuh).

* launch geometry: kernel_plan.py's pgemv_* mirror of csrc/cuda/kernel_plan.h, and the K parts
  of a row covering each of its steps exactly once;
* kernel body: ``unweight._cuda.emulate_palette_gemv`` runs the kernel's body through the warp
  emulator over the launch grid; its output is checked against fp32 references on odd shapes
  (K not a multiple of a step, rows past N in the last CTA), every K split, every finite BF16
  bit pattern (exact, through one-hot activations), infinities and NaNs, heavy verbatim blocks,
  both palette decodes, and for determinism and batch invariance; the numerical bound is the
  one test_fused_logic.py states;
* the tensor-core variant (``pgemv_mma_body``, PGEMV_VARIANT_MMA): its tile geometry, and the
  same checks at batch 1..32, including the half step of a row whose K is an odd multiple of 64;
  its staged form (PGEMV_VARIANT_MMA_STAGED, loads through cp.async into per-warp rings, which
  the emulator checks for races and lands only at their waits) and its prefetching form
  (PGEMV_VARIANT_MMA_PREFETCH, whose L2 prefetches must name the planes' bytes) give its bits;
* the queued tensor-core variant (``pgemv_mma_queue_body``, PGEMV_VARIANT_MMA_QUEUE, through
  ``emulate_palette_gemv_queue``): its units plan, the register-direct bits at 1, 2, 4 and 8
  units on grids smaller and larger than the units, any unit count within the bound and the
  same on every grid, every CTA order, its counters left zero.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import make_weights
from .test_fused_logic import _cuda, _fa_check, _pal, _x, all_finite_weights, check_ieee_specials, needs_ext

torch = pytest.importorskip("torch")


MMA = kp.PGEMV_VARIANT_MMA
MMA_STAGED = kp.PGEMV_VARIANT_MMA_STAGED
MMA_PREFETCH = kp.PGEMV_VARIANT_MMA_PREFETCH
MMA_BULK = kp.PGEMV_VARIANT_MMA_BULK


def _gemv(x, enc, parts=1, general=False, planes=None, variant=0):
    p = planes or enc.planes
    return _cuda.emulate_palette_gemv(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS],
                                      p[C.SUFFIX_VEXP], parts, general, variant)


# ------------------------------------------------------------------------------- geometry
def test_parts_cover_every_step_once():
    for K in (64, 448, 512, 576, 4096, 4160, 14336):
        steps = kp.cdiv(K, kp.PGEMV_COLS)
        for parts in (1, 2, 4, 8):
            seen = []
            for p in range(parts):
                first, last = kp.pgemv_steps(K, parts, p)
                assert 0 <= first <= last <= steps
                seen += range(first, last)
            assert seen == list(range(steps)), (K, parts)


def test_parts_heuristic():
    """Powers of two; more than one warp per row only while the rows leave the SMs room and each
    part keeps two batches of steps; the Llama-3-8B shapes on 132 SMs."""
    for N in (1, 7, 64, 1024, 4096, 14336, 128256):
        for K in (64, 1024, 4096, 14336):
            for sms in (1, 108, 132):
                p = kp.pgemv_parts(N, K, sms)
                assert p in (1, 2, 4, 8)
                if p > 1:
                    assert N * p <= sms * kp.PGEMV_WARPS_PER_SM
                    assert kp.cdiv(K, kp.PGEMV_COLS) >= 2 * p * kp.PGEMV_UNROLL
    assert [kp.pgemv_parts(N, K, 132) for N, K in ((4096, 4096), (1024, 4096), (128, 14336), (128256, 4096))] == \
        [1, 2, 4, 1]


@needs_ext
def test_cpp_plan_matches_python():
    for name in ("PGEMV_WARPS", "PGEMV_THREADS", "PGEMV_COLS", "PGEMV_UNROLL", "PGEMV_MAX_M", "PGEMV_MAX_PARTS",
                 "PGEMV_CTAS_PER_SM", "PGEMV_WARPS_PER_SM", "PGEMV_SMEM_BYTES", "PGEMV_DEEP_UNROLL",
                 "PGEMV_DEEP_CTAS_PER_SM", "PGEMV_VARIANT_DEFAULT", "PGEMV_VARIANT_STD", "PGEMV_VARIANT_DEEP",
                 "PGEMV_STAGED_DEPTH", "PGEMV_STAGED_SLOT", "PGEMV_STAGED_CTAS_PER_SM", "PGEMV_VARIANT_STAGED",
                 "PGEMV_STAGED_SMEM_BYTES"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for N in (1, 7, 64, 1000, 4096, 128256):
        for K in (64, 576, 4096, 14336):
            for sms in (1, 132, 1000):
                assert _cuda.plan_pgemv_parts(N, K, sms) == kp.pgemv_parts(N, K, sms)
        for parts in (1, 2, 4, 8):
            assert _cuda.plan_pgemv_grid(N, parts) == kp.pgemv_grid(N, parts)
    for K in (64, 576, 14336):
        for parts in (1, 2, 4, 8):
            for p in range(parts):
                assert tuple(_cuda.plan_pgemv_steps(K, parts, p)) == kp.pgemv_steps(K, parts, p)


# ------------------------------------------------------------------------- kernel body
CASES = [(1, 64), (15, 64), (17, 128), (63, 192), (65, 320), (9, 4160), (33, 1024)]


@needs_ext
@pytest.mark.parametrize("M", [1, 2, 3, 4])
@pytest.mark.parametrize("N,K", CASES)
def test_emulated_gemv_meets_the_bf16_gemm_bound(M, N, K):
    w = make_weights(N, K, seed=N * 17 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M * 5 + K)
    for parts in (1, 2, 4, 8):
        y = _gemv(x, enc, parts)
        assert y.shape == (M, N) and y.dtype == np.uint16
        _fa_check(y, x, w)


@needs_ext
@pytest.mark.parametrize("variant,rows", [(0, 4), (MMA, 16), (MMA, 32)])
def test_every_finite_bf16_pattern_decodes_exactly(variant, rows):
    """All 65280 finite BF16 patterns as W: one-hot x rows (4; 16 or 32 for the tensor-core
    variant, two or four n-tiles) pick single columns, one exact product each, so y equals W's columns bit for
    bit (-0 becomes +0).  Each pattern once, column groups alternating between the paired and
    the general decode (pal_regs.cuh's decode, which test_fused_logic.py runs over every
    pattern with both) and between one and two parts."""
    w = all_finite_weights(1)
    enc = tc.encode(w, "palette")
    assert enc.header.num_verbatim > 0
    for c0 in range(0, 256, rows):
        x = np.zeros((rows, 256), np.uint16)
        x[np.arange(rows), c0 + np.arange(rows)] = 0x3F80  # 1.0
        want = w[:, c0:c0 + rows].T.copy()
        want[want == 0x8000] = 0
        general = bool((c0 // rows) % 2)
        got = _gemv(x, enc, parts=1 + (c0 // (2 * rows)) % 2, general=general, variant=variant)
        assert np.array_equal(got, want), (general, c0)


@needs_ext
@pytest.mark.parametrize("variant,M", [(0, 3), (MMA, 9), (MMA, 20)])
def test_inf_and_nan_weights_follow_ieee(variant, M):
    check_ieee_specials(lambda x, enc: _gemv(x, enc, variant=variant), M, 640)


@needs_ext
@pytest.mark.parametrize("variant,M,parts", [(0, 4, (1, 2, 4)), (MMA, 11, (1, 2, 4, 8)), (MMA, 27, (1, 8))])
def test_heavy_verbatim_blocks_and_both_decodes(variant, M, parts):
    """Most 32-column blocks verbatim, including in the last step of a part and in a row's
    last, partial step (K = 1088: 2 steps + 64, or for the tensor-core variant 8.5 steps, its
    blocks in both halves of a step): the bound holds, both decodes agree bit for bit, and
    dropping the verbatim entries changes the result (the kernel applies them)."""
    rng = np.random.default_rng(11)
    f = (rng.standard_normal((77, 1088)) * np.exp2(rng.integers(-20, 20, (77, 1088)))).astype(np.float32)
    w = (f.view(np.uint32) >> 16).astype(np.uint16)
    enc = tc.encode(w, "palette")
    assert enc.header.num_verbatim > 0.5 * 77 * (1088 // 32)
    x = _x(M, 1088, seed=12)
    for p in parts:
        y = _gemv(x, enc, p, variant=variant)
        _fa_check(y, x, w)
        assert np.array_equal(_gemv(x, enc, p, general=True, variant=variant), y)
    p = dict(enc.planes)
    p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP] = p[C.SUFFIX_VPOS][:0], p[C.SUFFIX_VEXP][:0]
    assert not np.array_equal(_gemv(x, enc, planes=p, variant=variant), _gemv(x, enc, variant=variant))


@needs_ext
def test_deterministic_and_batch_invariant():
    """A batch row's sums use only that row of x in a fixed order: the same bits at every batch
    size 1..4 and on every repeat (the split into parts is what may change them)."""
    w = make_weights(96, 2048, seed=9)
    enc = tc.encode(w, "palette")
    x = _x(4, 2048, seed=10)
    for parts in (1, 4):
        y = _gemv(x, enc, parts)
        assert np.array_equal(_gemv(x, enc, parts), y)
        for M in (1, 2, 3):
            assert np.array_equal(_gemv(np.ascontiguousarray(x[:M]), enc, parts), y[:M])
        assert np.array_equal(_gemv(np.ascontiguousarray(x[2:3]), enc, parts)[0], y[2])


@needs_ext
@pytest.mark.parametrize("general", [False, True])
@pytest.mark.parametrize("variant", ["deep", "staged"])
def test_variants_give_the_default_bits(general, variant):
    """PGEMV_VARIANT_DEEP (four steps per batch of loads, where the default has two) and
    PGEMV_VARIANT_STAGED (loads through cp.async into per-warp shared-memory rings; the
    emulator checks its rings for races and lands each copy only at its wait) run the same
    steps in the same order: the default's bits on odd shapes (rows whose last step ends inside
    the warp), every parts, batch 1-4 and heavy verbatim blocks, with either decode; an unknown
    variant is refused."""
    rng = np.random.default_rng(21)
    f = (rng.standard_normal((77, 1088)) * np.exp2(rng.integers(-20, 20, (77, 1088)))).astype(np.float32)
    heavy = (f.view(np.uint32) >> 16).astype(np.uint16)
    cases = [make_weights(N, K, seed=N + K) for N, K in CASES] + [heavy, make_weights(40, 14336, seed=3)]
    for w in cases:
        enc = tc.encode(w, "palette")
        for M in (1, 4):
            x = _x(M, w.shape[1], seed=M + w.shape[1])
            for parts in (1, 2, 8):
                want = _gemv(x, enc, parts, general)
                got = _gemv(x, enc, parts, general, variant=kp.PGEMV_VARIANTS[variant])
                assert np.array_equal(got, want), (w.shape, M, parts)
    # (the default is STD)
    assert np.array_equal(_gemv(x, enc, 2, general, variant=kp.PGEMV_VARIANT_STD), _gemv(x, enc, 2, general))
    with pytest.raises(RuntimeError, match="unknown palette GEMV variant"):
        _gemv(_x(1, 64, seed=1), tc.encode(make_weights(4, 64, seed=1), "palette"), variant=8)


@needs_ext
def test_launcher_rejects_bad_arguments_without_a_gpu():
    base = {"x": 16, "ldx": 64, "M": 1, "sm": 16, "idx": 16, "N": 8, "K": 64, "palette": b"\x7f", "vpos": 0, "nv": 0,
            "vexp": 0, "parts": 1, "y": 16, "ldy": 8}

    def call(**kw):
        return _cuda.palette_gemv(**{**base, **kw})

    with pytest.raises(RuntimeError, match="M <= 4"):
        call(M=5)
    with pytest.raises(RuntimeError, match="K % 64"):
        call(K=96, ldx=96)
    with pytest.raises(RuntimeError, match="parts"):
        call(parts=3)
    with pytest.raises(RuntimeError, match="variant"):
        call(variant=10)
    with pytest.raises(RuntimeError, match="aligned"):
        call(idx=8)
    with pytest.raises(ValueError):  # null pointers are refused by the binding
        call(y=0)
    if _cuda.device_count() == 0:  # valid arguments, no device: an error, never a crash
        with pytest.raises(RuntimeError):
            call()


# ------------------------------------------------------------- the tensor-core variant


def test_mma_parts_cover_every_step_once_and_fill_the_device():
    """The tensor-core variant's parts: each 128-column step of a row once; powers of two that
    keep the tiles' warps within what the SMs hold and each part PGEMV_MMA_MIN_STEPS steps; on
    Llama-3-8B's shapes and 132 SMs, one wave of 1,536-2,048 warps (the head: 8,016)."""
    for K in (64, 192, 1088, 4096, 4160, 14336):
        steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
        for parts in range(1, kp.PGEMV_MAX_PARTS + 1):
            seen = []
            for p in range(parts):
                first, last = kp.pgemv_mma_steps(K, parts, p)
                seen += range(first, last)
            assert seen == list(range(steps)), (K, parts)
    for N in (1, 15, 16, 17, 4096, 14336, 128256):
        for K in (64, 1024, 4096, 14336):
            for sms in (1, 132):
                p = kp.pgemv_mma_parts(N, K, sms)
                assert p in (1, 2, 4, 8)
                if p > 1:
                    assert kp.cdiv(N, 16) * p <= sms * kp.PGEMV_MMA_WARPS_PER_SM
                    assert kp.cdiv(K, kp.PGEMV_MMA_COLS) >= p * kp.PGEMV_MMA_MIN_STEPS
    shapes = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
    assert [kp.pgemv_mma_parts(N, K, 132) for N, K in shapes] == [8, 4, 2, 8, 1]
    # the register-direct kernel's rule: any count; 6144 x 4096 fills the SMs with 5 (one wave of
    # 1,920 warps in 384 CTAs of five, three per SM: 1,980 slots) where 4 leaves 1,536 warps
    assert [kp.pgemv_variant_parts(N, K, 132, MMA) for N, K in shapes] == [8, 5, 2, 8, 1]
    assert [kp.pgemv_variant_parts(N, K, 132, v) for v in (MMA_PREFETCH, MMA_SPLIT) for N, K in shapes] == \
        [8, 5, 2, 8, 1] * 2
    assert kp.pgemv_variant_parts(5120, 5120, 132, MMA) == 5 and kp.pgemv_mma_parts(5120, 5120, 132) == 4
    assert [kp.pgemv_mma_cta_warps(p) for p in range(1, 9)] == [8, 8, 3, 8, 5, 6, 7, 8]
    assert [kp.pgemv_mma_sm_warps(p) for p in range(1, 9)] == [16, 16, 15, 16, 15, 12, 14, 16]
    assert [kp.pgemv_mma_grid(4096, p) for p in (1, 2, 3, 4, 5, 8)] == [32, 64, 256, 128, 256, 256]
    for N in (1, 15, 16, 17, 1000, 4096, 6144, 14336, 128256):
        for K in (64, 1024, 1088, 4096, 14336):
            for sms in (1, 78, 132):
                p = kp.pgemv_mma_parts_any(N, K, sms)
                assert 1 <= p <= kp.PGEMV_MAX_PARTS and p >= kp.pgemv_mma_parts(N, K, sms)
                if p > 1:  # one wave, each part its PGEMV_MMA_MIN_STEPS
                    assert kp.cdiv(N, 16) * p <= sms * kp.pgemv_mma_sm_warps(p)
                    assert kp.cdiv(K, kp.PGEMV_MMA_COLS) >= p * kp.PGEMV_MMA_MIN_STEPS
    assert kp.pgemv_variant_parts(4096, 4096, 132) == kp.pgemv_parts(4096, 4096, 132)
    assert [kp.pgemv_max_m(v) for v in (0, 1, 2, 3, MMA, MMA_STAGED, MMA_PREFETCH, MMA_BULK)] == \
        [4, 4, 4, 4, 32, 32, 32, 32]
    assert [kp.pgemv_variant_parts(N, K, 132, MMA_BULK) for N, K in shapes] == [8, 4, 2, 8, 1]
    assert [v for v in kp.PGEMV_VARIANTS.values() if kp.pgemv_needs_tiled(v)] == [MMA_BULK]
    assert [kp.pgemv_variant_parts(N, K, 132, MMA_STAGED) for N, K in shapes] == [8, 4, 2, 8, 1]
    assert kp.pgemv_variant_grid(4096, 8, MMA_STAGED) == kp.pgemv_mma_grid(4096, 8)
    assert kp.pgemv_supported(32, 4096, MMA) and not kp.pgemv_supported(33, 4096, MMA)
    assert not kp.pgemv_supported(5, 4096) and not kp.pgemv_supported(8, 96, MMA)


@needs_ext
def test_mma_cpp_plan_matches_python():
    for name in ("PGEMV_VARIANT_MMA", "PGEMV_MMA_ROWS", "PGEMV_MMA_COLS", "PGEMV_MMA_MAX_M", "PGEMV_MMA_CTAS_PER_SM",
                 "PGEMV_MMA_WARPS_PER_SM", "PGEMV_MMA_MIN_STEPS", "PGEMV_MMA_SMEM_BYTES", "PGEMV_MMA4_CTAS_PER_SM",
                 "PGEMV_MMA4_RING_CTAS_PER_SM",
                 "PGEMV_VARIANT_MMA_STAGED", "PGEMV_MMA_STAGED_DEPTH", "PGEMV_MMA_STAGED_SLOT",
                 "PGEMV_MMA_STAGED_CTAS_PER_SM", "PGEMV_MMA_STAGED_SMEM_BYTES", "PGEMV_VARIANT_MMA_PREFETCH",
                 "PGEMV_MMA_PREFETCH_STEPS", "PGEMV_VARIANT_MMA_BULK", "PGEMV_MMA_BULK_DEPTH", "PGEMV_MMA_BULK_SLOT",
                 "PGEMV_MMA_BULK_CTAS_PER_SM", "PGEMV_MMA_BULK_SMEM_BYTES"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for N in (1, 17, 1000, 4096, 128256):
        for K in (64, 576, 4096, 14336):
            for sms in (1, 132, 1000):
                assert _cuda.plan_pgemv_mma_parts(N, K, sms) == kp.pgemv_mma_parts(N, K, sms)
                assert _cuda.plan_pgemv_mma_parts_any(N, K, sms) == kp.pgemv_mma_parts_any(N, K, sms)
                for v in (1, 2, 3, MMA, MMA_STAGED, MMA_PREFETCH, MMA_BULK, MMA_SPLIT):
                    assert _cuda.plan_pgemv_variant_parts(N, K, sms, v) == kp.pgemv_variant_parts(N, K, sms, v)
        for parts in range(1, kp.PGEMV_MAX_PARTS + 1):
            assert _cuda.plan_pgemv_mma_grid(N, parts) == kp.pgemv_mma_grid(N, parts)
            assert _cuda.plan_pgemv_mma_cta_warps(parts) == kp.pgemv_mma_cta_warps(parts)
            assert _cuda.plan_pgemv_mma_sm_warps(parts) == kp.pgemv_mma_sm_warps(parts)
            for K in (64, 576, 1088, 14336):
                assert _cuda.plan_pgemv_mma_part_steps(K, parts) == kp.pgemv_mma_part_steps(K, parts)
        for parts in (1, 2, 4, 8):
            for v in (1, 2, 3, MMA, MMA_STAGED, MMA_PREFETCH, MMA_BULK):
                assert _cuda.plan_pgemv_variant_grid(N, parts, v) == kp.pgemv_variant_grid(N, parts, v)
    for v in (0, 1, 2, 3, MMA, MMA_STAGED, MMA_PREFETCH, MMA_BULK, 8, MMA_SPLIT):
        assert _cuda.plan_pgemv_max_m(v) == kp.pgemv_max_m(v)
        assert _cuda.plan_pgemv_is_mma(v) == kp.pgemv_is_mma(v)
        assert _cuda.plan_pgemv_any_parts(v) == kp.pgemv_any_parts(v)
    for K in (64, 576, 1088, 14336):
        for parts in range(1, kp.PGEMV_MAX_PARTS + 1):
            for p in range(parts):
                assert tuple(_cuda.plan_pgemv_mma_steps(K, parts, p)) == kp.pgemv_mma_steps(K, parts, p)


def _mma(x, enc, parts=1, general=False, planes=None):
    return _gemv(x, enc, parts, general, planes, variant=MMA)


@needs_ext
@pytest.mark.parametrize("M", [1, 5, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("N,K", CASES + [(40, 1088)])
def test_mma_gemv_meets_the_bf16_gemm_bound(M, N, K):
    """Odd shapes (tiles past N, K an odd multiple of 64: a half step), batch 1..32 (one, two or
    four n-tiles), every parts."""
    w = make_weights(N, K, seed=N * 13 + K)
    enc = tc.encode(w, "palette")
    x = _x(M, K, seed=M * 7 + K)
    for parts in (1, 2, 3, 4, 5, 8):
        y = _mma(x, enc, parts)
        assert y.shape == (M, N) and y.dtype == np.uint16
        _fa_check(y, x, w)


@needs_ext
def test_mma_deterministic_and_batch_invariant():
    """A batch row's sums use only its own x row (an mma's output columns are independent): the
    same bits at every batch size 1..32 (one, two and four n-tiles) and on every repeat."""
    w = make_weights(50, 1088, seed=19)
    enc = tc.encode(w, "palette")
    x = _x(32, 1088, seed=20)
    for parts in (1, 4):
        y = _mma(x, enc, parts)
        assert np.array_equal(_mma(x, enc, parts), y)
        for M in (1, 2, 7, 8, 9, 15, 16, 17, 31):
            assert np.array_equal(_mma(np.ascontiguousarray(x[:M]), enc, parts), y[:M]), M
        assert np.array_equal(_mma(np.ascontiguousarray(x[12:13]), enc, parts)[0], y[12])


@needs_ext
def test_mma_launcher_limits_without_a_gpu():
    base = {"x": 16, "ldx": 64, "M": 1, "sm": 16, "idx": 16, "N": 8, "K": 64, "palette": b"\x7f", "vpos": 0, "nv": 0,
            "vexp": 0, "parts": 1, "y": 16, "ldy": 8, "variant": MMA}

    def call(**kw):
        return _cuda.palette_gemv(**{**base, **kw})

    with pytest.raises(RuntimeError, match="M <= 32"):
        call(M=33)
    with pytest.raises(RuntimeError, match="K % 64"):
        call(K=96, ldx=96)
    for parts in (0, 9):
        with pytest.raises(RuntimeError, match="parts must be 1 .. 8"):
            call(parts=parts)
    for v in (MMA_STAGED, MMA_BULK):  # rings sized for a CTA of eight warps: powers of two only
        with pytest.raises(RuntimeError, match="parts must be 1, 2, 4 or 8 for this variant"):
            call(parts=3, variant=v)
    if _cuda.device_count() == 0:  # batch 5..32 passes the checks; no device: an error, never a crash
        for M in (16, 32):
            with pytest.raises(RuntimeError, match="(?i)cuda|device|driver"):
                call(M=M)


@needs_ext
@pytest.mark.parametrize("general", [False, True])
@pytest.mark.parametrize("variant", [MMA_STAGED, MMA_PREFETCH])
def test_mma_feeds_give_the_mma_bits(general, variant):
    """PGEMV_VARIANT_MMA_STAGED runs the register-direct tensor-core GEMV's steps, decode, mma
    and sums in the same order from per-warp shared-memory rings (its copies swizzled by row;
    the emulator lands a copy only at its wait and fails a read of a slot a copy is still
    filling); PGEMV_VARIANT_MMA_PREFETCH adds L2 prefetches, which the emulator checks lie in
    the planes (a half step's second half past the last row would not).  Both give the MMA
    bits on odd shapes (tiles past N, half steps, parts ending in a half step), every parts,
    one, two and four n-tiles, heavy verbatim blocks and either decode."""
    rng = np.random.default_rng(23)
    f = (rng.standard_normal((77, 1088)) * np.exp2(rng.integers(-20, 20, (77, 1088)))).astype(np.float32)
    heavy = (f.view(np.uint32) >> 16).astype(np.uint16)
    cases = [make_weights(N, K, seed=N + 3 * K) for N, K in CASES + [(40, 1088)]] + [heavy]
    for w in cases:
        enc = tc.encode(w, "palette")
        for M in (1, 9, 20):
            x = _x(M, w.shape[1], seed=M + 7 * w.shape[1])
            for parts in (1, 2, 8):
                want = _gemv(x, enc, parts, general, variant=MMA)
                got = _gemv(x, enc, parts, general, variant=variant)
                assert np.array_equal(got, want), (w.shape, M, parts)


@needs_ext
def test_mma_any_parts_one_tile_per_cta():
    """At 3, 5, 6 and 7 parts a CTA is one tile's warps (kernel_plan.pgemv_mma_cta_warps): the
    register-direct GEMV then sums the same step ranges in the same order as the queued GEMV at
    that many units per tile (units that would be empty dropped: an empty part adds +0 to a
    sum that starts at +0), which it matches bit for bit; the prefetching feed gives its bits
    at those parts too.  On odd shapes (tiles past N, half steps, parts ending in a half step,
    parts left empty), batch 1, 9 and 20, heavy verbatim blocks, either decode; each batch row's
    bits the same at every batch size."""
    shapes = [(15, 64 * 7), (63, 1088), (40, 1088), (33, 1664)]
    cases = [make_weights(N, K, seed=N + 9 * K) for N, K in shapes] + [_heavy(47)]
    for i, w in enumerate(cases):
        enc = tc.encode(w, "palette")
        general = bool(i % 2)
        steps = kp.cdiv(w.shape[1], kp.PGEMV_MMA_COLS)
        for M in (1, 9, 20):
            x = _x(M, w.shape[1], seed=M + 13 * w.shape[1])
            for parts in (3, 5, 6, 7):
                y = _gemv(x, enc, parts, general, variant=MMA)
                if parts <= steps:
                    assert np.array_equal(_queue(x, enc, parts, 2, general), y), (w.shape, M, parts)
                assert np.array_equal(_gemv(x, enc, parts, general, variant=MMA_PREFETCH), y), (w.shape, M, parts)
                if M == 20:
                    _fa_check(y, x, w)
                    for m in (1, 9):
                        got = _gemv(np.ascontiguousarray(x[:m]), enc, parts, general, variant=MMA)
                        assert np.array_equal(got, y[:m]), (w.shape, m, parts)


@needs_ext
def test_mma_staged_meets_the_bound_and_is_batch_invariant():
    """The staged tensor-core GEMV on its own: within the GEMM's bound at batch 1..32, and each
    batch row's bits the same at every batch size."""
    w = make_weights(50, 1088, seed=29)
    enc = tc.encode(w, "palette")
    x = _x(32, 1088, seed=30)
    for parts in (1, 4):
        y = _gemv(x, enc, parts, variant=MMA_STAGED)
        _fa_check(y, x, w)
        for M in (1, 8, 17):
            assert np.array_equal(_gemv(np.ascontiguousarray(x[:M]), enc, parts, variant=MMA_STAGED), y[:M]), M


@needs_ext
@pytest.mark.parametrize("general", [False, True])
def test_slots_gemv_is_each_experts_mma_gemv(general):
    """The slots GEMV (pgemv_slots_body: grid y = slot, the expert id read in the kernel) over a
    palette stack with padded verbatim lists (runtime/expert_slots.py): slot s gives the
    register-direct tensor-core GEMV's bits on expert ids[s] alone at batch 1, for repeated and
    unordered ids, a half step (1088 = 8.5 steps), parts 1, 3 (one tile per CTA) and 4 and either
    decode; an id outside the stack leaves its row unwritten and counts once."""
    from unweight.runtime.expert_slots import ExpertSlots
    rng = np.random.default_rng(31)
    E, N, K = 4, 40, 1088
    w = np.stack([make_weights(N, K, seed=e) for e in range(E)])
    f = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 20, (N, K)))).astype(np.float32)
    w[2] = (f.view(np.uint32) >> 16).astype(np.uint16)  # expert 2: most blocks verbatim, the others few
    st = ExpertSlots.from_weights(w, "cpu")
    planes = [t.numpy() for t in (st.sm, st.idx, st.vpos, st.vexp)]
    pal = bytes(st.palette)
    ids = np.array([2, 0, 2, 3, 1], np.int64)
    x = _x(len(ids), K, seed=5)
    for parts in (1, 3, 4):
        y, nerr = _cuda.emulate_palette_gemv_slots(x, ids, planes[0], planes[1], pal, planes[2], planes[3], parts,
                                                   general)
        assert nerr == 0
        for s, e in enumerate(ids):
            enc = tc.encode(w[e], "palette")
            want = _gemv(np.ascontiguousarray(x[s:s + 1]), enc, parts, general, variant=MMA)
            assert np.array_equal(y[s:s + 1], want), (parts, s, e)
    bad = np.array([1, 4, -1], np.int64)
    y, nerr = _cuda.emulate_palette_gemv_slots(x[:3], bad, planes[0], planes[1], pal, planes[2], planes[3], 1, general)
    assert nerr == 2 and (y[1:] == 0xFFFF).all()
    enc = tc.encode(w[1], "palette")
    assert np.array_equal(y[:1], _gemv(np.ascontiguousarray(x[:1]), enc, 1, general, variant=MMA))


# ------------------------------------------------------------- the queued tensor-core variant
MMA_QUEUE = kp.PGEMV_VARIANT_MMA_QUEUE


def _queue(x, enc, units=1, ctas=1, general=False, planes=None, tiled=0):
    p = planes or enc.planes
    return _cuda.emulate_palette_gemv_queue(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS],
                                            p[C.SUFFIX_VEXP], units, ctas, general, tiled)


def test_queue_units_cover_every_step_once_and_fill_the_device():
    """A tile's units (any count, not only powers of two) cover each step once; the plan gives
    about PGEMV_MMA_QUEUE_UNITS_PER_WARP units per resident warp, units of at least
    PGEMV_MMA_QUEUE_MIN_STEPS steps (even where the tile's steps are), and on Llama-3-8B's
    shapes and 132 SMs: 4096 x 4096 16 units of 2 steps, 6144 x 4096 16, 14336 x 4096 8 of 4,
    4096 x 14336 19 of 6 (the last 4), the head 1."""
    for K in (64, 192, 1088, 4096, 4160, 14336):
        steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
        for units in range(1, min(steps, 20) + 1):
            seen = []
            for p in range(units):
                first, last = kp.pgemv_mma_unit_steps(K, units, p)
                seen += range(first, last)
            assert seen == list(range(steps)), (K, units)
            if units & (units - 1) == 0:
                assert [kp.pgemv_mma_unit_steps(K, units, p) for p in range(units)] == \
                    [kp.pgemv_mma_steps(K, units, p) for p in range(units)]
    for N in (1, 15, 16, 17, 4096, 14336, 128256):
        for K in (64, 1024, 4096, 4160, 14336):
            for sms in (1, 132):
                u = kp.pgemv_mma_queue_units(N, K, sms)
                steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
                assert 1 <= u <= min(kp.PGEMV_MMA_QUEUE_MAX_UNITS, steps)
                per = kp.cdiv(steps, u)
                if u > 1:
                    assert per >= kp.PGEMV_MMA_QUEUE_MIN_STEPS and (per % 2 == 0 or per == steps)
    shapes = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
    assert [kp.pgemv_mma_queue_units(N, K, 132) for N, K in shapes] == [16, 16, 8, 19, 1]
    assert [kp.pgemv_variant_parts(N, K, 132, MMA_QUEUE) for N, K in shapes] == [16, 16, 8, 19, 1]
    assert kp.pgemv_mma_queue_grid(4096, 16, 132, 2) == 264 and kp.pgemv_mma_queue_grid(64, 2, 132, 2) == 1
    assert kp.pgemv_mma_queue_workspace(4096, 1, 8) == 0
    assert kp.pgemv_mma_queue_workspace(40, 3, 5) == 3 * 3 * 5 * 16
    assert kp.pgemv_mma_queue_counters(17) == kp.PGEMV_QUEUE_TILES + 2
    assert kp.pgemv_is_mma(MMA_QUEUE) and kp.pgemv_max_m(MMA_QUEUE) == 32
    assert [kp.pgemv_mma_queue_ctas_per_sm(M) for M in (1, 16, 17, 32)] == [2, 2, 1, 1]


@needs_ext
def test_queue_cpp_plan_matches_python():
    for name in ("PGEMV_VARIANT_MMA_QUEUE", "PGEMV_MMA_QUEUE_UNITS_PER_WARP", "PGEMV_MMA_QUEUE_MIN_STEPS",
                 "PGEMV_MMA_QUEUE_MAX_UNITS", "PGEMV_QUEUE_HEAD", "PGEMV_QUEUE_DONE", "PGEMV_QUEUE_TILES"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for N in (1, 17, 1000, 4096, 128256):
        for K in (64, 576, 4096, 14336):
            for sms in (1, 132, 1000):
                assert _cuda.plan_pgemv_mma_queue_units(N, K, sms) == kp.pgemv_mma_queue_units(N, K, sms)
                assert _cuda.plan_pgemv_variant_parts(N, K, sms, MMA_QUEUE) == \
                    kp.pgemv_variant_parts(N, K, sms, MMA_QUEUE)
                for units in (1, 3, 8):
                    for cps in (1, 2):
                        assert _cuda.plan_pgemv_mma_queue_grid(N, units, sms, cps) == \
                            kp.pgemv_mma_queue_grid(N, units, sms, cps)
        for units in (1, 2, 5):
            for M in (1, 9, 32):
                assert _cuda.plan_pgemv_mma_queue_workspace(N, units, M) == kp.pgemv_mma_queue_workspace(N, units, M)
        assert _cuda.plan_pgemv_mma_queue_counters(N) == kp.pgemv_mma_queue_counters(N)
    for M in (1, 16, 17, 32):
        assert _cuda.plan_pgemv_mma_queue_ctas_per_sm(M) == kp.pgemv_mma_queue_ctas_per_sm(M)
    for K in (64, 576, 1088, 14336):
        for units in (1, 3, 7, 8):
            for p in range(units):
                assert tuple(_cuda.plan_pgemv_mma_unit_steps(K, units, p)) == kp.pgemv_mma_unit_steps(K, units, p)


def _heavy(seed, N=77, K=1088):
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 20, (N, K)))).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


@needs_ext
def test_queue_gives_the_mma_bits_at_power_of_two_units():
    """At 1, 2, 4 or 8 units per tile the queued GEMV sums the register-direct variant's parts
    in its order: its bits, on odd shapes (tiles past N, half steps, units of one step and of an
    odd count, whose next unit's first step lands in the other buffer), batch 1, 9 and 20, heavy
    verbatim blocks and either decode (by shape), on persistent grids smaller than the units
    (warps take several units from the queue, the stream running on from one unit into the
    next) and larger (warps with none)."""
    shapes = [(15, 64), (63, 192), (9, 4160), (40, 1088), (33, 384)]
    cases = [make_weights(N, K, seed=N + 5 * K) for N, K in shapes] + [_heavy(41)]
    for i, w in enumerate(cases):
        enc = tc.encode(w, "palette")
        tiles = kp.cdiv(w.shape[0], 16)
        general = bool(i % 2)  # the paired decode and the general one, shape by shape
        for M in (1, 9, 20):
            x = _x(M, w.shape[1], seed=M + 11 * w.shape[1])
            for units in (1, 2, 4, 8):
                if units > kp.cdiv(w.shape[1], kp.PGEMV_MMA_COLS):
                    continue
                want = _gemv(x, enc, units, general, variant=MMA)
                # one CTA (its 8 warps take every unit), and one more than the units need; two
                # CTAs on every other shape
                for ctas in sorted({1, kp.cdiv(tiles * units, 8) + 1} | ({2} if i % 2 else set())):
                    got = _queue(x, enc, units, ctas, general)
                    assert np.array_equal(got, want), (w.shape, M, units, ctas)


@needs_ext
def test_x_prefetch_changes_no_bit_and_asks_for_x_alone():
    """The tensor-core GEMVs' L1 prefetch of x (ops.gemv_x_prefetch, on by default) names only
    lines of x the kernel reads, and only after its grid-dependency wait (the emulator fails a
    prefetch outside the launch's buffers, as a half step's missing half in x's last row would
    be, and one of x before that wait), and changes no bit: the register-direct, staged and
    queued kernels with it and without, on odd shapes (tiles past N, half steps, parts of one
    step), batch 1, 9 and 20, at 1, 2 and 8 parts or units."""
    from unweight import ops

    from .helpers import gemv_x_prefetch
    assert ops.gemv_x_prefetch()
    for N, K in ((15, 64), (63, 192), (40, 1088), (9, 4160)):
        enc = tc.encode(make_weights(N, K, seed=N + 3 * K), "palette")
        steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
        for M in (1, 9, 20):
            x = _x(M, K, seed=M + K)
            for parts in (1, 2, 8):
                got = {}
                for on in (True, False):
                    with gemv_x_prefetch(on):
                        got[on] = [_gemv(x, enc, parts, variant=v) for v in (MMA, MMA_STAGED)] + \
                            [_queue(x, enc, min(parts, steps), 2)]
                assert all(np.array_equal(a, b) for a, b in zip(got[True], got[False])), (N, K, M, parts)


@needs_ext
def test_queue_any_unit_count_meets_the_bound_and_is_deterministic():
    """Unit counts that are not powers of two (3, 5, 7, the plan's 19-like counts) and the most
    a tile has: within the GEMM's bound, the same bits whatever the grid (so whichever warp
    runs which unit, and in whatever order), and each batch row's bits the same at every batch
    size."""
    w = make_weights(50, 1088, seed=43)  # 9 steps (8.5: the last a half step)
    enc = tc.encode(w, "palette")
    x = _x(32, 1088, seed=44)
    for units in (3, 5, 7, 9):
        y = _queue(x, enc, units, 1)
        _fa_check(y, x, w)
        for ctas in (2, 5):
            assert np.array_equal(_queue(x, enc, units, ctas), y), (units, ctas)
        for M in (1, 8, 17):
            assert np.array_equal(_queue(np.ascontiguousarray(x[:M]), enc, units, 3), y[:M]), (units, M)


@needs_ext
def test_queue_in_every_cta_order():
    """CTAs in reverse and shuffled orders, several resident at once with their warps' turns
    mixed (the emulator holds back a CTA after each global atomic, so a unit's arrival runs as
    late as it can): the sums are handed over through the workspace with the fences the
    emulator checks, and every order gives the forward order's bits."""
    w = _heavy(47, 70, 1088)
    enc = tc.encode(w, "palette")
    x = _x(3, 1088, seed=48)
    want = _queue(x, enc, 4, 2)
    try:
        for order, seed, resident in (("reverse", 0, 1), ("shuffle", 1, 3), ("shuffle", 2, 4), ("forward", 0, 2)):
            _cuda.emu_cta_order(order, seed, resident)
            for ctas in (2, 3, 5):
                assert np.array_equal(_queue(x, enc, 4, ctas), want), (order, seed, resident, ctas)
    finally:
        _cuda.emu_cta_order("forward")


@needs_ext
def test_queue_launcher_limits_without_a_gpu():
    base = {"x": 16, "ldx": 128, "M": 1, "sm": 16, "idx": 16, "N": 8, "K": 128, "palette": b"\x7f", "vpos": 0,
            "nv": 0, "vexp": 0, "units": 1, "ctas": 1, "ws": 16, "queue": 16, "y": 16, "ldy": 8}

    def call(**kw):
        return _cuda.palette_gemv_queue(**{**base, **kw})

    with pytest.raises(RuntimeError, match="M <= 32"):
        call(M=33)
    with pytest.raises(RuntimeError, match="units"):
        call(units=2)  # one step per tile
    with pytest.raises(RuntimeError, match="grid"):
        call(ctas=0)
    with pytest.raises(RuntimeError, match="workspace"):
        call(K=256, ldx=256, units=2, ws=0)
    with pytest.raises(ValueError):  # null pointers are refused by the binding
        call(queue=0)
    if _cuda.device_count() == 0:  # valid arguments, no device: an error, never a crash
        with pytest.raises(RuntimeError):
            call()


# --------------------------------------------------------------------------- timing probes
def _probe(x, enc, parts, probe, planes=None, pal=None):
    p = planes or enc.planes
    return _cuda.emulate_palette_gemv_probe(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], pal or _pal(enc), p[C.SUFFIX_VPOS],
                                            p[C.SUFFIX_VEXP], parts, probe)


def _paired(enc):
    """enc's planes and palette in the paired order the GPU loaders hold (ops.pair_index); None
    for a palette no order pairs (the loaders decode it the general way, which no probe times)."""
    from unweight import ops
    if ops.palette_pairs(_pal(enc)):
        return dict(enc.planes), _pal(enc)
    got = ops.pair_index(_pal(enc), torch.from_numpy(enc.planes[C.SUFFIX_IDX]))
    if got is None:
        return None
    pal, _, idx = got
    return {**enc.planes, C.SUFFIX_IDX: idx.numpy()}, bytes(pal)


@needs_ext
def test_probe_constants_match_python():
    for name in ("PGEMV_PROBE_NO_DECODE", "PGEMV_PROBE_NO_MMA", "PGEMV_PROBE_STREAM"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    assert set(kp.PGEMV_PROBES.values()) == {kp.PGEMV_PROBE_NO_DECODE, kp.PGEMV_PROBE_NO_MMA, kp.PGEMV_PROBE_STREAM}


@needs_ext
def test_probes_run_the_mma_launch_inside_its_buffers():
    """The GEMV timing probes (palette_gemv_probe: the register-direct tensor-core GEMV with the
    decode, the mma, or everything but the loads, left out) run through the warp emulator, which fails a
    read outside the planes, x or the verbatim lists, on odd shapes (tiles past N, half steps,
    every parts) with verbatim blocks: the same loads as the kernel they time.  Their output is
    not the product (the decode probe's differs from it) but is deterministic."""
    ran = 0
    for N, K in CASES + [(40, 1088)]:
        enc = tc.encode(make_weights(N, K, seed=N + 5 * K), "palette")
        if _paired(enc) is None:
            continue
        planes, pal = _paired(enc)
        ran += 1
        for M in (1, 8):
            x = _x(M, K, seed=M + K)
            want = _gemv(x, enc, 1, variant=MMA)
            for parts in (1, 2, 5, 8):
                for probe in kp.PGEMV_PROBES.values():
                    got = _probe(x, enc, parts, probe, planes, pal)
                    assert got.shape == (M, N)
                    assert np.array_equal(got.view(np.int16), _probe(x, enc, parts, probe, planes, pal).view(np.int16))
                    if probe == kp.PGEMV_PROBE_NO_DECODE and N * K >= 4096:
                        assert not np.array_equal(got, want), (N, K, M, parts)
    assert ran >= 4


@needs_ext
def test_probe_launcher_refuses_what_it_does_not_time():
    enc = tc.encode(make_weights(16, 128, seed=3, spread=False), "palette")
    planes, pal = _paired(enc)
    x = _x(1, 128, seed=1)
    with pytest.raises(RuntimeError, match="unknown GEMV probe"):
        _probe(x, enc, 1, 7, planes, pal)
    with pytest.raises(RuntimeError, match="1..8 rows"):
        _probe(_x(9, 128, seed=1), enc, 1, kp.PGEMV_PROBE_STREAM, planes, pal)
    unpaired = bytes([0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x79, 0x7A])  # k=0 (even) beside k=8 (odd)
    with pytest.raises(RuntimeError, match="paired palette"):
        _probe(x, enc, 1, kp.PGEMV_PROBE_STREAM, planes, unpaired)


# ------------------------------------------------------------------------------ split layout
MMA_SPLIT = kp.PGEMV_VARIANT_MMA_SPLIT


def _eight_halves(N, K, seed, verbatim=0.003):
    """BF16 bits [N, K] whose palette falls in 8 exponent halves (16 exponents from an even one)
    with both signs; from 4096 weights on, also verbatim blocks (exponents outside) and exact
    zeros, each too rare to displace a palette entry."""
    rng = np.random.default_rng(seed)
    e = rng.integers(112, 128, (N, K))
    rare = N * K >= 4096
    far = (rng.random((N, K)) < verbatim) & rare
    e[far] = rng.integers(1, 100, int(far.sum()))
    bits = ((rng.integers(0, 2, (N, K)) << 15) | (e << 7) | rng.integers(0, 128, (N, K))).astype(np.uint16)
    bits[(rng.random((N, K)) < 0.01) & rare] = 0
    return bits


def _split_planes(enc):
    from unweight import ops
    lo, codes = ops.split_palette_planes(torch.from_numpy(enc.planes[C.SUFFIX_SM]),
                                         torch.from_numpy(enc.planes[C.SUFFIX_IDX]), _pal(enc))
    return {**enc.planes, C.SUFFIX_SM: lo.numpy(), C.SUFFIX_IDX: codes.numpy()}


@needs_ext
def test_split_constants_match_python():
    for name in ("PGEMV_VARIANT_MMA_SPLIT", "PAL_SPLIT_HALVES"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    assert kp.pgemv_is_mma(MMA_SPLIT) and MMA_SPLIT not in kp.PGEMV_VARIANTS.values()


@needs_ext
def test_split_layout_gives_the_mma_bits():
    """The tensor-core GEMV on split planes (ops.split_palette_planes; pal_decode4_split: the
    BF16 low bytes as held, the high bytes from a paired lookup of sign and exponent-half codes)
    gives the register-direct variant's bits on the stored planes, on odd shapes (tiles past N,
    half steps, parts ending in a half step), batch 1..32, every parts, with verbatim blocks,
    zeros and both signs, in file and tile-major order."""
    from unweight import ops
    for N, K in CASES + [(40, 1088), (64, 256)]:
        enc = tc.encode(_eight_halves(N, K, seed=N * 7 + K), "palette")
        assert ops.split_halves(_pal(enc)) is not None and (enc.header.num_verbatim > 0 or N * K < 4096)
        split = _split_planes(enc)
        for M in (1, 9, 20):
            x = _x(M, K, seed=M + 3 * K)
            for parts in (1, 2, 8):
                want = _gemv(x, enc, parts, variant=MMA)
                got = _gemv(x, enc, parts, planes=split, variant=MMA_SPLIT)
                assert np.array_equal(got, want), (N, K, M, parts)
        if N % 16 == 0 and K % 64 == 0:
            tiled = dict(split)
            tiled[C.SUFFIX_SM], tiled[C.SUFFIX_IDX] = (t.numpy() for t in ops.tile_palette_planes(
                torch.from_numpy(split[C.SUFFIX_SM]), torch.from_numpy(split[C.SUFFIX_IDX])))
            x = _x(1, K, seed=K)
            got = _cuda.emulate_palette_gemv(x, tiled[C.SUFFIX_SM], tiled[C.SUFFIX_IDX], _pal(enc), tiled[C.SUFFIX_VPOS],
                                             tiled[C.SUFFIX_VEXP], 1, False, MMA_SPLIT, 1)
            assert np.array_equal(got, _gemv(x, enc, 1, variant=MMA)), (N, K)


@needs_ext
def test_split_layout_decodes_every_code_and_refuses_wide_palettes():
    """Every exponent of an 8-half palette with every sign and mantissa bit, through one-hot
    activations (y = the weight itself, exact in fp32), and a palette of 9 halves refused."""
    e = np.arange(112, 128)
    bits = ((np.arange(2)[:, None, None] << 15) | (e[None, :, None] << 7) | np.arange(128)[None, None, :])
    bits = bits.reshape(-1, 64).astype(np.uint16)  # 64 rows of 64 weights
    enc = tc.encode(bits, "palette")
    split = _split_planes(enc)
    for k in (0, 17, 63):
        x = np.zeros((1, 64), dtype=np.uint16)
        x[0, k] = 0x3F80  # 1.0
        got = _gemv(x, enc, 1, planes=split, variant=MMA_SPLIT)
        assert np.array_equal(got[0], bits[:, k]), k
    wide = bytes(range(107, 123))
    with pytest.raises(RuntimeError, match="at most 8 exponent halves"):
        _cuda.emulate_palette_gemv(_x(1, 64, seed=0), split[C.SUFFIX_SM], split[C.SUFFIX_IDX], wide,
                                   split[C.SUFFIX_VPOS], split[C.SUFFIX_VEXP], 1, False, MMA_SPLIT)


# ------------------------------------------------------------ the verbatim lists' row index
def _vrow(vpos, rows, cols):
    """The row index ops.verbatim_rows builds, from numpy (vpos [nv] or [E, V])."""
    keys = np.arange(rows + 1, dtype=np.int64) * kp.cdiv(cols, C.PAL_BLOCK)
    v = vpos.astype(np.int64)
    if v.ndim == 1:
        return np.searchsorted(v, keys).astype(np.uint32)
    return np.stack([np.searchsorted(r, keys) for r in v]).astype(np.uint32)


def _row_index_cases():
    """Few verbatim blocks (make_weights), most blocks verbatim (rows with more entries than
    the index's window, so the search past it runs), and a stack of rows with none, on odd
    shapes (rows past N in the last tile, half steps)."""
    cases = [make_weights(N, K, seed=N + 3 * K) for N, K in ((33, 384), (40, 1088))] + [_heavy(43), _heavy(44, 16, 256)]
    sparse = make_weights(50, 512, seed=9)
    sparse[::3] = 0x3F80  # every third row 1.0 throughout: in the palette, no verbatim block
    return cases + [sparse]


@needs_ext
def test_verbatim_rows_matches_a_search_of_the_list():
    from unweight import ops
    for w in _row_index_cases():
        enc = tc.encode(w, "palette")
        vpos = enc.planes[C.SUFFIX_VPOS]
        got = ops.verbatim_rows(torch.from_numpy(vpos), *w.shape)
        assert got.dtype == torch.uint32 and np.array_equal(got.numpy(), _vrow(vpos, *w.shape))
        assert int(got[0]) == 0 and int(got[-1]) == len(vpos)
    stack = torch.tensor([[0, 5, 7], [1, 2, 300]], dtype=torch.int64).to(torch.uint32)
    got = ops.verbatim_rows(stack, 3, 4096)  # 128 blocks per row
    assert got.tolist() == [[0, 3, 3, 3], [0, 2, 2, 3]]
    assert ops.verbatim_rows(stack[:, :0], 3, 4096).tolist() == [[0] * 4] * 2
    with pytest.raises(ValueError, match="vpos"):
        ops.verbatim_rows(stack[None], 3, 4096)


@needs_ext
def test_row_index_gives_the_search_bits():
    """Each fused kernel's verbatim cursors from the row index (pmma_row_cursor: the row's
    bounds, its first PMMA_VROW_WINDOW entries, a search past them) give the bits of the search
    of the whole list: the tensor-core GEMV and its staged and prefetching feeds, and the
    CUDA-core GEMV and its deep and staged forms, at every parts (a part's first block past the
    row's first entries), the queued GEMV, the fused GEMM with a K split, and the NO_MMA timing
    probe (decode and patch)."""
    for i, w in enumerate(_row_index_cases()):
        N, K = w.shape
        enc = tc.encode(w, "palette")
        p = enc.planes
        vr = _vrow(p[C.SUFFIX_VPOS], N, K)
        args = (p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP])
        for M in (1, 3, 9):
            x = _x(M, K, seed=M + 7 * K)
            cuda_core = (kp.PGEMV_VARIANT_STD, kp.PGEMV_VARIANT_DEEP, kp.PGEMV_VARIANT_STAGED) if M <= 4 else ()
            for variant in (MMA, MMA_STAGED, MMA_PREFETCH) + cuda_core:
                for parts in (1, 2, 4, 8):
                    want = _cuda.emulate_palette_gemv(x, *args, parts, bool(i % 2), variant)
                    got = _cuda.emulate_palette_gemv(x, *args, parts, bool(i % 2), variant, 0, vrow=vr)
                    assert np.array_equal(got, want), (w.shape, M, variant, parts)
            for units, ctas in ((1, 1), (3, 2)):
                if units <= kp.cdiv(K, kp.PGEMV_MMA_COLS):
                    want = _cuda.emulate_palette_gemv_queue(x, *args, units, ctas, False, 0)
                    got = _cuda.emulate_palette_gemv_queue(x, *args, units, ctas, False, 0, vrow=vr)
                    assert np.array_equal(got, want), (w.shape, M, units, ctas)
            for splits in (1, 3):
                want = _cuda.emulate_palette_gemm(x, *args, splits)
                assert np.array_equal(_cuda.emulate_palette_gemm(x, *args, splits, vrow=vr), want), (w.shape, splits)
        pp = _paired(enc)
        if pp is not None:
            planes, pal = pp
            pargs = (planes[C.SUFFIX_SM], planes[C.SUFFIX_IDX], pal, planes[C.SUFFIX_VPOS], planes[C.SUFFIX_VEXP])
            x = _x(1, K, seed=K)
            want = _cuda.emulate_palette_gemv_probe(x, *pargs, 2, kp.PGEMV_PROBE_NO_MMA)
            got = _cuda.emulate_palette_gemv_probe(x, *pargs, 2, kp.PGEMV_PROBE_NO_MMA, 0, vrow=vr)
            assert np.array_equal(got, want), w.shape


@needs_ext
def test_slots_row_index_gives_the_search_bits():
    """The slots GEMV with the stack's row index ([E, N + 1], offsets into each expert's own
    padded list): the bits of its search, for experts with few and with most blocks verbatim."""
    from unweight.runtime.expert_slots import ExpertSlots
    N, K = 40, 1088
    w = np.stack([make_weights(N, K, seed=1), _heavy(45, N, K), make_weights(N, K, seed=9)])
    st = ExpertSlots.from_weights(w, "cpu")
    sm, idx, vpos, vexp = (t.numpy() for t in (st.sm, st.idx, st.vpos, st.vexp))
    ids = np.array([1, 0, 2, 1], np.int64)
    x = _x(len(ids), K, seed=3)
    for parts in (1, 4):
        want, _ = _cuda.emulate_palette_gemv_slots(x, ids, sm, idx, bytes(st.palette), vpos, vexp, parts)
        got, nerr = _cuda.emulate_palette_gemv_slots(x, ids, sm, idx, bytes(st.palette), vpos, vexp, parts,
                                                     vrow=_vrow(vpos, N, K))
        assert nerr == 0 and np.array_equal(got, want), parts


@needs_ext
def test_row_index_that_does_not_fit_the_list_reads_inside_it():
    """An index whose entries pass the list's end is clamped to it (no read outside vpos, which
    the emulator would fail): every row then holds no entry, as with an empty list; the binding
    refuses an index of the wrong length."""
    w = _heavy(46, 33, 384)
    enc = tc.encode(w, "palette")
    p = enc.planes
    args = (p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP])
    x = _x(1, 384, seed=1)
    empty = _cuda.emulate_palette_gemv(x, *args[:3], p[C.SUFFIX_VPOS][:0], p[C.SUFFIX_VEXP][:0], 1, False, MMA)
    huge = np.full(34, 0xFFFFFFF0, np.uint32)
    assert np.array_equal(_cuda.emulate_palette_gemv(x, *args, 1, False, MMA, 0, vrow=huge), empty)
    with pytest.raises(ValueError, match="vrow"):
        _cuda.emulate_palette_gemv(x, *args, 1, False, MMA, 0, vrow=huge[:-1])
