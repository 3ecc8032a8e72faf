"""Tensor-parallel shards of encoded tensors (unweight.codec.shard): bitwise equal to the
slice of the full decode, only the shard's segments touched, clear errors off the grid."""
import dataclasses
import zlib

import numpy as np
import pytest

from tests.conftest import bf16_gaussian
from unweight.codec import shard as sh
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.format.errors import ChecksumError
from unweight.format.header import TensorHeader

TPS = (1, 2, 4, 8)


def _enc(shape, encoding, seed=0, grid=None, outliers=False):
    rng = np.random.default_rng(seed)
    w = bf16_gaussian(rng, shape)
    if outliers:  # force verbatim palette blocks / rare exponents in a few places
        w.reshape(-1)[rng.integers(0, w.size, 40)] = 0x7F00 | rng.integers(0, 0x7F, 40).astype(np.uint16)
    e = tc.encode(w, encoding, threads=2, grid=grid)
    return w, e


SHAPES = [((256, 1024), None), ((96, 2048), None), ((128, 4096), (8, 512)), ((224, 64 * 33), (16, 64 * 33))]


def _check_shard(w, e, rows, cols):
    h, p = sh.shard_planes(e.header, e.planes, rows=rows, cols=cols)
    r0, r1 = rows or (0, w.shape[0])
    c0, c1 = cols or (0, w.shape[1])
    want = np.ascontiguousarray(w[r0:r1, c0:c1])
    # The shard is a self-contained v1 tensor: re-parse the packed header, check planes, decode.
    h2 = TensorHeader.parse(p[C.SUFFIX_HDR])
    got = tc.decode(h2, p, threads=2, verify=False)
    assert got.tobytes() == want.tobytes()
    crc = sh.shard_crc32(h2, p)
    assert crc == zlib.crc32(want.tobytes())
    h3, p3 = sh.with_crc(h2, p, crc)
    assert tc.decode(h3, p3, verify=True).tobytes() == want.tobytes()
    return h2, p


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
@pytest.mark.parametrize("shape,grid", SHAPES)
@pytest.mark.parametrize("axis", ["rows", "cols"])
def test_tp_shards_bitwise(encoding, shape, grid, axis):
    w, e = _enc(shape, encoding, grid=grid, outliers=True)
    full = tc.decode(e.header, e.planes)
    assert full.tobytes() == w.tobytes()
    n = shape[0] if axis == "rows" else shape[1]
    g = sh.row_grid(e.header) if axis == "rows" else sh.col_grid(e.header)
    for tp in TPS:
        if tp not in sh.allowed_tp_sizes(n, g):
            with pytest.raises(sh.ShardError, match="allowed --tensor-parallel-size"):
                sh.tp_shard_range(n, tp, 0, g)
            continue
        crcs, sizes, row_crcs, widths = [], [], [], []
        for rank in range(tp):
            rng_ = sh.tp_shard_range(n, tp, rank, g)
            kw = {axis: rng_}
            h, p = _check_shard(full, e, kw.get("rows"), kw.get("cols"))
            dec = tc.decode(h, p, verify=False)
            crcs.append(zlib.crc32(dec.tobytes()))
            sizes.append(dec.nbytes)
            row_crcs.append(sh.row_crcs(dec))
            widths.append(dec.shape[1] * 2)
        # The ranks' shard crcs combine to the original tensor's stored crc32.
        if axis == "rows":
            assert sh.combine_row_shard_crcs(crcs, sizes) == e.header.crc32
        else:
            assert sh.combine_col_shard_crcs(row_crcs, widths) == e.header.crc32


