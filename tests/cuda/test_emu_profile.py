"""CPU tests of the warp emulator's memory-access profile (csrc/cuda/emu/warp_emu.h, profile()):
its bank and sector model on single access patterns, and what it shows of the kernels.

The profile counts what a profiler's memory counters would: shared-memory wavefronts per
request (one per bank-conflict-free phase) and global 32-byte sectors per request.  The
kernels whose shared-memory layouts are swizzled to be conflict-free (the palette GEMM's
weight and x stages, the Huffman decoders' table fill, the transcode's histogram) are held to
exactly the ideal count here, so a layout change that adds a bank conflict or breaks the
coalescing of the GEMM's copies fails on the CPU.  The Huffman table lookups are data
dependent and conflict by nature; scripts/emu_profile.py reports them.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import access_profile, aligned, make_weights
from .test_fused_logic import LAYOUTS, _pal, _x

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

pytestmark = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

FULL = 0xFFFFFFFF
SHARED_LOAD, SHARED_STORE, COPY_WRITE = "shared_load", "shared_store", "shared_async"
GLOBAL_LOAD, GLOBAL_STORE, COPY_READ = "global_load", "global_store", "global_async"
OPS = {SHARED_LOAD: 0, SHARED_STORE: 1, COPY_WRITE: 2, GLOBAL_LOAD: 3, GLOBAL_STORE: 4}


# (kind, bytes per lane, stride in bytes between lanes, lanes, units, ideal units): one warp-wide
# request.  Shared: 32 banks of 4 bytes, 8- and 16-byte accesses in 2 and 4 phases of 16 and 8
# lanes; global: 32-byte sectors.
MODEL = [
    (SHARED_LOAD, 4, 4, FULL, 1, 1),       # 32 consecutive words: one per bank
    (SHARED_LOAD, 4, 8, FULL, 2, 1),       # every other word: two words on each even bank
    (SHARED_LOAD, 4, 128, FULL, 32, 1),    # one bank for all: 32-way
    (SHARED_LOAD, 4, 0, FULL, 1, 1),       # one word for all: a broadcast
    (SHARED_LOAD, 4, 128, 0x3, 2, 1),      # two lanes, one bank
    (SHARED_LOAD, 2, 2, FULL, 1, 1),       # 2-byte neighbours share words
    (SHARED_LOAD, 1, 1, FULL, 1, 1),
    (SHARED_LOAD, 8, 8, FULL, 2, 2),       # two half-warp phases
    (SHARED_LOAD, 8, 16, FULL, 4, 2),
    (SHARED_LOAD, 16, 16, FULL, 4, 4),     # four quarter-warp phases
    (SHARED_LOAD, 16, 32, FULL, 8, 4),     # lanes 4 apart meet on a bank in every phase
    (SHARED_LOAD, 16, 16, 0xFF, 1, 1),     # only the first phase has lanes
    (SHARED_STORE, 4, 4, FULL, 1, 1),
    (SHARED_STORE, 8, 8, FULL, 2, 2),
    (SHARED_STORE, 16, 16, FULL, 4, 4),
    (SHARED_STORE, 16, 32, FULL, 8, 4),
    (COPY_WRITE, 16, 16, FULL, 4, 4),
    (COPY_WRITE, 16, 64, FULL, 16, 4),     # every lane of a phase on the same four banks
    (COPY_READ, 16, 16, FULL, 16, 16),     # 512 contiguous bytes: 16 sectors
    (COPY_READ, 16, 32, FULL, 32, 16),     # half of every sector
    (GLOBAL_LOAD, 4, 4, FULL, 4, 4),
    (GLOBAL_LOAD, 8, 8, FULL, 8, 8),
    (GLOBAL_LOAD, 16, 16, FULL, 16, 16),
    (GLOBAL_LOAD, 16, 64, FULL, 32, 16),
    (GLOBAL_LOAD, 4, 64, FULL, 32, 4),     # a word from each of 32 sectors
    (GLOBAL_STORE, 16, 16, FULL, 16, 16),
    (GLOBAL_STORE, 16, 48, FULL, 32, 16),
]


@pytest.mark.parametrize("kind, nbytes, stride, lanes, units, ideal", MODEL)
def test_one_request_counts_as_the_hardware_serves_it(kind, nbytes, stride, lanes, units, ideal):
    op = OPS[COPY_WRITE] if kind == COPY_READ else OPS[kind]
    with access_profile(_cuda) as prof:
        assert _cuda.emu_selftest_access(op, nbytes, stride, lanes) is None
    got = prof[kind]
    assert (got["requests"], got["units"], got["ideal"]) == (1, units, ideal)
    assert got["bytes"] == nbytes * bin(lanes).count("1")
    assert got["worse"] == int(units > ideal)
    if kind.startswith("shared"):
        assert got["max_degree"] == units // ideal
        if units > ideal:  # the worst phase is described with its lanes' offsets
            assert prof["worst"].startswith("shared ") and f"{units // ideal} words on one bank" in prof["worst"]


def test_off_by_default_and_after_the_block():
    _cuda.emu_profile(False)
    assert _cuda.emu_selftest_access(0, 4, 8) is None
    totals = _cuda.emu_profile(False)
    assert all(totals[k]["requests"] == 0 for k in OPS) and totals["worst"] == ""
    with access_profile(_cuda) as prof:
        assert _cuda.emu_selftest_access(0, 4, 8) is None
    assert prof[SHARED_LOAD]["requests"] == 1
    assert _cuda.emu_selftest_access(0, 4, 8) is None
    assert _cuda.emu_profile(False)[SHARED_LOAD]["requests"] == 0


def test_bad_pattern_arguments_are_refused():
    for op, nbytes, stride in ((0, 3, 3), (1, 2, 2), (2, 8, 8), (0, 4, 6), (0, 4, 1024), (7, 4, 4)):
        assert "bad op" in _cuda.emu_selftest_access(op, nbytes, stride)


# ----------------------------------------------------------------------------- kernels
def _ideal(prof, *kinds):
    for k in kinds:
        assert prof[k]["requests"] > 0, k
        assert prof[k]["units"] == prof[k]["ideal"], (k, prof[k], prof["worst"])


@pytest.mark.parametrize("M", [1, 16, 64])
@pytest.mark.parametrize("stage_tiles, x_shared", [(1, False)] + LAYOUTS)
def test_palette_gemm_stages_are_conflict_free_and_copies_coalesced(M, stage_tiles, x_shared):
    """(The wgmma layout's x: the launcher's reorder (pmma_wg_x_body) writes whole stage images
    in runs of 128 bytes, and each stage takes its image by one bulk copy, which the profile
    does not count as requests; its weight copies are held to the ideal with the rest.  Copied
    from x as it is, 4-byte pieces 32 bytes apart, the same stages took 5-6x the ideal sectors.)"""
    # Odd row count (a partial last tile), an odd K-tile count (the wide stage's lone last
    # tile), verbatim blocks (their extra loads come from global memory, not shared).
    w = make_weights(88, 448, seed=M)
    enc = tc.encode(w, "palette")
    p = enc.planes
    x = _x(M, 448, seed=M)
    args = (x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], _pal(enc), p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], 1, False,
            stage_tiles, int(x_shared))
    with access_profile(_cuda) as prof:
        y = _cuda.emulate_palette_gemm(*args)
    _ideal(prof, SHARED_LOAD, COPY_WRITE, COPY_READ)
    if x_shared == kp.PMMA_XS_WGMMA:
        # the reorder: whole sectors stored, every padded row of every tile once; each load half a
        # sector whose other half the same thread's next load reads
        _ideal(prof, GLOBAL_STORE)
        assert prof[GLOBAL_STORE]["bytes"] == kp.pmma_wg_x_rows(M) * 448 * 2
        assert prof[GLOBAL_LOAD]["units"] <= 2 * prof[GLOBAL_LOAD]["ideal"]
        # the stages fill by cp.async and bulk copies; the shared stores are the mbarriers' 8 bytes
        assert prof[SHARED_STORE]["bytes"] == 8 * prof[SHARED_STORE]["requests"]
    else:
        assert prof[SHARED_STORE]["requests"] == 0  # the stages fill by cp.async only
    assert np.array_equal(y, _cuda.emulate_palette_gemm(*args))  # profiling changes no result


@pytest.mark.parametrize("variant", [kp.HUFF_VARIANT_CHAIN, kp.HUFF_VARIANT_AHEAD, kp.HUFF_VARIANT_AHEAD2,
                                     kp.HUFF_VARIANT_SCALAR, kp.HUFF_VARIANT_RING, kp.HUFF_VARIANT_RING_WIDE,
                                     kp.HUFF_VARIANT_RING_MAX, kp.HUFF_VARIANT_PAIR])
def test_huffman_table_fill_is_conflict_free(variant):
    w = make_weights(128, 256, seed=variant)
    enc = tc.encode(w, "huffman", chk_interval=C.DEFAULT_CHK_INTERVAL, grid=(64, 256))
    h, p = enc.header, enc.planes
    out = aligned(np.full(w.shape, 0x5555, np.uint16))
    with access_profile(_cuda) as prof:
        nerr = _cuda.emulate_huffman_decode(aligned(p[C.SUFFIX_EXP]), p[C.SUFFIX_OFF], h.rows, h.cols,
                                            h.rows_per_group, h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi, 0,
                                            h.n_groups, 0, h.n_chunks, aligned(p[C.SUFFIX_SM]), out, False,
                                            p[C.SUFFIX_CHK], h.chk_interval, 3, variant, None)
    assert nerr == 0 and np.array_equal(out, w)
    _ideal(prof, SHARED_STORE)
    # Every symbol is one table lookup: at least a wavefront each, more where lanes meet on a bank
    # (RING adds its 16-byte ring reads, which may need more than one).
    assert prof[SHARED_LOAD]["requests"] > 0
    assert prof[SHARED_LOAD]["units"] >= prof[SHARED_LOAD]["ideal"] >= prof[SHARED_LOAD]["requests"]
    if variant not in (kp.HUFF_VARIANT_RING, kp.HUFF_VARIANT_RING_WIDE, kp.HUFF_VARIANT_RING_MAX,
                       kp.HUFF_VARIANT_PAIR):
        assert prof[SHARED_LOAD]["ideal"] == prof[SHARED_LOAD]["requests"]


@pytest.mark.parametrize("variant", [kp.PAL_VARIANT_VEC8, kp.PAL_VARIANT_WIDE])
def test_palette_decode_through_the_emulator_when_profiled(variant):
    # Profiled, the decode's threads run as warps of the emulator (otherwise serially): the same
    # bits, and both variants' loads and stores are whole sectors (consecutive lanes,
    # consecutive 8-weight chunks of a row: VEC8 once per thread, the wide variant at each of
    # its four steps).
    w = make_weights(40, 512, seed=variant)
    enc = tc.encode(w, "palette")
    h, p = enc.header, enc.planes
    planes = [aligned(p[s]) for s in (C.SUFFIX_SM, C.SUFFIX_IDX)]
    out = aligned(np.zeros_like(w))
    with access_profile(_cuda) as prof:
        assert _cuda.emulate_palette_decode(*planes, 0, h.rows, 0, h.cols, _pal(enc), p[C.SUFFIX_VPOS],
                                            p[C.SUFFIX_VEXP], out, variant) == 0
    assert np.array_equal(out, w)
    assert prof[GLOBAL_LOAD]["requests"] > 0 and prof[GLOBAL_STORE]["requests"] > 0
    _ideal(prof, GLOBAL_LOAD, GLOBAL_STORE)


def test_transcode_histogram_is_conflict_free():
    exps = aligned(((make_weights(300, 500, seed=4) >> 7) & 0xFF).astype(np.uint8))
    with access_profile(_cuda) as prof:
        hist = _cuda.emulate_exp_histogram(exps)
    assert np.array_equal(hist, np.bincount(exps.ravel(), minlength=256))
    _ideal(prof, SHARED_LOAD, SHARED_STORE, GLOBAL_LOAD)
