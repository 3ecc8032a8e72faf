"""The checkpoint index through the ops and the runtime, and the device embedding path.

The CUDA kernels themselves run in tests/cuda (emulated) and in the GPU runbook; here, on the
CPU: the ops take the index arguments (the CPU decoder does not need them and must give the
same bits), the index travels from a header and planes into EncodedWeight, a module and the
vLLM op arguments, and the piece-combining logic of the device embedding path (which must not
read ids back to the host) gives F.embedding's rows, zeros for vocab padding and one error per
id out of range.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unweight import ops  # noqa: F401  (registers the ops)
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.integrations.vllm import ops as vops
from unweight.runtime import dispatch, scratch
from unweight.runtime.modules import CompressedEmbedding, CompressedLinear
from unweight.runtime.weights import EncodedWeight

from ..cuda.helpers import make_weights


def _weight(rows, cols, encoding, seed=0, S=C.DEFAULT_CHK_INTERVAL):
    w = make_weights(rows, cols, seed=seed)
    enc = tc.encode(w, encoding, threads=1, chk_interval=S)
    planes = {s: torch.from_numpy(np.ascontiguousarray(a)) for s, a in enc.planes.items()}
    table = torch.from_numpy(np.ascontiguousarray(enc.header.table)) if enc.header.table is not None else None
    lut = torch.empty(0, dtype=torch.uint16) if encoding == "huffman" else None
    return w, enc, EncodedWeight.from_header(enc.header, planes, table, lut)


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def test_encoded_weight_carries_the_index():
    w, enc, ew = _weight(256, 512, "huffman")
    assert enc.header.chk_interval == C.DEFAULT_CHK_INTERVAL and ew.chk_interval == C.DEFAULT_CHK_INTERVAL
    assert ew.chk.dtype == torch.uint16 and tuple(ew.chk.shape) == enc.planes[C.SUFFIX_CHK].shape
    _, _, ew0 = _weight(256, 512, "huffman", S=0)
    assert ew0.chk is None and ew0.chk_interval == 0
    _, _, ep = _weight(64, 96, "palette")
    assert ep.chk is None and ep.chk_interval == 0


def test_decode_op_takes_the_index_and_gives_the_same_bits():
    w, enc, ew = _weight(130, 1024, "huffman", seed=3)
    err = torch.zeros(1, dtype=torch.int32)
    for chk, S in ((ew.chk, ew.chk_interval), (None, 0)):
        out = torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16)
        torch.ops.unweight.decode_huffman(ew.sm, ew.exp, ew.off, ew.table, ew.lut, out, err, ew.rows, ew.cols,
                                          ew.rows_per_group, ew.cols_per_chunk, ew.exp_lo, ew.exp_hi, chk, S)
        assert np.array_equal(_bits(out), w)
    assert int(err) == 0
    # the fake impl accepts the new arguments (torch.compile / FakeTensor tracing)
    out = torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16)
    args = (ew.sm, ew.exp, ew.off, ew.table, ew.lut, out, err, ew.rows, ew.cols, ew.rows_per_group,
            ew.cols_per_chunk, ew.exp_lo, ew.exp_hi, ew.chk, ew.chk_interval)
    torch.library.opcheck(torch.ops.unweight.decode_huffman.default, args,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_gather_ops_take_lut_err_and_index(encoding):
    w, enc, ew = _weight(300, 512, encoding, seed=4)
    ids = torch.tensor([[0, 299], [17, 17]])
    err = torch.zeros(1, dtype=torch.int32)
    if encoding == "huffman":
        args = (ids, ew.sm, ew.exp, ew.off, ew.table, ew.rows, ew.cols, ew.rows_per_group, ew.cols_per_chunk,
                ew.exp_lo, ew.exp_hi, ew.lut, err, ew.chk, ew.chk_interval)
        op = torch.ops.unweight.gather_rows_huffman
    else:
        args = (ids, ew.sm, ew.idx, ew.vpos, ew.vexp, ew.rows, ew.cols, ew.palette, err)
        op = torch.ops.unweight.gather_rows_palette
    got = op(*args)
    assert np.array_equal(_bits(got), w[ids.reshape(-1).numpy()])
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_device_embedding_path_combines_pieces_without_host_reads(encoding):
    """dispatch's CUDA embedding path, run on CPU tensors: same rows as F.embedding over the
    stacked pieces, zeros for vocab padding, one counted error per id out of range, and the
    ids never leave their device (no .item(), no boolean indexing)."""
    (w1, _, p1), (w2, _, p2) = _weight(40, 96, encoding, seed=1), _weight(24, 96, encoding, seed=2)
    full = np.concatenate([w1, w2, np.zeros((8, 96), np.uint16)])
    table = torch.from_numpy(full.view(np.int16)).view(torch.bfloat16)
    ids = torch.tensor([[0, 39, 40, 63], [64, 71, 5, 41]])
    scratch.error_counter("cpu").zero_()
    got = dispatch._embedding_cuda([p1, p2], ids, 72, 96)
    assert got.shape == (2, 4, 96)
    assert torch.equal(got.view(torch.int16), F.embedding(ids, table).view(torch.int16))
    assert int(scratch.error_counter("cpu")) == 0
    bad = torch.tensor([3, 72, -1])
    got = dispatch._embedding_cuda([p1, p2], bad, 72, 96)
    assert int(scratch.error_counter("cpu")) == 2
    assert torch.equal(got[0].view(torch.int16), table[3].view(torch.int16)) and not got[1:].view(torch.int16).any()
    scratch.error_counter("cpu").zero_()


def test_with_index_adds_the_plane_and_keeps_every_bit():
    w, enc, _ = _weight(256, 512, "huffman", S=0)
    assert enc.header.chk_interval == 0 and tc.encode(w, "huffman").header.chk_interval == 0  # files: no index
    idx = tc.with_index(enc.header, enc.planes, threads=1)
    assert idx.header.chk_interval == C.DEFAULT_CHK_INTERVAL and C.SUFFIX_CHK in idx.planes
    for s in (C.SUFFIX_SM, C.SUFFIX_EXP, C.SUFFIX_OFF):
        assert idx.planes[s].tobytes() == enc.planes[s].tobytes(), s
    assert np.array_equal(tc.decode(idx.header, idx.planes, verify=True), w)
    assert tc.with_index(idx.header, idx.planes).header is idx.header  # already indexed: as is


def test_module_and_vllm_arguments_carry_the_index():
    emb = torch.nn.Embedding(512, 256).to(torch.bfloat16)
    ce = CompressedEmbedding.from_embedding(emb, "huffman", chk_interval=C.DEFAULT_CHK_INTERVAL)
    assert ce.header.chk_interval == C.DEFAULT_CHK_INTERVAL
    assert "weight" + C.SUFFIX_CHK in ce.state_dict()
    ew = ce.encoded()
    assert ew.chk_interval == C.DEFAULT_CHK_INTERVAL and ew.chk is ce.weight__chk
    placeholder = torch.empty(0, dtype=torch.uint8)
    planes = vops.piece_planes(ew, placeholder)
    meta = vops.piece_meta(ew)
    assert len(planes) == vops.PLANES_PER_PIECE and len(meta) == vops.META_LEN
    (back,) = vops.pieces(planes, meta)
    assert back.chk is ew.chk and back.chk_interval == ew.chk_interval
    ids = torch.tensor([0, 511, 100])
    assert torch.equal(dispatch.embedding([back], ids, 512, 256).view(torch.int16),
                       emb.weight.detach()[ids].view(torch.int16))


def test_vllm_arguments_carry_the_plane_order():
    """A tile-major palette piece (vLLM's plane_order "tiled": common.hold_tiled) keeps its
    order through the op arguments, so the op's linear reads it as such: the file-order bits."""
    from unweight.integrations.vllm.common import hold_tiled
    lin = torch.nn.Linear(128, 48, bias=False).to(torch.bfloat16)
    ew = CompressedLinear.from_linear(lin, "palette").encoded()
    x = torch.randn(3, 128).to(torch.bfloat16)
    want = dispatch.linear([ew], x, None, 48, 128)
    tiled = hold_tiled(CompressedLinear.from_linear(lin, "palette").encoded())
    assert tiled.tiled and not torch.equal(tiled.sm, ew.sm)
    placeholder = torch.empty(0, dtype=torch.uint8)
    (back,) = vops.pieces(vops.piece_planes(tiled, placeholder), vops.piece_meta(tiled))
    assert back.tiled and len(vops.piece_meta(tiled)) == vops.META_LEN
    assert torch.equal(dispatch.linear([back], x, None, 48, 128).view(torch.int16), want.view(torch.int16))
    odd = CompressedLinear.from_linear(torch.nn.Linear(100, 40).to(torch.bfloat16), "palette").encoded()
    assert not hold_tiled(odd).tiled  # not whole 16 x 64 tiles: file order


def test_vllm_arguments_carry_the_verbatim_row_index():
    """A palette piece's verbatim row index (runtime.weights.hold_row_index on a GPU) rides in
    its fifth plane slot through the op arguments and comes back as the piece's vrow; a piece
    without one gets the placeholder there and comes back without."""
    emb = torch.nn.Embedding(64, 256).to(torch.bfloat16)
    with torch.no_grad():
        emb.weight[::3, ::7] *= 2.0 ** -30  # outliers below the palette: verbatim blocks
    ew = CompressedEmbedding.from_embedding(emb, "palette").encoded()
    assert ew.vpos.numel() > 0 and ew.vrow is None  # (built on CUDA only)
    placeholder = torch.empty(0, dtype=torch.uint8)
    (bare,) = vops.pieces(vops.piece_planes(ew, placeholder), vops.piece_meta(ew))
    assert bare.vrow is None
    ew.vrow = ops.verbatim_rows(ew.vpos, ew.rows, ew.cols)
    planes = vops.piece_planes(ew, placeholder)
    assert len(planes) == vops.PLANES_PER_PIECE and planes[4] is ew.vrow
    (back,) = vops.pieces(planes, vops.piece_meta(ew))
    assert back.vrow is ew.vrow
    ids = torch.tensor([0, 63, 3, 9])
    assert torch.equal(dispatch.embedding([back], ids, 64, 256).view(torch.int16),
                       emb.weight.detach()[ids].view(torch.int16))
