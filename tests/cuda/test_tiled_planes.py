"""CPU tests of the palette kernels on tile-major planes (csrc/cuda/kernel_plan.h, "palette
plane order"; ops/layout.py permutes a weight's planes into it).

The order changes where each byte is read from, never what is computed: every palette kernel
body, run through the warp emulator on tile-major planes, must give bit for bit what it gives
on the file-order planes: the decode (both variants, whole matrices and rectangles whose
edges take the scalar path), the fused GEMM (its three copy layouts, K splits, batch chunks)
and every GEMV variant (CUDA-core and tensor-core, every parts), on shapes with a half step
(K an odd multiple of 64) and heavy verbatim blocks.  The emulator's bounds check fails any
read outside the planes, so a wrong offset cannot go unseen by reading a neighbour's bytes.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import make_weights
from .test_fused_logic import _cuda, _pal, _x, needs_ext

torch = pytest.importorskip("torch")

# rows % 16 == 0, cols % 64 == 0; 1088 = 17 x 64 (a tensor-core GEMV step of 128 plus a half).
SHAPES = [(16, 64), (80, 640)]


def _tile(p: dict) -> dict:
    """The planes with sm and idx tile-major (ops.tile_palette_planes), as numpy."""
    from unweight.ops.layout import tile_palette_planes

    sm, idx = tile_palette_planes(torch.from_numpy(p[C.SUFFIX_SM]), torch.from_numpy(p[C.SUFFIX_IDX]))
    return {**p, C.SUFFIX_SM: sm.numpy(), C.SUFFIX_IDX: idx.numpy()}


def _heavy(N, K, seed):
    """Weights whose exponents spread wide: most 32-column blocks verbatim."""
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 20, (N, K)))).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def _cases():
    for N, K in SHAPES:
        yield make_weights(N, K, seed=N + K)
    yield _heavy(48, 1088, seed=5)


def _gemv(x, enc, p, parts, variant, tiled):
    return _cuda.emulate_palette_gemv(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS],
                                      p[C.SUFFIX_VEXP], parts, False, variant, int(tiled))


def _gemm(x, enc, p, splits, stage_tiles, x_shared, tiled):
    return _cuda.emulate_palette_gemm(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS],
                                      p[C.SUFFIX_VEXP], splits, False, stage_tiles, int(x_shared), int(tiled))


def _decode(enc, p, r0, r1, k0, k1, variant, tiled):
    out = np.zeros((r1 - r0, k1 - k0), dtype=np.uint16)
    nerr = _cuda.emulate_palette_decode(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], r0, r1, k0, k1, _pal(enc),
                                        p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, variant, None, int(tiled))
    return nerr, out


@needs_ext
@pytest.mark.parametrize("variant", sorted(kp.PAL_VARIANTS.values()))
def test_decode_reads_tile_major_planes(variant):
    """Whole matrices and rectangles (odd edges: VEC8's scalar tail, WIDE handing over to
    VEC8) decode to the weights from tile-major planes, verbatim blocks patched."""
    for w in _cases():
        N, K = w.shape
        enc = tc.encode(w, "palette")
        t = _tile(enc.planes)
        for r0, r1, k0, k1 in ((0, N, 0, K), (3, N - 1, 5, K - 7), (N // 2, N, min(64, K - 8), K), (1, 2, K - 3, K)):
            nerr, out = _decode(enc, t, r0, r1, k0, k1, variant, True)
            assert nerr == 0 and np.array_equal(out, w[r0:r1, k0:k1]), (w.shape, (r0, r1, k0, k1))


@needs_ext
@pytest.mark.parametrize("variant", sorted(set(kp.PGEMV_VARIANTS.values())))
def test_gemv_variants_give_their_file_order_bits(variant):
    """Each GEMV variant, one part and eight per row or tile, one and several n-tiles or batch
    rows: tile-major planes give the bits of the file-order ones."""
    batches = (1, 17) if kp.pgemv_is_mma(variant) else (1, 4)
    # (the bulk-copy variant runs tile-major only: its reference is the register-direct one's bits)
    ref = kp.PGEMV_VARIANT_MMA if kp.pgemv_needs_tiled(variant) else variant
    for w in _cases():
        N, K = w.shape
        enc = tc.encode(w, "palette")
        t = _tile(enc.planes)
        for M in batches:
            x = _x(M, K, seed=M + K)
            for parts in (1, 8):
                want = _gemv(x, enc, enc.planes, parts, ref, False)
                assert np.array_equal(_gemv(x, enc, t, parts, variant, True), want), (w.shape, M, parts)


@needs_ext
@pytest.mark.parametrize("stage_tiles,x_shared", [(1, False), (kp.PMMA_SUB_WIDE, False), (1, True),
                                                  (1, kp.PMMA_XS_WGMMA)])
def test_gemm_layouts_give_their_file_order_bits(stage_tiles, x_shared):
    """The fused GEMM's three copy layouts, with and without a K split (odd tile counts per
    split: the wide stages' one-tile last stage), one and two batch chunks."""
    for w in _cases():
        N, K = w.shape
        enc = tc.encode(w, "palette")
        t = _tile(enc.planes)
        for M in (1, 65):
            x = _x(M, K, seed=3 * M + K)
            for splits in sorted({1, min(3, K // 64)}):
                want = _gemm(x, enc, enc.planes, splits, stage_tiles, x_shared, False)
                got = _gemm(x, enc, t, splits, stage_tiles, x_shared, True)
                assert np.array_equal(got, want), (w.shape, M, splits)


@needs_ext
def test_order_flag_is_read():
    """Tile-major bytes read as file order give another product (the flag is what the kernel
    follows), and shapes that are not whole tiles are refused, by every launcher."""
    w = make_weights(48, 1088, seed=2)
    enc = tc.encode(w, "palette")
    t = _tile(enc.planes)
    x = _x(1, 1088, seed=4)
    assert not np.array_equal(_gemv(x, enc, t, 1, kp.PGEMV_VARIANT_MMA, False),
                              _gemv(x, enc, t, 1, kp.PGEMV_VARIANT_MMA, True))
    odd = tc.encode(make_weights(40, 128, seed=3), "palette")
    p, xo = odd.planes, _x(1, 128, seed=5)
    with pytest.raises(RuntimeError, match="tile-major planes need"):
        _gemv(xo, odd, p, 1, kp.PGEMV_VARIANT_MMA, True)
    with pytest.raises(RuntimeError, match="tile-major planes need"):
        _gemm(xo, odd, p, 1, 1, False, True)
    with pytest.raises(RuntimeError, match="tile-major planes need"):
        _decode(odd, p, 0, 40, 0, 128, 0, True)
    with pytest.raises(RuntimeError, match="tiled must be 0 or 1"):
        _gemv(x, enc, t, 1, kp.PGEMV_VARIANT_MMA, 2)


@needs_ext
def test_cpp_order_matches_python():
    """kernel_plan.py's pal_* offsets mirror kernel_plan.h's, and each order is a bijection of
    the plane bytes (file order: the identity)."""
    assert (_cuda.PAL_TILE_ROWS, _cuda.PAL_TILE_COLS) == (kp.PAL_TILE_ROWS, kp.PAL_TILE_COLS)
    for N, K in [(16, 64), (48, 1088), (5, 7), (3, 64)]:
        assert _cuda.plan_pal_tiled_ok(N, K) == kp.pal_tiled_ok(N, K)
        for tiled in ((False, True) if kp.pal_tiled_ok(N, K) else (False,)):
            seen = set()
            for r in range(N):
                for k in range(K):
                    o = kp.pal_sm_index(r, k, K, tiled)
                    assert o == _cuda.plan_pal_sm_index(r, k, K, tiled)
                    assert kp.pal_idx_index(r, k, K, tiled) == _cuda.plan_pal_idx_index(r, k, K, tiled)
                    assert kp.pal_idx_index(r, k, K, tiled) == (o // 2 if tiled else r * ((K + 1) // 2) + k // 2)
                    seen.add(o)
            assert seen == set(range(N * K))


@needs_ext
@pytest.mark.parametrize("general", [False, True])
def test_bulk_copy_gemv_gives_the_mma_bits(general):
    """PGEMV_VARIANT_MMA_BULK: lane 0 fetches each step's two tiles with cp.async.bulk into the
    warp's ring, counted on the slot's mbarrier; the emulator lands a copy only when a wait sees
    its phase complete, fails a read before that and a refill the other lanes' reads are not
    ordered before, and bounds-checks each copy's source.  On tile-major planes it gives the
    register-direct GEMV's bits: tiles with a half step (1088 = 8.5 steps) and parts ending in
    one, parts 1, 2 and 8, one, two and four n-tiles, heavy verbatim blocks, either decode."""
    bulk = kp.PGEMV_VARIANT_MMA_BULK
    for w in _cases():  # (48 x 1088 at one part: nine steps, the ring's parities 0, 1, 0)
        N, K = w.shape
        enc = tc.encode(w, "palette")
        t = _tile(enc.planes)
        for M in (1, 9, 20):
            x = _x(M, K, seed=2 * M + K)
            for parts in (1, 2, 8):
                want = _cuda.emulate_palette_gemv(x, enc.planes[C.SUFFIX_SM], enc.planes[C.SUFFIX_IDX], _pal(enc),
                                                  enc.planes[C.SUFFIX_VPOS], enc.planes[C.SUFFIX_VEXP], parts,
                                                  general, kp.PGEMV_VARIANT_MMA, 0)
                got = _cuda.emulate_palette_gemv(x, t[C.SUFFIX_SM], t[C.SUFFIX_IDX], _pal(enc), t[C.SUFFIX_VPOS],
                                                 t[C.SUFFIX_VEXP], parts, general, bulk, 1)
                assert np.array_equal(got, want), (w.shape, M, parts)


@needs_ext
def test_bulk_copy_gemv_refuses_file_order():
    """A warp's part is one run of bytes only tile-major: on file-order planes the launcher and
    its emulation refuse the bulk-copy variant with one line."""
    w = make_weights(32, 1088, seed=3)
    enc = tc.encode(w, "palette")
    with pytest.raises(RuntimeError, match="needs tile-major planes"):
        _gemv(_x(1, 1088, seed=1), enc, enc.planes, 1, kp.PGEMV_VARIANT_MMA_BULK, False)
