"""ops/layout.py: the tile-major order of the palette planes, and the palette ops' ``tiled``
argument on the CPU (the CUDA kernels' reading of it is tested through the warp emulator in
tests/cuda/test_tiled_planes.py)."""
import numpy as np
import pytest
import torch

from unweight import ops
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp
from unweight.runtime.modules import plane_tensor


def _palette(rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    e = tc.encode(w.view(torch.uint16).numpy(), "palette")
    return w, e.header, {s: plane_tensor(a) for s, a in e.planes.items()}


@pytest.mark.parametrize("rows,cols", [(16, 64), (48, 1088), (128, 256)])
def test_tiling_places_every_byte_by_the_plan_and_round_trips(rows, cols):
    rng = np.random.default_rng(rows + cols)
    sm = torch.from_numpy(rng.integers(0, 256, (rows, cols), dtype=np.uint8))
    idx = torch.from_numpy(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8))
    st, it = ops.tile_palette_planes(sm, idx)
    assert st.shape == sm.shape and it.shape == idx.shape and st.is_contiguous() and it.is_contiguous()
    r, k = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    at = np.vectorize(lambda a, b: kp.pal_sm_index(a, b, cols, True))(r, k)
    assert np.array_equal(st.numpy().reshape(-1)[at], sm.numpy())
    ati = np.vectorize(lambda a, b: kp.pal_idx_index(a, b, cols, True))(r[:, ::2], k[:, ::2])
    assert np.array_equal(it.numpy().reshape(-1)[ati], idx.numpy())
    s2, i2 = ops.untile_palette_planes(st, it)
    assert torch.equal(s2, sm) and torch.equal(i2, idx)
    assert not torch.equal(st, sm) or rows == 16 and cols == 64


@pytest.mark.parametrize("rows,cols", [(40, 64), (16, 96), (16, 65)])
def test_shapes_that_are_not_whole_tiles_are_refused(rows, cols):
    sm = torch.zeros(rows, cols, dtype=torch.uint8)
    with pytest.raises(ValueError, match="tile-major planes need"):
        ops.tile_palette_planes(sm, torch.zeros(rows, (cols + 1) // 2, dtype=torch.uint8))


def test_cpu_ops_read_tile_major_planes():
    """decode_palette, palette_matmul and palette_gemv with tiled=True give, bit for bit, what
    they give on the file-order planes."""
    rows, cols = 48, 1088
    w, h, p = _palette(rows, cols, seed=3)
    st, it = ops.tile_palette_planes(p[C.SUFFIX_SM], p[C.SUFFIX_IDX])
    pal = [int(b) for b in h.palette[: h.pal_size]]
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    torch.ops.unweight.decode_palette(st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, err, rows, cols, pal, 0, True)
    assert torch.equal(out.view(torch.uint16), w.view(torch.uint16)) and int(err) == 0
    x = torch.randn(3, cols).to(torch.bfloat16)
    ws, cnt = torch.empty(0, dtype=torch.float32), torch.empty(0, dtype=torch.int32)
    want = torch.ops.unweight.palette_matmul(x, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP],
                                             ws, cnt, rows, cols, pal, 1)
    got = torch.ops.unweight.palette_matmul(x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], ws, cnt, rows, cols, pal,
                                            1, tiled=True)
    assert torch.equal(got.view(torch.uint16), want.view(torch.uint16))
    got = torch.ops.unweight.palette_gemv(x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], rows, cols, pal, 1,
                                          kp.PGEMV_VARIANT_MMA, True)
    assert torch.equal(got.view(torch.uint16), want.view(torch.uint16))
    torch.library.opcheck(torch.ops.unweight.palette_gemv.default,
                          (x, st, it, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], rows, cols, pal, 1, 0, True),
                          test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------------ paired palette order
def _can_pair(pal) -> bool:
    n, evens = len(pal), sum(1 for e in pal if e % 2 == 0)
    return n <= 8 or evens // 2 + (n - evens) // 2 >= n - 8


