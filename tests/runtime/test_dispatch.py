"""The single dispatch point (unweight/runtime/dispatch.py): stacked pieces, vocab padding,
decode into scratch, dtype handling, and the policy's GEMM."""
import pytest
import torch
import torch.nn.functional as F

from unweight.codec import tensor_codec as tc
from unweight.runtime import dispatch, scratch
from unweight.runtime.modules import plane_tensor
from unweight.runtime.policy import DispatchPolicy
from unweight.runtime.weights import EncodedWeight


def _piece(rows, cols, enc, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    e = tc.encode(w.view(torch.uint16).numpy(), enc)
    planes = {s: plane_tensor(a) for s, a in e.planes.items()}
    table = torch.from_numpy(e.header.table.copy()) if enc == "huffman" else None
    return w, EncodedWeight.from_header(e.header, planes, table=table, lut=torch.empty(0, dtype=torch.uint16))


def _stack(encs, rows=(48, 16, 16), cols=96):
    ws, ps = zip(*[_piece(r, cols, e, i) for i, (r, e) in enumerate(zip(rows, encs))])
    return torch.cat(ws), list(ps)


@pytest.mark.parametrize("encs", [("huffman",) * 3, ("palette",) * 3, ("huffman", "palette", "huffman")])
def test_stacked_pieces_with_padding(encs):
    w, pieces = _stack(encs)
    pad = 8
    out_rows = w.shape[0] + pad
    full = torch.cat([w, torch.zeros(pad, w.shape[1], dtype=torch.bfloat16)])
    assert torch.equal(dispatch.decode_new(pieces, out_rows, 96), full)
    x = torch.randn(2, 3, 96, dtype=torch.bfloat16)
    b = torch.randn(out_rows, dtype=torch.bfloat16)
    assert torch.equal(dispatch.linear(pieces, x, b, out_rows, 96), F.linear(x, full, b))
    ids = torch.tensor([[0, 47, 48, 63], [64, 79, 80, 87]])  # every piece's edges, and padding rows
    assert torch.equal(dispatch.embedding(pieces, ids, out_rows, 96), F.embedding(ids, full))
    with pytest.raises(IndexError):
        dispatch.embedding(pieces, torch.tensor([out_rows]), out_rows, 96)


def test_fp32_input_gets_a_converted_copy_and_policy_gemm_is_used():
    w, pieces = _stack(("huffman",), rows=(32,))
    seen = []

    def gemm(x, wt, b):
        seen.append(wt.dtype)
        return F.linear(x, wt, b)

    x = torch.randn(4, 96)
    y = dispatch.linear(pieces, x, None, 32, 96, DispatchPolicy(None, dense_linear=gemm))
    assert torch.equal(y, F.linear(x, w.float())) and seen == [torch.float32]


def test_decode_lands_in_the_shared_scratch():
    scratch.release()
    w, pieces = _stack(("palette",), rows=(40,))
    buf = scratch.reserve("cpu", 40 * 96)
    got = dispatch.decode_into(pieces, scratch.weights("cpu", 40 * 96), 40, 96)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, w)
    scratch.release()


def test_fused_wires_the_palette_op_and_refuses_huffman():
    """dispatch.fused passes planes, scratch views and the split count to palette_matmul in
    the op's order; on CPU the op is the fp32 reference (one split, no workspace needed)."""
    w, p = _piece(40, 128, "palette", 3)
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    assert torch.equal(dispatch.fused(p, x), (x.float() @ w.float().T).to(torch.bfloat16))
    _, h = _piece(40, 128, "huffman", 4)
    with pytest.raises(ValueError, match="no fused kernel"):
        dispatch.fused(h, x)
    # the wide-stage path is the same op with another stage width: the same reference on CPU
    assert torch.equal(dispatch.fused(p, x, "palette_gemm_wide"), dispatch.fused(p, x))
    assert torch.equal(dispatch.fused(p, x, "palette_gemm_xs"), dispatch.fused(p, x))
    assert torch.equal(dispatch.fused(p, x, "palette_gemm_wg"), dispatch.fused(p, x))
    # the GEMV (batch 1..4 on CUDA) is the same reference on CPU
    assert torch.equal(dispatch.fused(p, x[:3], "palette_gemv"), dispatch.fused(p, x[:3]))
    with pytest.raises(ValueError, match="no fused kernel"):
        dispatch.fused(p, x, "palette_gemm_fast")


