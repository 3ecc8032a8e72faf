"""The emulated kernels give the same bits whatever the schedule of their CTAs and warps (no GPU).

A GPU runs a grid's CTAs in no order a kernel may rely on, many at once.
``unweight._cuda.emu_cta_order`` makes the warp emulator run every launch's CTAs in reverse or
in a seeded random order, with the warps' turns shuffled, one CTA at a time or several in
flight (a CTA that did a global atomic held back while others run).  Each kernel family that
runs through it (the fused palette GEMM with its split-K fix-up by the last CTA to arrive, the
GEMV, the Huffman decoders and row gather, the transcode's histogram and encode passes) must
then write exactly the bytes of the default schedule.  An output two CTAs both write, a fix-up
that assumes which CTA comes last, or one that can start before every partial is written,
shows up as a difference.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import make_weights
from .test_fused_logic import _emulate, _pal, _x
from .test_huffman_chains import VARIANTS, _chk, emulate_decode

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

pytestmark = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

# (order, seed, CTAs in flight)
ORDERS = [("reverse", 0, 1), ("shuffle", 1, 1), ("shuffle", 2, 1), ("forward", 3, 4), ("shuffle", 4, 16),
          ("reverse", 5, 16)]


def _in_each_order(run):
    """run() in the default schedule, then in each of ORDERS; the outputs, default first."""
    _cuda.emu_cta_order("forward")
    outs = [run()]
    try:
        for order, seed, resident in ORDERS:
            _cuda.emu_cta_order(order, seed, resident)
            outs.append(run())
    finally:
        _cuda.emu_cta_order("forward")
    return outs


def _same_bytes(outs):
    for i, o in enumerate(outs[1:], 1):
        for a, b in zip(outs[0], o):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), ORDERS[i - 1]


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order must be"):
        _cuda.emu_cta_order("sideways")
    with pytest.raises(ValueError, match="resident"):
        _cuda.emu_cta_order("forward", 0, 0)


@pytest.mark.parametrize("splits", [2, 3])
def test_palette_gemm_split_fixup(splits):
    """Several row blocks, each summed by whichever of its split CTAs arrives last; the
    binding also checks that every arrival counter is back at zero."""
    pytest.importorskip("torch")
    w = make_weights(160, 64 * 6, seed=splits)
    enc = tc.encode(w, "palette")
    x = _x(9, 64 * 6, seed=5)
    for stage_tiles, x_shared in [(1, False), (kp.PMMA_SUB_WIDE, False), (1, True)]:
        _same_bytes(_in_each_order(lambda: (_emulate(x, enc, splits, False, stage_tiles, x_shared),)))


def test_palette_gemm_fixup_sums_in_split_order():
    """Partials that cancel: 2^25, -2^25 and 1, one per split, in a different order on each row.
    fp32 addition is not associative here ((2^25 - 2^25) + 1 = 1, but (-2^25 + 1) + 2^25 = 0), so
    every row must hold the sum taken in split order, 0 + P0 + P1 + P2, whichever CTA sums it."""
    splits, K = 3, 3 * 2 * kp.PMMA_TILE_K
    tiles = kp.pmma_split_tiles(K, splits)
    at = [s * tiles * kp.PMMA_TILE_K + 5 for s in range(splits)]  # one column inside each split
    vals = np.array([2.0**25, -(2.0**25), 1.0], np.float32)
    perms = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    N = 48
    wf = np.zeros((N, K), np.float32)
    for r in range(N):
        wf[r, at] = vals[list(perms[r % 6])]
    w = (wf.view(np.uint32) >> 16).astype(np.uint16)  # exact in bf16
    enc = tc.encode(w, "palette")
    x = np.zeros((1, K), np.uint16)
    x[0, at] = 0x3F80  # 1.0
    want = np.zeros(N, np.float32)
    for s in range(splits):
        want = (want + wf[:, at[s]]).astype(np.float32)
    want_bits = (want.view(np.uint32) >> 16).astype(np.uint16)  # 0, 1 or +-2^25: exact in bf16
    assert len(set(want_bits.tolist())) > 1  # the order of the sum matters on some rows
    outs = _in_each_order(lambda: (_emulate(x, enc, splits),))
    _same_bytes(outs)
    assert np.array_equal(outs[0][0][0], want_bits)


@pytest.mark.parametrize("variant,M", [(0, 3), (kp.PGEMV_VARIANT_MMA, 3), (kp.PGEMV_VARIANT_MMA, 20),
                                       (kp.PGEMV_VARIANT_MMA_STAGED, 3), (kp.PGEMV_VARIANT_MMA_STAGED, 20)])
def test_palette_gemv(variant, M):
    """The CUDA-core GEMV and the tensor-core ones at one and four n-tiles: the parts' sums go
    through shared memory (the staged variant's into each warp's drained ring), read after the
    CTA's barrier whichever warp arrives last."""
    w = make_weights(200, 512, seed=4)
    enc = tc.encode(w, "palette")
    p = enc.planes
    x = _x(M, 512, seed=6)
    for parts in (1, 4):
        _same_bytes(_in_each_order(lambda: (_cuda.emulate_palette_gemv(
            x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], parts, False,
            variant),)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_huffman_decode(variant):
    """Capped at 3 CTAs (each thread then runs several chains) and uncapped."""
    w = make_weights(300, 520, seed=8)
    enc = tc.encode(w, "huffman", segment_weights=2048, chk_interval=64, threads=1)
    for max_ctas in (3, 0):
        outs = _in_each_order(lambda: emulate_decode(enc, max_ctas=max_ctas, variant=variant))
        _same_bytes(outs)
        assert outs[0][0] == 0 and np.array_equal(outs[0][1], w)


def test_huffman_gather():
    w = make_weights(301, 96, seed=9)
    enc = tc.encode(w, "huffman", chk_interval=16, threads=1)
    h, p = enc.header, enc.planes
    ids = np.random.default_rng(1).integers(0, h.rows, size=50).astype(np.int64)

    def run():
        out = np.full((ids.size, h.cols), 0x5555, np.uint16)
        nerr = _cuda.emulate_huffman_gather_rows(ids, p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], h.rows, h.cols,
                                                 h.rows_per_group, h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi,
                                                 p[C.SUFFIX_SM], _chk(enc), h.chk_interval, out, 2)
        return nerr, out

    outs = _in_each_order(run)
    _same_bytes(outs)
    assert outs[0][0] == 0 and np.array_equal(outs[0][1], w[ids])


def test_transcode_kernels():
    w = make_weights(1100, 1090, seed=10)
    exps = (w >> 7).astype(np.uint8)
    hist = _cuda.emulate_exp_histogram(exps)
    pal = tc.choose_palette(hist.astype(np.int64))
    outs = _in_each_order(lambda: (_cuda.emulate_exp_histogram(exps),
                                   *_cuda.emulate_palette_encode(exps, bytes(pal.tobytes()))))
    _same_bytes(outs)
