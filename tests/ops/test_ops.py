"""torch.library ops (unweight::*): schemas + fake impls (opcheck), CPU impls against the
codec, torch.compile (eager and inductor backends), errors."""
import pytest
import torch
import torch.nn as nn

from unweight import ops
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.format.errors import FormatError
from unweight.runtime import scratch
from unweight.runtime.modules import CompressedEmbedding, CompressedLinear, plane_tensor


def _weights(rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)


def _planes(w, enc):
    e = tc.encode(w.view(torch.uint16).numpy(), enc)
    return e.header, {s: plane_tensor(a) for s, a in e.planes.items()}


def _huffman_args(rows=96, cols=200):
    w = _weights(rows, cols)
    h, p = _planes(w, "huffman")
    table = p[C.SUFFIX_HDR][C.HEADER_BYTES:].view(4, -1)
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    args = (p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], table, torch.empty(0, dtype=torch.uint16), out, err,
            rows, cols, h.rows_per_group, h.cols_per_chunk, h.exp_lo, h.exp_hi)
    return w, h, p, args


def _palette_args(rows=96, cols=201):
    w = _weights(rows, cols)
    h, p = _planes(w, "palette")
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    pal = [int(b) for b in h.palette[: h.pal_size]]
    args = (p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], out, err, rows, cols, pal)
    return w, h, p, args


def test_decode_huffman_cpu_bitwise():
    w, h, p, args = _huffman_args()
    torch.ops.unweight.decode_huffman(*args)
    assert torch.equal(args[5], w)


def test_decode_palette_cpu_bitwise():
    w, h, p, args = _palette_args()
    torch.ops.unweight.decode_palette(*args)
    assert torch.equal(args[4], w)


def test_gather_rows_cpu():
    w = _weights(700, 64)
    ids = torch.tensor([[0, 699, 5], [5, 350, 351]])
    h, p = _planes(w, "huffman")
    got = torch.ops.unweight.gather_rows_huffman(ids, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF],
                                                 p[C.SUFFIX_HDR][C.HEADER_BYTES:].view(4, -1), 700, 64,
                                                 h.rows_per_group, h.cols_per_chunk, h.exp_lo, h.exp_hi)
    assert torch.equal(got, w[ids.reshape(-1)])
    h, p = _planes(w, "palette")
    got = torch.ops.unweight.gather_rows_palette(ids, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS],
                                                 p[C.SUFFIX_VEXP], 700, 64, [int(b) for b in h.palette[:h.pal_size]])
    assert torch.equal(got, w[ids.reshape(-1)])


@pytest.mark.parametrize("which", ["huffman", "palette"])
def test_opcheck(which):
    # Schema, fake (meta) impl and dispatcher registration, as torch.compile will use them.
    if which == "huffman":
        _, _, p, args = _huffman_args(40, 64)
        torch.library.opcheck(torch.ops.unweight.decode_huffman.default, args,
                              test_utils=("test_schema", "test_faketensor"))
        ids = torch.tensor([1, 39, 7])
        h = tc.encoded_header({C.SUFFIX_HDR: p[C.SUFFIX_HDR].numpy()})
        gargs = (ids, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], p[C.SUFFIX_HDR][C.HEADER_BYTES:].view(4, -1),
                 40, 64, h.rows_per_group, h.cols_per_chunk, h.exp_lo, h.exp_hi)
        torch.library.opcheck(torch.ops.unweight.gather_rows_huffman.default, gargs)
    else:
        _, h, p, args = _palette_args(40, 64)
        torch.library.opcheck(torch.ops.unweight.decode_palette.default, args,
                              test_utils=("test_schema", "test_faketensor"))
        gargs = (torch.tensor([1, 39, 7]), p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], 40, 64,
                 [int(b) for b in h.palette[: h.pal_size]])
        torch.library.opcheck(torch.ops.unweight.gather_rows_palette.default, gargs)


def test_corrupt_stream_raises_format_error():
    w, h, p, args = _huffman_args()
    exp = p[C.SUFFIX_EXP].clone()
    exp[: exp.numel() - 8] ^= 0x5A
    args = list(args)
    args[1] = exp
    with pytest.raises(FormatError):
        torch.ops.unweight.decode_huffman(*args)