def test_decoder_variants_are_set_by_name_and_restored():
    """use_decoders switches the CUDA decoder variant the decode passes to its op (the CPU ops
    ignore it: the same bits) and gives back the setting to restore."""
    w, pieces = _stack(("huffman", "palette", "huffman"))
    prev = dispatch.use_decoders(huffman="ahead2", palette="wide")
    try:
        assert dispatch._DECODERS == {"huffman": 3, "palette": 2}
        assert torch.equal(dispatch.decode_new(pieces, 80, 96), w)
        with pytest.raises(ValueError, match="unknown huffman decoder"):
            dispatch.use_decoders(huffman="fast")
        with pytest.raises(ValueError, match="unknown palette decoder variant"):
            dispatch.use_decoders(palette=9)
    finally:
        dispatch.use_decoders(**prev)
    assert dispatch._DECODERS == {"huffman": 0, "palette": 0}


def test_policy_picks_each_pieces_decoder_and_use_decoders_overrides_it(monkeypatch):
    """decode_into asks the policy for each piece's decoder variant (the CPU ops ignore it:
    the same bits); a variant fixed by use_decoders wins over the policy's; no policy gives 0,
    the extension's default.  The linear's decode asks the same policy."""
    w, pieces = _stack(("huffman", "palette", "huffman"))
    asked = []
    policy = DispatchPolicy(None)

    def decoder(p, device):
        asked.append(p.encoding_name)
        return 3 if p.is_huffman else 2
    monkeypatch.setattr(policy, "decoder", decoder)
    assert [dispatch.decoder_variant(p, p.device, policy) for p in pieces] == [3, 2, 3]
    assert [dispatch.decoder_variant(p, p.device, None) for p in pieces] == [0, 0, 0]
    prev = dispatch.use_decoders(huffman="chain")
    try:
        assert [dispatch.decoder_variant(p, p.device, policy) for p in pieces] == [1, 2, 1]
    finally:
        dispatch.use_decoders(**prev)
    asked.clear()
    assert torch.equal(dispatch.decode_new(pieces, 80, 96, policy), w)
    assert asked == ["huffman", "palette", "huffman"]
    asked.clear()
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    assert torch.equal(dispatch.linear(pieces, x, None, 80, 96, policy), F.linear(x, w))
    assert asked == ["huffman", "palette", "huffman"]


@pytest.mark.parametrize("x_shape", [(5, 96), (2, 3, 96)])
def test_backward_through_a_compressed_linear(x_shape):
    """Autograd through decode-into-scratch: the gradients of x and the bias are the dense
    layer's, bit for bit, though later layers overwrite the scratch before the backward."""
    w, pieces = _stack(("huffman", "palette", "huffman"))
    out_rows = w.shape[0]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*x_shape, generator=g).to(torch.bfloat16).requires_grad_()
    b = torch.randn(out_rows, generator=g).to(torch.bfloat16).requires_grad_()
    y = dispatch.linear(pieces, x, b, out_rows, 96)
    other = _stack(("palette",) * 3)[1]
    dispatch.linear(other, torch.randn(1, 96, dtype=torch.bfloat16), None, out_rows, 96)  # reuses the scratch
    gy = torch.randn(y.shape, generator=g).to(torch.bfloat16)
    y.backward(gy)
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    y2 = F.linear(x2, w, b2)
    y2.backward(gy)
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad) and torch.equal(b.grad, b2.grad)


class _PickPolicy(DispatchPolicy):
    """Picks a fused path for the pieces with the given row counts (the table's per-shape
    choice), decode + GEMM for the rest; records refusals."""

    def __init__(self, fused_rows):
        super().__init__(None)
        self.fused_rows, self.refused = set(fused_rows), []

    def linear_path(self, w, M, device):
        return "palette_gemm" if w.rows in self.fused_rows else dispatch.DECODE_CUBLAS

    def refuse(self, w, M, device, path, reason):
        self.refused.append((w.rows, path, reason))