@pytest.mark.parametrize("seed", range(60))
def test_paired_palette_reorders_every_palette_that_can_pair(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 17))
    lo = int(rng.integers(0, 240))
    # a contiguous run (trained weights' palettes) or any distinct exponents, in a shuffled order
    pal = [int(v) for v in (rng.permutation(np.arange(lo, lo + n)) if seed % 2 else rng.choice(256, n, replace=False))]
    got = ops.paired_palette(pal)
    if ops.palette_pairs(pal) or not _can_pair(pal):
        assert got is None
        return
    new, nib = got
    assert ops.palette_pairs(new) and sorted(new) == sorted(pal)
    assert sorted(nib) == list(range(16)) and nib[n:] == list(range(n, 16))  # out-of-range nibbles stay out
    assert all(new[nib[i]] == pal[i] for i in range(n))
    assert ops.inverse_nibble_map(nib)[nib[5]] == 5


def test_writer_order_palettes_of_trained_like_weights_pair_only_reordered():
    """The writer's count order (FORMAT.md) seldom pairs; a contiguous run of 16 always can."""
    _, h, _ = _palette(64, 1024, seed=1)
    pal = [int(b) for b in h.palette[: h.pal_size]]
    assert h.pal_size == 16 and not ops.palette_pairs(pal)
    assert ops.paired_palette(pal) is not None
    assert ops.paired_palette(list(range(100, 116))) is None  # value order pairs as it is
    assert ops.paired_palette([1, 3, 5, 7, 9, 11, 13, 15, 17, 2, 4, 6, 8, 10, 12, 14]) is None  # 9 odd: cannot
    with pytest.raises(ValueError):
        ops.paired_palette([])


def _with_verbatim(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02)
    w[0, 5], w[rows - 1, cols - 1], w[rows // 2, 0] = 1e30, -1e-30, float("nan")
    w = w.to(torch.bfloat16)
    e = tc.encode(w.view(torch.uint16).numpy(), "palette")
    return w, e.header, {s: plane_tensor(a) for s, a in e.planes.items()}


@pytest.mark.parametrize("rows,cols,tiled", [(48, 1088, False), (48, 1088, True), (7, 333, False)])
def test_a_paired_palette_decodes_the_same_bits_and_maps_back(rows, cols, tiled):
    """Rewritten index (both nibbles of every byte, the odd width's pad nibble too) and the
    reordered palette give every weight bit for bit, tile-major or not, verbatim blocks
    included; the inverse map gives the stored bytes back."""
    w, h, p = _with_verbatim(rows, cols, seed=rows + cols)
    assert h.num_verbatim > 0
    pal = [int(b) for b in h.palette[: h.pal_size]]
    n = len(pal)
    # the paired order where the writer's does not pair; else any reorder (the same contract)
    new, nib = ops.paired_palette(pal) or (pal[::-1], list(range(n - 1, -1, -1)) + list(range(n, 16)))
    sm, idx = p[C.SUFFIX_SM], p[C.SUFFIX_IDX]
    if tiled:
        sm, idx = ops.tile_palette_planes(sm, idx)
    idx2 = ops.remap_index(idx, nib)
    assert idx2.shape == idx.shape and idx2.dtype == torch.uint8 and not torch.equal(idx2, idx)
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    torch.ops.unweight.decode_palette(sm, idx2, p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, err, rows, cols, new, 0,
                                      tiled)
    assert torch.equal(out.view(torch.uint16), w.view(torch.uint16)) and int(err) == 0
    assert torch.equal(ops.remap_index(idx2, ops.inverse_nibble_map(nib)), idx)


def test_remap_index_checks_its_arguments_and_bounds_its_memory(monkeypatch):
    from unweight.ops import layout
    idx = torch.arange(256, dtype=torch.uint8).repeat(5, 3)
    nib = list(range(15, -1, -1))
    monkeypatch.setattr(layout, "_REMAP_CHUNK", 100)  # several slices, the last one short
    got = ops.remap_index(idx, nib)
    want = torch.tensor([(15 - (b & 15)) | (15 - (b >> 4)) << 4 for b in range(256)], dtype=torch.uint8).repeat(5, 3)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="permutation"):
        ops.remap_index(idx, [0] * 16)
    with pytest.raises(ValueError, match="uint8"):
        ops.remap_index(idx.to(torch.int32), nib)