def _lin(enc):
    torch.manual_seed(0)
    lin = nn.Linear(256, 192).to(torch.bfloat16)
    nn.init.normal_(lin.weight, std=0.02)
    return lin, CompressedLinear.from_linear(lin, enc)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_torch_compile_linear(backend, enc):
    torch._dynamo.reset()
    lin, cl = _lin(enc)
    scratch.reserve("cpu", 256 * 192)
    f = torch.compile(cl, backend=backend, fullgraph=True)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(f(x), lin(x))
        assert torch.equal(f(x * 2), lin(x * 2))  # scratch reused on the second call


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("enc", ["huffman", "palette"])
def test_torch_compile_embedding(backend, enc):
    torch._dynamo.reset()
    torch.manual_seed(0)
    emb = nn.Embedding(500, 64).to(torch.bfloat16)
    nn.init.normal_(emb.weight, std=0.02)
    ce = CompressedEmbedding.from_embedding(emb, enc)
    f = torch.compile(ce, backend=backend, fullgraph=True)
    ids = torch.tensor([[3, 499, 3]])
    assert torch.equal(f(ids), emb(ids))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    _, _, p, _ = _huffman_args(40, 64)
    with FakeTensorMode(allow_non_fake_inputs=True):
        ids = torch.empty(2, 5, dtype=torch.int64)
        out = torch.ops.unweight.gather_rows_huffman(ids, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF],
                                                     p[C.SUFFIX_HDR][C.HEADER_BYTES:].view(4, -1), 40, 64, 16, 64,
                                                     100, 120)
        assert out.shape == (10, 64) and out.dtype == torch.bfloat16


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_ops_bitwise_and_graph_capture():
    from unweight.ops import build_lut
    if not ops.cuda_kernels_built():
        pytest.skip("unweight._cuda not built")
    w, h, p, args = _huffman_args(1024, 768)
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    dev[4] = build_lut(dev[3], h.exp_lo, h.exp_hi, dev[6])
    torch.ops.unweight.decode_huffman(*dev)
    assert torch.equal(dev[5].cpu(), w)
    dev[5].zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops.unweight.decode_huffman(*dev)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(dev[5].cpu(), w) and int(dev[6].item()) == 0
    w, h, p, args = _palette_args(1024, 768)
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    torch.ops.unweight.decode_palette(*dev)
    assert torch.equal(dev[4].cpu(), w)


def test_decode_huffman_exponents_only_and_histogram_cpu():
    w, h, p, args = _huffman_args(70, 130)
    args = list(args)
    args[5] = torch.empty(70, 130, dtype=torch.uint8)
    torch.ops.unweight.decode_huffman(*args)
    want = (w.view(torch.int16).to(torch.int32) >> 7) & 0xFF
    assert torch.equal(args[5].to(torch.int32), want)
    hist = torch.zeros(256, dtype=torch.int64)
    ops.exp_histogram(args[5], hist)
    assert torch.equal(hist, torch.bincount(want.reshape(-1), minlength=256))


@pytest.mark.parametrize("splits", [1, 3])
def test_matmul_cpu_is_the_fp32_reference(splits):
    # The CPU implementation is the reference the CUDA kernel is held to: decode, fp32 products
    # and sums, one rounding to bf16 (splits, workspace and counters only shape the CUDA launch).
    w, h, p, args = _palette_args(48, 192)
    x = torch.randn(3, 192, dtype=torch.bfloat16)
    ws = torch.empty(ops.palette_workspace_elems(3, 48, splits))
    cnt = torch.zeros(ops.palette_counters_elems(48), dtype=torch.int32)
    oargs = (x, *args[:4], ws, cnt, *args[6:], splits)
    y = torch.ops.unweight.palette_matmul(*oargs)
    assert y.shape == (3, 48) and y.dtype == torch.bfloat16
    assert torch.equal(y, (x.float() @ w.float().T).to(torch.bfloat16))
    torch.library.opcheck(torch.ops.unweight.palette_matmul.default, oargs, test_utils=("test_schema", "test_faketensor"))


def test_matmul_workspace_holds_the_wgmma_x_after_the_partials():
    # wgmma: x as stage images (8 rows at batch 3, the padding zeros) after the partial sums,
    # 16-byte aligned
    assert ops.palette_workspace_elems(3, 48, 1) == 0 and ops.palette_workspace_elems(3, 48, 3) == 432
    assert ops.palette_workspace_elems(3, 48, 1, 192, wgmma=True) == 8 * 192 // 2
    assert ops.palette_workspace_elems(3, 47, 3, 192, wgmma=True) == 424 + 8 * 192 // 2  # 423 floats rounded up


def test_transcode_to_palette_cpu_matches_codec():
    w, h, p, _ = _huffman_args(90, 200)
    hp, pp = ops.transcode_to_palette(h, p, torch.empty(0, dtype=torch.uint16), torch.zeros(1, dtype=torch.int32))
    want = tc.transcode_to_palette(h, {s: t.numpy() for s, t in p.items()})
    assert hp.pack().tobytes() == want.header.pack().tobytes()
    for s, a in want.planes.items():
        assert pp[s].numpy().tobytes() == a.tobytes(), s


def test_empty_matrix_decodes_to_nothing():
    out = torch.empty(0, 64, dtype=torch.bfloat16)
    err = torch.zeros(1, dtype=torch.int32)
    e = torch.empty(0, dtype=torch.uint8)
    torch.ops.unweight.decode_palette(e.view(0, 64), e.view(0, 32), torch.empty(0, dtype=torch.uint32), e.view(0, 64),
                                      out, err, 0, 64, [120])
    assert int(err) == 0


def test_bad_output_shape_is_refused():
    w, h, p, args = _huffman_args(40, 64)
    args = list(args)
    args[5] = torch.empty(40, 63, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out must be"):
        torch.ops.unweight.decode_huffman(*args)