@pytest.mark.parametrize("fused_rows", [(48,), (16,), (48, 16), ()])
def test_each_piece_of_a_merged_layer_takes_its_own_path(monkeypatch, fused_rows):
    # A merged projection (vLLM's q/k/v) whose pieces the policy sends different ways: the
    # fused kernel for some, decode + GEMM for the others, outputs side by side, bias sliced.
    # The CPU has no fused kernel: a stand-in computes the piece's product in fp32.
    w, pieces = _stack(("palette", "palette", "palette"))  # rows 48, 16, 16
    calls = []

    def fake_fused(p, x2, path):
        calls.append((p.rows, path, tuple(x2.shape)))
        if p.rows == 16 and p is pieces[2]:
            raise RuntimeError("refused by the launcher")  # the last piece's kernel refuses
        return (x2.float() @ dispatch.decode_new([p], p.rows, p.cols).float().t()).to(torch.bfloat16)

    monkeypatch.setattr(dispatch, "fused", fake_fused)
    policy = _PickPolicy(fused_rows)
    x = torch.randn(2, 3, 96, dtype=torch.bfloat16)
    b = torch.randn(80, dtype=torch.bfloat16)
    y = dispatch.linear(pieces, x, b, 80, 96, policy)
    if not fused_rows:  # every piece decodes: the whole layer in one GEMM, the BF16 model's bits
        assert calls == [] and torch.equal(y, F.linear(x, w, b))
        return
    want, r = [], 0
    for p in pieces:
        wp, bp = w[r:r + p.rows], b[r:r + p.rows]
        if p.rows in fused_rows and p is not pieces[2]:
            want.append((x.reshape(6, 96).float() @ wp.float().t()).to(torch.bfloat16) + bp)
        else:
            want.append(F.linear(x.reshape(6, 96), wp, bp))
        r += p.rows
    assert torch.equal(y, torch.cat(want, dim=-1).view(2, 3, 80))
    assert [c[0] for c in calls] == [p.rows for p in pieces if p.rows in fused_rows]
    assert all(c[2] == (6, 96) for c in calls)
    assert policy.refused == ([(16, "palette_gemm", "refused by the launcher")] if 16 in fused_rows else [])


class _ForcedPolicy(DispatchPolicy):
    """Every palette weight takes `path` on any device: the dispatch a CUDA forward runs (plan
    sizes, the scratch's workspace and counters, the op), with the ops' CPU kernels standing in
    for CUDA's."""

    def __init__(self, path):
        super().__init__(None)
        self.path = path

    def linear_path(self, w, M, device):
        return dispatch.DECODE_CUBLAS if w.is_huffman else self.path


@pytest.mark.parametrize("order", ["file", "tiled"])
@pytest.mark.parametrize("path", ["palette_gemm", "palette_gemm_xs", "palette_gemv_mma", "palette_gemv_mma_queue"])
def test_fused_dispatch_compiles_whole(path, order):
    """The fused dispatch traces as one graph under torch.compile (aot_eager: dynamo, then the
    functionalization of the ops' workspace and counter arguments) and gives its eager bits."""
    from unweight.runtime.modules import CompressedLinear
    torch.manual_seed(0)
    lins = [torch.nn.Linear(128, 192, bias=False), torch.nn.Linear(192, 128, bias=True)]
    mods = []
    for lin in lins:
        lin = lin.to(torch.bfloat16)
        torch.nn.init.normal_(lin.weight, std=0.02)
        m = CompressedLinear.from_linear(lin, "palette")
        m.policy = _ForcedPolicy(path)
        m.set_plane_order(order)
        mods.append(m)
    assert mods[0].plane_order == order
    net = torch.nn.Sequential(mods[0], torch.nn.SiLU(), mods[1])
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        want = net(x)
        torch._dynamo.reset()
        from torch._dynamo.utils import counters
        counters.clear()
        got = torch.compile(net, backend="aot_eager", fullgraph=True)(x)
        assert sum(counters["graph_break"].values()) == 0 and counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
    assert torch.equal(got, want)
