"""CPU tests of the palette GEMV on CUDA cores (csrc/cuda/palette_gemv.cuh).

* launch geometry: kernel_plan.py's pgemv_* mirror of csrc/cuda/kernel_plan.h, and the K parts
  of a row covering each of its steps exactly once;
* kernel body: ``unweight._cuda.emulate_palette_gemv`` runs the kernel's body through the warp
  emulator over the launch grid; its output is checked against fp32 references on odd shapes
  (K not a multiple of a step, rows past N in the last CTA), every K split, every finite BF16
  bit pattern (exact, through one-hot activations), infinities and NaNs, heavy verbatim blocks,
  both palette decodes, and for determinism and batch invariance; the numerical bound is the
  one test_fused_logic.py states.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import make_weights
from .test_fused_logic import _cuda, _fa_check, _pal, _x, all_finite_weights, check_ieee_specials, needs_ext

torch = pytest.importorskip("torch")


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
def test_every_finite_bf16_pattern_decodes_exactly():
    """All 65280 finite BF16 patterns as W: one-hot x rows pick single columns, one exact
    product each, so y equals W's columns bit for bit (-0 becomes +0).  Each pattern once,
    column groups alternating between the paired and the general decode (pal_regs.cuh's
    decode, which test_fused_logic.py runs over every pattern with both)."""
    w = all_finite_weights(1)
    enc = tc.encode(w, "palette")
    assert enc.header.num_verbatim > 0
    for c0 in range(0, 256, 4):
        x = np.zeros((4, 256), np.uint16)
        x[np.arange(4), c0 + np.arange(4)] = 0x3F80  # 1.0
        want = w[:, c0:c0 + 4].T.copy()
        want[want == 0x8000] = 0
        general = bool((c0 // 4) % 2)
        assert np.array_equal(_gemv(x, enc, parts=1 + (c0 // 8) % 2, general=general), want), (general, c0)


@needs_ext
def test_inf_and_nan_weights_follow_ieee():
    check_ieee_specials(_gemv, 3, 640)


@needs_ext
def test_heavy_verbatim_blocks_and_both_decodes():
    """Most 32-column blocks verbatim, including in the last step of a part and in a row's
    last, partial step (K = 1088 = 2 steps + 64): the bound holds, both decodes agree bit for
    bit, and dropping the verbatim entries changes the result (the kernel applies them)."""
    rng = np.random.default_rng(11)
    f = (rng.standard_normal((77, 1088)) * np.exp2(rng.integers(-20, 20, (77, 1088)))).astype(np.float32)
    w = (f.view(np.uint32) >> 16).astype(np.uint16)
    enc = tc.encode(w, "palette")
    assert enc.header.num_verbatim > 0.5 * 77 * (1088 // 32)
    x = _x(4, 1088, seed=12)
    for parts in (1, 2, 4):
        y = _gemv(x, enc, parts)
        _fa_check(y, x, w)
        assert np.array_equal(_gemv(x, enc, parts, general=True), y)
    p = dict(enc.planes)
    p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP] = p[C.SUFFIX_VPOS][:0], p[C.SUFFIX_VEXP][:0]
    assert not np.array_equal(_gemv(x, enc, planes=p), _gemv(x, enc))


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
                assert np.array_equal(_gemv(x, enc, parts, general, variant=kp.PGEMV_VARIANT_STD), want)
    with pytest.raises(RuntimeError, match="unknown palette GEMV variant"):
        _gemv(_x(1, 64, seed=1), tc.encode(make_weights(4, 64, seed=1), "palette"), variant=7)


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
        call(variant=9)
    with pytest.raises(RuntimeError, match="aligned"):
        call(idx=8)
    with pytest.raises(ValueError):  # null pointers are refused by the binding
        call(y=0)
    if _cuda.device_count() == 0:  # valid arguments, no device: an error, never a crash
        with pytest.raises(RuntimeError):
            call()
