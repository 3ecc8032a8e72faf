"""CPU tests of the CUDA Huffman decode by chains and of the row-gather kernels (no GPU).

unweight._cuda.emulate_huffman_decode / emulate_*_gather_rows run the kernels' very
__host__ __device__ bodies (csrc/cuda/huffman_decode.cuh, palette_decode.cuh) on the host over
the kernels' grid-stride order (the Huffman CTAs through the warp emulator, their shared-memory
LUT fill and its barrier race-checked), every decode variant (one chain per thread, the look-ahead
reader with one and two chains per thread, the scalar reader); results must equal the
original weights bit for bit, and corrupt planes must be counted, never read out of bounds or
written outside the output.  The launch geometry's Python mirror is checked to cover every
weight exactly once.  Skipped (the body tests) when unweight._cuda is not built.
"""
import json
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file

from unweight.codec import tensor_codec as tc
from unweight.codec.reference import decode_reference
from unweight.format import constants as C
from unweight.format.errors import ChecksumError, FormatError
from unweight.runtime import kernel_plan as kp

from .helpers import all_bf16_patterns, make_weights

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

needs_ext = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"
ODD = [1, 63, 65, 4097]
NO_CHK = np.zeros((0, 0), np.uint16)
# Every Huffman decode variant (kernel_plan.h); shapes the vector ones cannot take run SCALAR.
VARIANTS = (kp.HUFF_VARIANT_CHAIN, kp.HUFF_VARIANT_AHEAD, kp.HUFF_VARIANT_AHEAD2, kp.HUFF_VARIANT_SCALAR,
            kp.HUFF_VARIANT_RING, kp.HUFF_VARIANT_RING_WIDE, kp.HUFF_VARIANT_RING_MAX, kp.HUFF_VARIANT_PAIR)


def _chk(enc):
    return enc.planes.get(C.SUFFIX_CHK, NO_CHK)


def emulate_decode(enc, planes=None, *, sel=None, exp_only=False, max_ctas=3, variant=0, use_index=True,
                   out=None, path_out=None):
    """(error count, output) of the emulated chain kernel over segments sel = (g0, g1, c0, c1);
    path_out (a list) receives the variant that ran."""
    h, p = enc.header, planes or enc.planes
    g0, g1, c0, c1 = sel or (0, h.n_groups, 0, h.n_chunks)
    R, C_ = h.rows_per_group, h.cols_per_chunk
    r0, r1, k0, k1 = g0 * R, min(h.rows, g1 * R), c0 * C_, min(h.cols, c1 * C_)
    sm = np.ascontiguousarray(p[C.SUFFIX_SM][r0:r1, k0:k1])
    if out is None:
        out = np.full((r1 - r0, k1 - k0), 0x55, np.uint8) if exp_only else np.full((r1 - r0, k1 - k0), 0x5555, np.uint16)
    S = h.chk_interval if use_index else 0
    chk = p.get(C.SUFFIX_CHK, NO_CHK) if S else NO_CHK
    nerr = _cuda.emulate_huffman_decode(p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], h.rows, h.cols, R, C_, h.table, h.exp_lo,
                                        h.exp_hi, g0, g1, c0, c1, sm, out, exp_only, chk, S, max_ctas, variant,
                                        path_out)
    return nerr, out