@pytest.mark.parametrize("rows,cols", [((32, 96), None), (None, (256, 512)), ((16, 48), (0, 256))])
def test_index_of_a_shard(rows, cols):
    # The GPU loaders add the checkpoint index to the shard a rank holds (ops.build_index, which
    # builds this index on the device), whose header carries no crc32 (0): the index must be
    # the one an indexed encode of the shard's weights writes.
    from unweight import _C
    from unweight.codec.huffman import canonical_codes
    from unweight.codec.reference import decode_reference
    from unweight.codec.verify import check_index, decode_verified
    w, e = _enc((96, 512), "huffman", grid=(16, 128))
    h, p = sh.shard_planes(e.header, e.planes, rows=rows, cols=cols)
    assert h.crc32 == 0
    idx = tc.with_index(h, p, threads=2, chk_interval=64)
    assert idx.header.chk_interval == 64 and idx.header.crc32 == 0
    want = w[slice(*(rows or (0, 96))), slice(*(cols or (0, 512)))]
    got = tc.decode(idx.header, idx.planes, verify=False)
    assert got.tobytes() == want.tobytes()
    check_index(idx.header, idx.planes, got)
    # the encoder's index for the shard's weights under the tensor's code table, and the
    # reference decoder's chain-by-chain check of it
    lens = tc.index_lens(h)
    codes = np.stack([canonical_codes(row) for row in lens])
    _, _, ref = _C.huffman_encode_indexed(np.ascontiguousarray(want), 16, 128, lens, codes, 1, 64)
    assert np.array_equal(idx.planes[C.SUFFIX_CHK], ref)
    _, checked = sh.with_crc(idx.header, idx.planes, zlib.crc32(want.tobytes()))  # the reference checks one
    assert decode_reference(checked[C.SUFFIX_HDR], checked).tobytes() == want.tobytes()
    with pytest.raises(ChecksumError):  # crc32 0 is no checksum to decode against
        decode_verified(idx.header, idx.planes)


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_block_shards_and_tensor_end(encoding):
    # Rectangular blocks (both axes) and ranges ending at a partial last group / chunk.
    w, e = _enc((200, 64 * 33), encoding, grid=(16, 64 * 4))
    _check_shard(w, e, (32, 200), (64 * 8, 64 * 33))
    _check_shard(w, e, (16, 48), (0, 64 * 4))
    _check_shard(w, e, (192, 200), None)


def test_huffman_shard_touches_only_its_segments():
    w, e = _enc((256, 2048), "huffman", grid=(16, 512))
    h = e.header
    off = e.planes[C.SUFFIX_OFF].astype(np.int64)
    ng = h.n_groups
    # Column shard 1 of 4 (chunk 1), row shard 2 of 4 (groups 8..11): the copied byte ranges
    # are exactly those segments' bytes.
    src = sh.shard_source_ranges(h, e.planes[C.SUFFIX_OFF], rows=None, cols=(512, 1024))
    assert src.segments == list(range(1 * ng, 2 * ng))
    assert src.exp_ranges == [(off[ng], off[2 * ng])]
    src = sh.shard_source_ranges(h, e.planes[C.SUFFIX_OFF], rows=(128, 192), cols=None)
    assert src.segments == [k * ng + g for k in range(4) for g in range(8, 12)]
    assert src.exp_ranges == [(off[k * ng + 8], off[k * ng + 12]) for k in range(4)]
    # Poison every byte outside those ranges: the shard must still decode to the same slice.
    exp = e.planes[C.SUFFIX_EXP].copy()
    keep = np.zeros(exp.size, dtype=bool)
    for a, b in src.exp_ranges:
        keep[a:b] = True
    exp[~keep] = 0xA5
    sm = e.planes[C.SUFFIX_SM].copy()
    sm[:128] ^= 0x5A
    sm[192:] ^= 0x5A
    planes = dict(e.planes, **{C.SUFFIX_EXP: exp, C.SUFFIX_SM: sm})
    hs, ps = sh.shard_planes(h, planes, rows=(128, 192))
    assert tc.decode(hs, ps, verify=False).tobytes() == w[128:192].tobytes()
    # Shard size is the shard's segments, not the tensor's.
    assert ps[C.SUFFIX_EXP].size == sum(b - a for a, b in src.exp_ranges) + C.STREAM_SLACK_BYTES
    assert ps[C.SUFFIX_OFF].size == len(src.segments) + 1


