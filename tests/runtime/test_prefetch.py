"""L2 prefetch of the next matmul's weight (unweight/runtime/prefetch.py)."""
import pytest
import torch
import torch.nn as nn

from unweight.runtime import prefetch, siblings
from unweight.runtime.modules import CompressedLinear


def _lin(rows, cols, seed, enc="palette"):
    torch.manual_seed(seed)
    lin = nn.Linear(cols, rows, bias=False).to(torch.bfloat16)
    nn.init.normal_(lin.weight, std=0.02)
    return CompressedLinear.from_linear(lin, enc)


class _Block(nn.Module):
    """q/k/v (stackable), o, an MLP's up and a huffman down: five matmul launches unstacked."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = _lin(64, 64, 1), _lin(32, 64, 2), _lin(32, 64, 3)
        self.o_proj = _lin(64, 64, 4)
        self.up = _lin(128, 64, 5)
        self.down = _lin(64, 128, 6, "huffman")

    def forward(self, x):
        a = self.q_proj(x) + torch.cat([self.k_proj(x), self.v_proj(x)], -1)
        h = self.o_proj(a)
        return self.down(torch.relu(self.up(h)))


class _Recording(prefetch.L2Prefetch):
    """The prefetcher with its device work recorded instead of launched."""

    def __init__(self, budget):
        super().__init__("cpu", budget)
        self.launched, self.joins = [], 0

    def _launch(self, planes):
        self.launched.append(tuple(t.numel() for t in planes))

    def _join(self):
        self.joins += 1


def _attach(model, budget):
    mods = [m for m in model.modules() if isinstance(m, CompressedLinear)]
    pf = _Recording(budget)
    handles = [model.register_forward_pre_hook(pf.start), model.register_forward_hook(pf.end)]
    for m in mods:
        m.__dict__["_uw_prefetch"] = pf
    return pf, handles


def test_each_matmul_prefetches_the_next_ones_weight():
    b = _Block()
    pf, _ = _attach(b, budget=1 << 30)
    x = torch.randn(2, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = b(x)  # the first forward records the order and prefetches nothing
        assert [type(k).__name__ for k in pf.order] == ["CompressedLinear"] * 6 and pf.launched == []
        assert pf.order == [b.q_proj, b.k_proj, b.v_proj, b.o_proj, b.up, b.down]
        got = b(x)
    # after q: k's planes (sm 32x64, idx 32x32), after k: v's, after v: o's, after o: up's;
    # after up: down is huffman (its matmul reads the decoded scratch): nothing
    assert pf.launched == [(2048, 1024), (2048, 1024), (4096, 2048), (8192, 4096)]
    assert pf.joins == 1 and torch.equal(got.view(torch.int16), want.view(torch.int16))
    with torch.no_grad():
        b.up(torch.randn(2, 64).to(torch.bfloat16))  # outside the model's forward: no effect
    assert len(pf.launched) == 4 and pf.joins == 1


def test_stacked_siblings_are_one_matmul_and_the_budget_holds():
    b = _Block()
    siblings.merge_siblings(b)
    pf, _ = _attach(b, budget=5000)  # o (6 KB of planes) and up (12 KB) do not fit
    x = torch.randn(2, 64).to(torch.bfloat16)
    with torch.no_grad():
        b(x)
        assert pf.order == [b.q_proj.__dict__["_uw_group"], b.o_proj, b.up, b.down]
        b(x)
    assert pf.launched == [] and pf.joins == 0
    pf.budget = 1 << 30
    with torch.no_grad():
        b(x)
    assert pf.launched == [(4096, 2048), (8192, 4096)]  # after the stack: o; after o: up


def test_another_call_order_stops_the_prefetches_of_that_forward():
    b = _Block()
    pf, _ = _attach(b, budget=1 << 30)
    x = torch.randn(2, 64).to(torch.bfloat16)
    with torch.no_grad():
        b(x)
        order = list(pf.order)
        pf.order = [order[1], order[0]] + order[2:]  # as if the first forward had called k before q
        b(x)
    assert pf.launched == [] and pf.joins == 0


def test_prepare_attaches_only_on_one_cuda_device(llama_ck, caplog):
    import unweight
    from unweight.runtime import prepare
    _, ck = llama_ck
    m = unweight.load(ck["palette"], device="cpu", mode="palette")
    with caplog.at_level("WARNING", logger="unweight"):
        info = prepare.prepare(m, "palette", l2_prefetch=True)
    assert info["l2_prefetch_bytes"] == 0 and "_uw_l2_prefetch" not in m.__dict__
    assert "L2 prefetch needs every compressed matmul on one CUDA device" in caplog.text
    with caplog.at_level("WARNING", logger="unweight"):
        m = unweight.load(ck["palette"], device="cpu", mode="palette", l2_prefetch=True)
    assert m.unweight_info["l2_prefetch_bytes"] == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_prefetch_in_a_captured_forward():
    """On the GPU: the prefetches fork and join inside a CUDA-graph capture, and the outputs are
    the ones without them (a prefetch changes nothing)."""
    from unweight import ops
    from unweight.runtime import prepare as prep
    if not ops.cuda_kernels_built():
        pytest.skip("unweight._cuda not built")
    b = _Block().cuda()
    for m in b.modules():
        if isinstance(m, CompressedLinear):
            prep.prepare_module(m)
    x = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        want = b(x)
        pf = prefetch.attach(b, [m for m in b.modules() if isinstance(m, CompressedLinear)], "cuda")
        b(x)  # records the order
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = b(x)
        g.replay()
        torch.cuda.synchronize()
    assert pf.issued >= 4 and torch.equal(got, want)
    prefetch.detach(b)
    assert "_uw_prefetch" not in b.q_proj.__dict__