# ------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("rows", ODD)
@pytest.mark.parametrize("cols", ODD)
@pytest.mark.parametrize("S", [0, 16, 48, 1024])
def test_chains_cover_every_weight_once(rows, cols, S):
    if 0 < S < 1024 and rows * cols > 10**6:
        pytest.skip("a million chains walked in Python; the 4097 x 4097 matrix runs at S = 0 and 1024")
    R, C_ = tc.choose_grid(rows, cols)
    ng, nc = kp.cdiv(rows, R), kp.cdiv(cols, C_)
    P = kp.cdiv(min(R, rows) * min(C_, cols), S) - 1 if S else 0
    cps = kp.huffman_chains_per_segment(S, P)
    for g0, g1, c0, c1 in {(0, ng, 0, nc), (ng // 2, ng, nc // 2, nc)}:
        nsel = (g1 - g0) * (c1 - c0)
        n = nsel * cps
        grid = kp.huffman_grid(n, 5)  # a small cap: threads loop over several chains
        cover = np.zeros((rows, cols), np.int32)
        seen = 0
        for b in range(grid):
            for tid in range(kp.HUFF_THREADS):
                for t in range(b * kp.HUFF_THREADS + tid, n, grid * kp.HUFF_THREADS):
                    seen += 1
                    i, j = kp.huffman_chain(t, cps)
                    g, c = kp.huffman_unit(i, g0, c0, g1 - g0)
                    r0, r1, k0, k1 = kp.segment_rect(g, c, rows, cols, R, C_)
                    w = k1 - k0
                    first, end = kp.chain_weights(j, (r1 - r0) * w, S)
                    q = np.arange(first, end)
                    np.add.at(cover, (r0 + q // w, k0 + q % w), 1)
        assert seen == n
        want = np.zeros_like(cover)
        want[g0 * R:min(rows, g1 * R), c0 * C_:min(cols, c1 * C_)] = 1
        assert np.array_equal(cover, want)


@pytest.mark.parametrize("width,S", [(512, 1024), (4096, 1024), (4097, 1024), (64, 16), (100, 48), (7, 0)])
def test_gather_parts_cover_each_row_once(width, S):
    rows_in_group = 16
    n = rows_in_group * width
    P = kp.cdiv(n, S) - 1 if S else 0
    units = kp.hgather_units(S, P, width)
    for lr in range(rows_in_group):
        rs, re = lr * width, (lr + 1) * width
        got = []
        for u in range(units):
            if S:
                j = rs // S + u
                first, end = j * S, min(re, j * S + S)
            else:
                if u:
                    continue
                first, end = 0, re
            got += [q for q in range(first, end) if rs <= q < re]
        assert got == list(range(rs, re))
    for t in range(3 * 5 * units):
        i, c, u = kp.hgather_unit(t, 5, units)
        assert t == (i * 5 + c) * units + u


@needs_ext
def test_cpp_chain_plan_matches_python():
    assert _cuda.HUFF_THREADS == kp.HUFF_THREADS
    for n in [0, 1, 127, 128, 129, 10**6]:
        for cap in [1, 7, 10**9]:
            assert _cuda.plan_huffman_grid(n, cap) == kp.huffman_grid(n, cap)
    for S, P, w in [(0, 0, 512), (1024, 7, 512), (1024, 3, 4096), (16, 255, 65), (1024, 0, 100)]:
        assert _cuda.plan_huffman_chains_per_segment(S, P) == kp.huffman_chains_per_segment(S, P)
        assert _cuda.plan_hgather_units(S, P, w) == kp.hgather_units(S, P, w)
    for t in range(0, 200, 7):
        assert tuple(_cuda.plan_huffman_chain(t, 9)) == kp.huffman_chain(t, 9)
        assert tuple(_cuda.plan_hgather_unit(t, 3, 4)) == kp.hgather_unit(t, 3, 4)


# ------------------------------------------------------------------------------- decode
@needs_ext
@pytest.mark.parametrize("rows", ODD)
@pytest.mark.parametrize("cols", ODD)
@pytest.mark.parametrize("S", [16, 1024])
def test_chain_decode_matches_original(rows, cols, S):
    w = make_weights(rows, cols, seed=rows * 13 + cols)
    enc = tc.encode(w, "huffman", chk_interval=S, threads=1)
    for variant in VARIANTS:
        nerr, out = emulate_decode(enc, variant=variant)
        assert nerr == 0 and np.array_equal(out, w)
        nerr, exps = emulate_decode(enc, exp_only=True, variant=variant)
        assert nerr == 0 and np.array_equal(exps, (w >> 7).astype(np.uint8))
    # without the index (a 1.0 file, or a reader that drops it): one chain per segment
    nerr, out = emulate_decode(enc, use_index=False)
    assert nerr == 0 and np.array_equal(out, w)


@needs_ext
@pytest.mark.parametrize("shape,grid", [((4096, 64), (64, 32)), ((96, 4096), (16, 512)), ((300, 520), (8, 520))])
def test_chain_decode_of_shards_and_grids(shape, grid):
    """Sub-rectangles of segments (a tensor-parallel shard decodes one), vector-path shapes."""
    w = make_weights(*shape, seed=shape[0])
    enc = tc.encode(w, "huffman", grid=grid, chk_interval=64, threads=1)
    h = enc.header
    assert h.chk_interval == 64
    g0, g1, c0, c1 = h.n_groups // 3, h.n_groups, h.n_chunks // 2, h.n_chunks
    R, C_ = h.rows_per_group, h.cols_per_chunk
    for variant in VARIANTS:
        nerr, sub = emulate_decode(enc, sel=(g0, g1, c0, c1), variant=variant, max_ctas=1)
        assert nerr == 0
        assert np.array_equal(sub, w[g0 * R:, c0 * C_:])


@needs_ext
@pytest.mark.parametrize("S", [0, 16, 1024])
def test_chain_decode_of_all_bf16_patterns(S):
    w = all_bf16_patterns(rows=256)
    enc = tc.encode(w, "huffman", grid=(16, 256), chk_interval=S, threads=1)
    assert enc.header.chk_interval == S
    for variant in VARIANTS:
        nerr, out = emulate_decode(enc, variant=variant)
        assert nerr == 0 and np.array_equal(out, w)


@needs_ext
@pytest.mark.parametrize("shape,grid,S", [((96, 256), (16, 256), 32), ((200, 96), (64, 32), 96),
                                          ((33, 4096), (8, 512), 256), ((64, 1024), (16, 1024), 4096)])
@pytest.mark.parametrize("max_ctas", [1, 0])
def test_look_ahead_variants_take_the_vector_path(shape, grid, S, max_ctas):
    """The look-ahead reader on shapes it takes: chains of S weights over rows of one or more
    steps, partial segments (a short last chain, so two-chain threads finish one chain alone),
    odd chain counts (a thread with one live chain), a stream whose last blocks are partial, and
    a grid of one CTA (each thread runs many chains) or of every chain at once."""
    w = make_weights(*shape, seed=shape[1] + S)
    enc = tc.encode(w, "huffman", grid=grid, chk_interval=S, threads=1)
    assert enc.header.chk_interval == S
    for variant in (kp.HUFF_VARIANT_AHEAD, kp.HUFF_VARIANT_AHEAD2, kp.HUFF_VARIANT_RING, kp.HUFF_VARIANT_RING_WIDE,
                    kp.HUFF_VARIANT_RING_MAX, kp.HUFF_VARIANT_PAIR):
        path = []
        nerr, out = emulate_decode(enc, variant=variant, max_ctas=max_ctas, path_out=path)
        assert path == [variant] and nerr == 0 and np.array_equal(out, w)
        nerr, exps = emulate_decode(enc, exp_only=True, variant=variant, max_ctas=max_ctas)
        assert nerr == 0 and np.array_equal(exps, (w >> 7).astype(np.uint8))
        # a shard of whole segments, as a tensor-parallel rank decodes it
        h = enc.header
        sel = (h.n_groups // 2, h.n_groups, h.n_chunks // 2, h.n_chunks)
        nerr, sub = emulate_decode(enc, sel=sel, variant=variant, max_ctas=max_ctas)
        assert nerr == 0 and np.array_equal(sub, w[sel[0] * h.rows_per_group:, sel[2] * h.cols_per_chunk:])


@needs_ext
@pytest.mark.parametrize("S", [0, 256])
def test_pair_decode_of_codes_around_its_window(S):
    """PAIR on exponents whose codes run from 1 to 12 bits, so that pairs of whole codes within
    its 9-bit window, pairs whose first code alone fits (the slow path's one lookup) and first
    codes longer than the window (its two lookups) are all common; bit for bit, BF16 and
    exponent bytes."""
    rng = np.random.default_rng(17)
    rows, cols = 64, 1024
    n = rows * cols
    u = rng.random(n)  # 3 common exponents (2-3 bit codes), 48 rarer (7-8 bits), 100 rare (10-12)
    exps = np.where(u < 0.6, 120 + rng.integers(0, 3, n),
                    np.where(u < 0.96, 60 + rng.integers(0, 48, n), 130 + rng.integers(0, 100, n)))
    sm = rng.integers(0, 256, n)
    w = ((sm & 0x80) << 8 | exps << 7 | (sm & 0x7F)).astype(np.uint16).reshape(rows, cols)
    enc = tc.encode(w, "huffman", grid=(32, 512), chk_interval=S, threads=1)
    h = enc.header
    n = h.exp_hi - h.exp_lo + 1
    lens = np.asarray(h.table, np.int64).reshape(C.HUFF_NUM_CTX, n)
    ctx = (w.astype(np.int64) >> C.HUFF_CTX_SHIFT) & (C.HUFF_NUM_CTX - 1)
    L = lens[ctx, ((w.astype(np.int64) >> 7) & 0xFF) - h.exp_lo].reshape(-1, 2)
    first_long, pair_long = (L[:, 0] > kp.HUFF_PAIR_BITS).mean(), (L.sum(axis=1) > kp.HUFF_PAIR_BITS).mean()
    assert first_long > 0.01 and pair_long - first_long > 0.1 and pair_long < 0.9  # every path, often
    path = []
    nerr, out = emulate_decode(enc, variant=kp.HUFF_VARIANT_PAIR, path_out=path)
    assert path == [kp.HUFF_VARIANT_PAIR] and nerr == 0 and np.array_equal(out, w)
    nerr, e8 = emulate_decode(enc, exp_only=True, variant=kp.HUFF_VARIANT_PAIR)
    assert nerr == 0 and np.array_equal(e8, (w >> 7).astype(np.uint8))


@needs_ext
def test_variants_fall_back_to_the_scalar_reader():
    """A shape the vector reader cannot take (K not a multiple of 32) runs SCALAR whichever
    variant is asked for, with the same bits; an unknown variant is refused."""
    w = make_weights(40, 100, seed=3)
    enc = tc.encode(w, "huffman", grid=(8, 100), chk_interval=16, threads=1)
    for variant in (0, *VARIANTS):
        path = []
        nerr, out = emulate_decode(enc, variant=variant, path_out=path)
        assert path == [kp.HUFF_VARIANT_SCALAR] and nerr == 0 and np.array_equal(out, w)
    path = []
    emulate_decode(tc.encode(make_weights(40, 128, seed=3), "huffman", grid=(8, 128), chk_interval=32, threads=1),
                   path_out=path)
    assert path == [kp.HUFF_DEFAULT_VARIANT]
    with pytest.raises(RuntimeError, match="unknown huffman decode variant"):
        emulate_decode(enc, variant=9)


def _golden(name):
    return {k[1:]: v for k, v in load_file(str(name)).items()}


@needs_ext
@pytest.mark.parametrize("case", ["worked_example", "verbatim", "all_patterns", "index_example",
                                  "all_patterns_indexed"])
def test_chain_decode_of_golden_files(case):
    """Old files (1.0, no index) and new ones (1.2, indexed) decode through the same kernel."""
    m = json.loads((GOLDEN / f"{case}.json").read_text())
    planes = _golden(GOLDEN / m["files"]["huffman"])
    h = tc.encoded_header(planes)
    enc = tc.Encoded(h, planes, {})
    want = decode_reference(planes[C.SUFFIX_HDR], planes)
    for variant in VARIANTS:
        nerr, out = emulate_decode(enc, variant=variant)
        assert nerr == 0 and np.array_equal(out, want)


MANIFEST = json.loads((GOLDEN / "corrupt" / "manifest.json").read_text())
HUFFMAN_CORRUPT = sorted(n for n in MANIFEST if n.startswith(("chk_", "stream_", "segment_", "offsets_", "sm_bit")))


@needs_ext
@pytest.mark.parametrize("name", HUFFMAN_CORRUPT)
def test_chain_decode_refuses_corrupt_golden_files(name):
    """Data corruption the kernel can see is counted (a flipped sign/mantissa bit only the crc
    sees; header and plane-shape errors are refused before any launch, by tc.check_planes)."""
    planes = _golden(GOLDEN / "corrupt" / f"{name}.safetensors")
    try:
        h = tc.encoded_header(planes)
        tc.check_planes(h, planes)
    except Exception:  # noqa: BLE001 - refused before a kernel would run
        return
    nerr, out = emulate_decode(tc.Encoded(h, planes, {}))
    if MANIFEST[name]["expect"] == "ChecksumError":
        assert nerr == 0
    else:
        assert nerr >= 1, name


@needs_ext
@pytest.mark.parametrize("variants", [VARIANTS, (kp.HUFF_VARIANT_PAIR,)], ids=["each", "pair"])
def test_chain_decode_counts_corruption_without_overrun(variants):
    """Flipped stream bits and checkpoint entries, each decode by one of `variants` (every variant
    in turn, or PAIR alone: its slow path and its end check see every trial)."""
    w = make_weights(130, 256, seed=5)
    enc = tc.encode(w, "huffman", grid=(16, 128), chk_interval=256, threads=1)
    p = enc.planes
    rng = np.random.default_rng(0)
    for trial in range(40):
        bad = {s: a.copy() for s, a in p.items()}
        if trial % 2:  # a stream bit
            pos = int(rng.integers(0, bad[C.SUFFIX_EXP].size - C.STREAM_SLACK_BYTES))
            bad[C.SUFFIX_EXP][pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
        else:  # a checkpoint entry, anywhere in 16 bits (a huge start is refused before reading)
            r, c = int(rng.integers(0, bad[C.SUFFIX_CHK].shape[0])), int(rng.integers(0, bad[C.SUFFIX_CHK].shape[1]))
            bad[C.SUFFIX_CHK][r, c] ^= np.uint16(1 << int(rng.integers(0, 16)))
        # a guard band around the output catches any write outside it
        guard = np.full((w.shape[0] + 2, w.shape[1]), 0x5555, np.uint16)
        nerr, out = emulate_decode(enc, bad, out=guard[1:-1], variant=variants[trial % len(variants)])
        assert (guard[0] == 0x5555).all() and (guard[-1] == 0x5555).all()
        try:
            tc.check_planes(enc.header, bad)  # refused at load (e.g. an unused entry set): no launch
        except FormatError:
            continue
        try:
            decode_reference(bad[C.SUFFIX_HDR], bad)
            verdict = "ok"
        except ChecksumError:  # every code and checkpoint valid, other exponents: the crc's job
            verdict = "crc"
        except FormatError:
            verdict = "corrupt"
        if verdict == "corrupt":
            assert nerr >= 1, trial
        else:
            assert nerr == 0, trial
            assert np.array_equal(out, tc.decode(enc.header, bad, threads=1, verify=False))
    # offsets pointing past a truncated stream: counted, never read outside it
    short = {s: a.copy() for s, a in p.items()}
    short[C.SUFFIX_EXP] = p[C.SUFFIX_EXP][: p[C.SUFFIX_EXP].size // 2].copy()
    nerr, _ = emulate_decode(enc, short)
    assert nerr >= 1


# ------------------------------------------------------------------------------- gather
def _ids(rows, n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, rows, size=n).astype(np.int64)
    ids[: min(n, 3)] = [0, rows - 1, rows // 2][: min(n, 3)]
    return ids


@needs_ext
@pytest.mark.parametrize("rows,cols", [(1, 1), (63, 65), (4097, 63), (300, 4096), (65, 4097)])
@pytest.mark.parametrize("S", [0, 16, 1024])
def test_huffman_gather_matches_rows(rows, cols, S):
    w = make_weights(rows, cols, seed=rows + cols)
    enc = tc.encode(w, "huffman", chk_interval=S, threads=1)
    h, p = enc.header, enc.planes
    ids = _ids(rows, 37, rows)
    for max_ctas in (0, 2):
        out = np.full((ids.size, cols), 0x5555, np.uint16)
        nerr = _cuda.emulate_huffman_gather_rows(ids, p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], rows, cols, h.rows_per_group,
                                                 h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi, p[C.SUFFIX_SM],
                                                 _chk(enc), h.chk_interval, out, max_ctas)
        assert nerr == 0 and np.array_equal(out, w[ids])


@needs_ext
def test_huffman_gather_flags_bad_ids_and_index():
    w = make_weights(64, 512, seed=1)
    enc = tc.encode(w, "huffman", grid=(16, 128), chk_interval=256, threads=1)
    h, p = enc.header, enc.planes
    args = (p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], 64, 512, 16, 128, h.table, h.exp_lo, h.exp_hi, p[C.SUFFIX_SM])
    ids = np.array([3, -1, 64, 5], np.int64)
    out = np.full((4, 512), 0x5555, np.uint16)
    assert _cuda.emulate_huffman_gather_rows(ids, *args, _chk(enc), 256, out) == 2
    assert np.array_equal(out[[0, 3]], w[[3, 5]]) and (out[[1, 2]] == 0).all()
    # a checkpoint one bit late: the chain that ends there disagrees with it
    chk = _chk(enc).copy()
    chk[0, 0] += 1
    out = np.zeros((2, 512), np.uint16)
    assert _cuda.emulate_huffman_gather_rows(np.array([0, 1], np.int64), *args, chk, 256, out) >= 1


@needs_ext
@pytest.mark.parametrize("rows,cols", [(1, 1), (63, 65), (4097, 63), (3, 80), (65, 4097)])
def test_palette_gather_matches_rows(rows, cols):
    w = make_weights(rows, cols, seed=rows * 3 + cols)
    enc = tc.encode(w, "palette", threads=1)
    h, p = enc.header, enc.planes
    ids = np.concatenate([_ids(rows, 29, cols), (p[C.SUFFIX_VPOS][:8] // kp.blocks_per_row(cols)).astype(np.int64)])
    out = np.full((ids.size, cols), 0x5555, np.uint16)
    nerr = _cuda.emulate_palette_gather_rows(ids, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], bytes(h.palette[: h.pal_size]),
                                             p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out)
    assert nerr == 0 and np.array_equal(out, w[ids])
    # with the verbatim row index (ops.verbatim_rows): the row's own entries searched, the same rows
    import torch

    from unweight import ops
    vrow = ops.verbatim_rows(torch.from_numpy(p[C.SUFFIX_VPOS]), rows, cols).numpy()
    out = np.full((ids.size, cols), 0x5555, np.uint16)
    nerr = _cuda.emulate_palette_gather_rows(ids, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], bytes(h.palette[: h.pal_size]),
                                             p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, vrow)
    assert nerr == 0 and np.array_equal(out, w[ids])
    if len(p[C.SUFFIX_VPOS]):  # (the index is what the kernel reads: one that lists no entry loses the blocks)
        out = np.full((ids.size, cols), 0x5555, np.uint16)
        _cuda.emulate_palette_gather_rows(ids, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], bytes(h.palette[: h.pal_size]),
                                          p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, np.zeros_like(vrow))
        assert not np.array_equal(out, w[ids])
    bad = np.array([0, rows, -5], np.int64)
    out = np.full((3, cols), 0x5555, np.uint16)
    assert _cuda.emulate_palette_gather_rows(bad, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], bytes(h.palette[: h.pal_size]),
                                             p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out) == 2
    assert np.array_equal(out[0], w[0]) and (out[1:] == 0).all()


@needs_ext
def test_palette_gather_of_golden_verbatim_file():
    m = json.loads((GOLDEN / "verbatim.json").read_text())
    planes = _golden(GOLDEN / m["files"]["palette"])
    h = tc.encoded_header(planes)
    want = decode_reference(planes[C.SUFFIX_HDR], planes)
    ids = np.array([2, 0, 1, 2, 0], np.int64)
    out = np.zeros((5, h.cols), np.uint16)
    nerr = _cuda.emulate_palette_gather_rows(ids, planes[C.SUFFIX_SM], planes[C.SUFFIX_IDX],
                                             bytes(h.palette[: h.pal_size]), planes[C.SUFFIX_VPOS],
                                             planes[C.SUFFIX_VEXP], out)
    assert nerr == 0 and np.array_equal(out, want[ids])