def _split_ref(bits: np.ndarray, palette) -> tuple[np.ndarray, np.ndarray]:
    """The split layout of BF16 bits uint16 [rows, cols] computed directly (no index plane): BF16
    low bytes, and per weight the code c << 1 | sign (c: rank of e >> 1 in split_halves)."""
    halves = ops.split_halves(palette)
    e = (bits >> 7) & 0xFF
    rank = np.zeros(128, dtype=np.uint8)
    rank[halves] = np.arange(len(halves))
    return (bits & 0xFF).astype(np.uint8), (rank[e >> 1] << 1 | (bits >> 15)).astype(np.uint8)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_planes_hold_each_weights_low_byte_and_its_high_byte_code(seed, tiled):
    """split_palette_planes on a palette weight's planes: every weight's BF16 low byte, and a code
    from which the split tables give its high byte; verbatim weights keep sign and mantissa (the
    kernels' patch sets their exponent).  The same in tile-major order, element for element."""
    rng = np.random.default_rng(seed)
    shape = (48, 192)
    e = rng.integers(112, 128, shape)  # 16 exponents from an even one: 8 halves
    e[rng.random(shape) < 0.002] = rng.integers(0, 100, 1)  # verbatim blocks (their exponent outside)
    bits = ((rng.integers(0, 2, shape) << 15) | (e << 7) | rng.integers(0, 128, shape)).astype(np.uint16)
    enc = tc.encode(bits, "palette")
    pal = list(enc.header.palette[: enc.header.pal_size])
    assert ops.split_halves(pal) is not None
    sm, idx = (torch.from_numpy(enc.planes[k]) for k in (C.SUFFIX_SM, C.SUFFIX_IDX))
    if tiled:
        sm, idx = ops.tile_palette_planes(sm, idx)
    lo, codes = ops.split_palette_planes(sm, idx, pal)
    if tiled:
        lo, codes = ops.untile_palette_planes(lo, codes)
    lo, codes = lo.numpy(), codes.numpy()
    per_weight = np.stack([codes & 15, codes >> 4], -1).reshape(bits.shape)
    want_lo, want_code = _split_ref(bits, pal)
    nb = bits.shape[1] // C.PAL_BLOCK
    verbatim = np.zeros(bits.shape, dtype=bool)
    for v in enc.planes[C.SUFFIX_VPOS]:
        verbatim[v // nb, (v % nb) * C.PAL_BLOCK:(v % nb + 1) * C.PAL_BLOCK] = True
    assert verbatim.any() and (~verbatim).any()
    assert np.array_equal(lo[~verbatim], want_lo[~verbatim])
    assert np.array_equal(per_weight[~verbatim], want_code[~verbatim])
    assert np.array_equal(lo[verbatim] & 0x7F, want_lo[verbatim] & 0x7F)  # mantissa
    assert np.array_equal(per_weight[verbatim] & 1, want_code[verbatim] & 1)  # sign


def test_split_layout_refuses_palettes_of_more_than_eight_halves():
    assert ops.split_halves(range(108, 124)) == list(range(54, 62))
    assert ops.split_halves(range(107, 123)) is None and ops.split_halves([]) is None
    sm, idx = torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(16, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="at most 8 exponent halves"):
        ops.split_palette_planes(sm, idx, list(range(107, 123)))
    with pytest.raises(ValueError, match="two sign\\+mantissa bytes"):
        ops.split_palette_planes(sm, idx[:, :16], list(range(108, 124)))