def test_palette_shard_keeps_only_its_verbatim_blocks():
    w, e = _enc((64, 1024), "palette", outliers=True)
    assert e.header.num_verbatim > 0
    h, p = sh.shard_planes(e.header, e.planes, rows=(16, 48), cols=(256, 512))
    bpr = 1024 // 32
    vp = e.planes[C.SUFFIX_VPOS].astype(np.int64)
    inside = ((vp // bpr >= 16) & (vp // bpr < 48) & (vp % bpr >= 8) & (vp % bpr < 16)).sum()
    assert h.num_verbatim == inside == p[C.SUFFIX_VPOS].size
    assert tc.decode(h, p, verify=False).tobytes() == w[16:48, 256:512].tobytes()


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_misaligned_requests_raise_clear_errors(encoding):
    w, e = _enc((96, 2048), encoding, grid=(32, 512))
    if encoding == "huffman":
        with pytest.raises(sh.ShardError, match="segment grid"):
            sh.shard_planes(e.header, e.planes, rows=(16, 96))
        with pytest.raises(sh.ShardError, match="multiples of 512"):
            sh.shard_planes(e.header, e.planes, cols=(0, 256))
        # 96 rows in R=32 groups: TP 3 is allowed, 2 is not (48 is not a multiple of 32).
        with pytest.raises(sh.ShardError, match=r"allowed --tensor-parallel-size values: \[1, 3\]"):
            sh.tp_shard_range(96, 2, 0, sh.row_grid(e.header), what="q_proj")
    else:
        with pytest.raises(sh.ShardError, match="multiples of 32"):
            sh.shard_planes(e.header, e.planes, cols=(0, 100))
        sh.shard_planes(e.header, e.planes, rows=(5, 7))  # palette rows split anywhere
    with pytest.raises(sh.ShardError, match="do not split into 5 equal"):
        sh.tp_shard_range(96, 5, 0, 1, what="x")
    with pytest.raises(sh.ShardError, match="outside"):
        sh.shard_planes(e.header, e.planes, rows=(0, 97))


def test_crc32_combine_matches_zlib():
    rng = np.random.default_rng(3)
    for la, lb in [(0, 5), (1, 1), (7, 1000), (4096, 3), (123, 65536)]:
        a, b = rng.bytes(la), rng.bytes(lb)
        assert sh.crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b)


@pytest.mark.parametrize("shape", [(512, 512), (768, 256), (256, 1536), (7168, 2048), (2048, 7168), (1024, 768)])
def test_default_grid_splits_multiples_of_256_eight_ways(shape):
    """The writer's grid serves TP 2, 4 and 8 on both axes of any matrix whose sides are
    multiples of 256, however small (docs/FORMAT.md, "Index cost and the writer's grid")."""
    R, Cc = tc.choose_grid(*shape)
    h = TensorHeader(encoding=C.ENC_HUFFMAN, rows=shape[0], cols=shape[1], rows_per_group=R, cols_per_chunk=Cc,
                     crc32=0)
    for tp in (2, 4, 8):
        for role in ("rows", "cols"):
            assert len(sh.tp_plan(h, tp, role)) == tp


def test_old_grid_keeps_loading_with_its_tp_limit():
    """A file written under the earlier rule (one 512-wide chunk for K = 512) still decodes,
    shards where its grid allows, and names the allowed sizes where it does not."""
    w, e = _enc((512, 512), "huffman", grid=(16, 512))
    assert tc.decode(e.header, e.planes).tobytes() == w.tobytes()
    assert len(sh.tp_plan(e.header, 8, "rows")) == 8  # rows: R = 16 divides 512 / 8
    with pytest.raises(sh.ShardError, match=r"o_proj.*allowed --tensor-parallel-size values: \[1\]"):
        sh.tp_plan(e.header, 2, "cols", what="o_proj")


# A Kimi-K2 layer (hidden 7168, 64 heads of MLA, MoE intermediate 2048, 384 experts, one shared
# expert), per-expert 2-D tensors as transformers saves them; a few of the experts.
KIMI_K2_LAYER = [
    ("self_attn.q_a_proj", (1536, 7168), "full"),          # MLA low-rank projections: replicated
    ("self_attn.q_b_proj", (64 * 192, 1536), "rows"),
    ("self_attn.kv_a_proj_with_mqa", (576, 7168), "full"),
    ("self_attn.kv_b_proj", (64 * 256, 512), "rows"),
    ("self_attn.o_proj", (7168, 64 * 128), "cols"),
    ("mlp.gate", (384, 7168), "full"),                    # the router
    *[(f"mlp.{e}.{p}", shp, role) for e in ("experts.0", "experts.1", "experts.383", "shared_experts")
      for p, shp, role in (("gate_proj", (2048, 7168), "rows"), ("up_proj", (2048, 7168), "rows"),
                           ("down_proj", (7168, 2048), "cols"))],
]


def test_kimi_k2_layer_plans_tp8_and_each_rank_decodes_its_shard_alone():
    """Dry run of TP=8 on a Kimi-K2-shaped MoE layer, experts included: every sharded tensor
    splits 8 ways on the default grid; each rank's shard is a self-contained tensor holding
    ~1/8 of the planes that decodes alone to exactly its block of the original; the eight
    ranks' shard crcs check the stored crc32 (codec/shard_check.py); no rank decodes a whole
    tensor."""
    from unweight.codec.shard_check import check_shard_records, shard_record
    rng = np.random.default_rng(0)
    tp = 8
    for name, shape, role in KIMI_K2_LAYER:
        name = f"model.layers.1.{name}.weight"
        if role == "full":  # replicated: every rank holds the whole tensor
            R, Cc = tc.choose_grid(*shape)
            h = TensorHeader(encoding=C.ENC_HUFFMAN, rows=shape[0], cols=shape[1], rows_per_group=R,
                             cols_per_chunk=Cc, crc32=0)
            assert sh.tp_plan(h, tp, role) == [(None, None)] * tp
            continue
        w = bf16_gaussian(rng, shape)
        e = tc.encode(w, "huffman", threads=2)
        plan = sh.tp_plan(e.header, tp, role, what=name)
        full_bytes = sum(a.nbytes for a in e.planes.values())
        records = []
        for rank, (rows, cols) in enumerate(plan):
            hs, ps = sh.shard_planes(e.header, e.planes, rows=rows, cols=cols, where=name)
            got = tc.decode(TensorHeader.parse(ps[C.SUFFIX_HDR]), ps, threads=2, verify=False)
            r0, r1 = rows or (0, shape[0])
            c0, c1 = cols or (0, shape[1])
            assert got.tobytes() == np.ascontiguousarray(w[r0:r1, c0:c1]).tobytes(), (name, rank)
            assert sum(a.nbytes for a in ps.values()) < full_bytes / tp + 8192, (name, rank)
            records.append(shard_record(got, rows=rows, cols=cols))
        assert check_shard_records(records, e.header, name)
        # One flipped bit in one rank's block is caught by the group check.
        bad = list(records)
        kind, a, b, crc = bad[3]
        bad[3] = (kind, a, b, crc ^ 1 if kind == "rows" else [crc[0] ^ 1] + crc[1:])
        with pytest.raises(ChecksumError, match="across the tensor-parallel shards"):
            check_shard_records(bad, e.header, name)
        # The messages name the blocks as the caller does (an expert-parallel stack's slices).
        with pytest.raises(ChecksumError, match="across the expert-parallel slices"):
            check_shard_records(bad, e.header, name, "expert-parallel slices")
        # A single rank (TP=1) holding the whole tensor: no "shards" in the message.
        with pytest.raises(ChecksumError, match="mismatch of the decoded tensor"):
            check_shard_records([("rows", 0, e.header.rows, e.header.crc32 ^ 1)], e.header, name)


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_a_stack_matrix_stands_alone_and_its_shards_read_only_it(encoding):
    """tc.matrix_planes: matrix e of a stack (Llama 4's [E, H, 2I] experts) as a tensor of its
    own, whose column and row shards decode to the matrix's block, bit for bit, for every e;
    the index of a huffman stack is dropped, verbatim blocks are rebased to the matrix."""
    rng = np.random.default_rng(3)
    w = bf16_gaussian(rng, (4, 256, 512))
    w.reshape(-1)[rng.integers(0, w.size, 60)] = 0x7F00 | rng.integers(0, 0x7F, 60).astype(np.uint16)
    e = tc.encode(w, encoding, threads=2, chk_interval=256 if encoding == "huffman" else 0)
    assert e.header.stack == 4
    for m in range(4):
        h, p = tc.matrix_planes(e.header, e.planes, m)
        assert h.stack == 0 and h.shape == (256, 512) and h.crc32 == 0 and not h.chk_interval
        tc.check_planes(h, p)
        assert bytes(TensorHeader.parse(p[C.SUFFIX_HDR]).pack()) == bytes(h.pack())
        assert tc.decode(h, p, threads=2, verify=False).tobytes() == w[m].tobytes()
        for rows, cols in (((128, 256), None), (None, (128, 384)), ((0, 128), (256, 512))):
            hs, ps = sh.shard_planes(h, p, rows=rows, cols=cols)
            r0, r1 = rows or (0, 256)
            c0, c1 = cols or (0, 512)
            assert tc.decode(hs, ps, threads=2, verify=False).tobytes() == w[m, r0:r1, c0:c1].tobytes()
    with pytest.raises(IndexError):
        tc.matrix_planes(e.header, e.planes, 4)


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_decode_block_cuts_any_block_from_the_segments_that_hold_it(encoding):
    """sh.decode_block: any rows x cols block, on the segment grid or across it (a TP 8 rank's
    1024 columns of a 2048-column chunk, as Scout's gate_up stack has), decodes to the
    tensor's bytes, verbatim blocks included; grid_cover gives the segments read."""
    rng = np.random.default_rng(5)
    w = bf16_gaussian(rng, (96, 1024))
    w.reshape(-1)[rng.integers(0, w.size, 40)] = 0x7F00 | rng.integers(0, 0x7F, 40).astype(np.uint16)
    e = tc.encode(w, encoding, threads=2, segment_weights=2048)
    h = e.header
    if encoding == "huffman":
        assert (h.rows_per_group, h.cols_per_chunk) == (16, 128)
        assert sh.grid_cover((3, 17), h.rows, 16) == (0, 32) and sh.grid_cover((64, 192), h.cols, 128) == (0, 256)
        assert sh.grid_cover((80, 96), h.rows, 16) == (80, 96) and sh.grid_cover(None, 7, 4) == (0, 7)
    for rows, cols in (((0, 96), (0, 64)), (None, (64, 192)), ((5, 50), (100, 1023)), ((95, 96), None),
                       ((16, 32), (128, 256)), (None, None)):
        r0, r1 = rows or (0, 96)
        c0, c1 = cols or (0, 1024)
        got = sh.decode_block(h, e.planes, rows=rows, cols=cols, threads=2)
        assert got.shape == (r1 - r0, c1 - c0) and got.flags.c_contiguous
        assert got.tobytes() == w[r0:r1, c0:c1].tobytes(), (rows, cols)


def test_a_stack_cuts_its_columns_16_ways_where_chunks_stay_512_wide():
    """The writer's grid for the matrices of a 3-D stack: 16 column chunks where each stays
    >= 512 wide (each half of a fused [gate | up] axis then splits 8 ways on chunk edges:
    Llama 4's gate_up at TP 8), else the 2-D rule; a 2-D matrix keeps 8."""
    rng = np.random.default_rng(0)
    for shape, C_ in (((2, 64, 8192), 512), ((64, 8192), 1024), ((2, 64, 5120), 640), ((2, 32, 512), 64)):
        e = tc.encode(bf16_gaussian(rng, shape), "huffman", threads=2)
        assert e.header.cols_per_chunk == C_, shape
        assert tc.choose_grid(*shape[-2:], stacked=len(shape) == 3)[1] == C_
    h = tc.encode(bf16_gaussian(rng, (2, 64, 8192)), "huffman", threads=2).header
    assert len(sh.tp_plan(dataclasses.replace(h, stack=0, cols=4096), 8, "cols")) == 8  # each half, 8 ways


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_block_planes_copies_blocks_on_the_grid_and_recodes_the_others(encoding):
    """block_planes: a block on the segment grid is its segments copied (not recoded, crc32 0);
    any other equal split of rows or columns (TP 16 of 2048 columns written in 256-column
    chunks, TP 3, a block inside one segment) is decoded from the segments that hold it and
    encoded anew in the same encoding, its own crc32 stored; both decode to the block's bits,
    verbatim and rare exponents included."""
    w, e = _enc((96, 2048), encoding, outliers=True)
    h = e.header
    assert sh.on_grid(h) and sh.on_grid(h, rows=(0, h.rows_per_group), cols=(0, h.cols_per_chunk))
    cases = [(None, (c, c + 2048 // 16)) for c in range(0, 2048, 2048 // 16)]
    cases += [((r, r + 32), None) for r in range(0, 96, 32)] + [((r, r + 24), None) for r in range(0, 96, 24)]
    cases += [((5, 9), (40, 72)), ((0, 96), (0, 2048))]
    for rows, cols in cases:
        hb, pb, recoded = sh.block_planes(h, e.planes, rows=rows, cols=cols, threads=2, where="t")
        r0, r1 = rows or (0, 96)
        c0, c1 = cols or (0, 2048)
        want = np.ascontiguousarray(w[r0:r1, c0:c1])
        assert recoded == (not sh.on_grid(h, rows, cols)), (rows, cols)
        assert hb.encoding_name == encoding and (hb.rows, hb.cols) == want.shape
        assert hb.crc32 == (zlib.crc32(want.tobytes()) if recoded else 0)
        assert tc.decode(hb, pb, threads=2, verify=recoded).tobytes() == want.tobytes(), (rows, cols)
    for rows in ((96, 96), (90, 100)):  # (an empty block, or one past the end: one line)
        with pytest.raises(sh.ShardError, match="is empty or outside"):
            sh.block_planes(h, e.planes, rows=rows, where="t")
    if encoding == "huffman":  # 128-column blocks of 256-column chunks, 24-row blocks of 32-row groups
        assert (h.rows_per_group, h.cols_per_chunk) == (32, 256)
        assert not sh.on_grid(h, cols=(128, 256)) and not sh.on_grid(h, rows=(24, 48))
