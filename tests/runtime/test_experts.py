"""runtime/experts.py: the ExpertStack stand-in over per-expert pieces and over a stored stack,
routed bmm, the routed experts forward against transformers' own implementations, the names
transformers' conversion mapping gives checkpoint keys, and the lazy weight of compressed
modules."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.conftest import bf16_gaussian
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import experts as ex
from unweight.runtime import scratch
from unweight.runtime.modules import CompressedEmbedding, CompressedLinear

E, ROWS, COLS = 5, 48, 96


def _bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).view(torch.bfloat16)


def _register(mod: nn.Module, attr: str, enc) -> ex._Planes:
    for suf, a in enc.planes.items():
        mod.register_buffer(attr + suf, torch.from_numpy(np.ascontiguousarray(a)))
    return ex._Planes(mod, attr, enc.header)


def _per_expert_stack(w_gate, w_up, encoding):
    """An ExpertStack over per-expert pieces: expert e = [gate[e]; up[e]] stacked along rows."""
    holder = ex.PlaneHolder()
    sources = []
    for name, w in (("gate", w_gate), ("up", w_up)):
        src = []
        for e in range(w.shape[0]):
            h = ex.PlaneHolder()
            holder.add_module(f"{name}{e}", h)
            src.append(_register(h, "weight", tc.encode(w[e], encoding, threads=1)))
        sources.append(src)
    st = ex.ExpertStack("t.gate_up_proj", (w_gate.shape[0], w_gate.shape[1] + w_up.shape[1], w_gate.shape[2]),
                        torch.bfloat16, sources)
    ex.prepare_planes(st)
    return holder, st


def _stored_stack(w, encoding):
    mod = ex.PlaneHolder()
    st = ex.ExpertStack("t.down_proj", w.shape, torch.bfloat16, [_register(mod, "down_proj", tc.encode(w, encoding,
                                                                                                         threads=1))])
    ex.prepare_planes(st)
    return mod, st


@pytest.fixture
def weights():
    rng = np.random.default_rng(7)
    w = bf16_gaussian(rng, (E, ROWS, COLS))
    w[1, 0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]  # NaN payload, -Inf, subnormal, -0
    w[3, 5, 7] = 0x0003  # a rare exponent: a palette verbatim block in matrix 3
    return w, bf16_gaussian(rng, (E, 16, COLS)), bf16_gaussian(rng, (E, 32, COLS))


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_expert_index_decodes_each_expert_bitwise(weights, encoding):
    w, gate, up = weights
    _, stored = _stored_stack(w, encoding)
    _, fused = _per_expert_stack(gate, up, encoding)
    assert stored.shape == (E, ROWS, COLS) and fused.shape == (E, 48, COLS)
    for e in range(E):
        assert torch.equal(stored[e].view(torch.uint16), torch.from_numpy(w[e]))
        assert torch.equal(stored[torch.tensor(e)].view(torch.uint16), torch.from_numpy(w[e]))
        assert torch.equal(fused[e].view(torch.uint16), torch.from_numpy(np.concatenate([gate[e], up[e]])))
    assert torch.equal(stored[-1].view(torch.uint16), torch.from_numpy(w[-1]))
    with pytest.raises(IndexError):
        stored[E]
    assert torch.equal(stored.materialize().view(torch.uint16), torch.from_numpy(w))
    assert stored.held_bytes() < 0.8 * stored.decoded_bytes()


def test_scratch_slots_keep_two_parameters_apart(weights):
    w = weights[0]
    _, a = _stored_stack(w, "huffman")
    _, b = _stored_stack(w[:, :, ::-1].copy(), "huffman")
    b.slot = ROWS * COLS
    scratch.reserve("cpu", 2 * ROWS * COLS)
    x, y = a[1], b[2]
    assert torch.equal(x.view(torch.uint16), torch.from_numpy(w[1]))  # b's decode did not overwrite a's slot
    assert torch.equal(y.view(torch.uint16), torch.from_numpy(w[2, :, ::-1].copy()))


def test_batched_ids_slices_and_tensor_methods(weights, monkeypatch):
    w, _, _ = weights
    _, st = _stored_stack(w, "huffman")
    dense = _bf16(w)
    seen = []
    orig = ex.ExpertStack.decode_expert
    monkeypatch.setattr(ex.ExpertStack, "decode_expert", lambda s, e, out: seen.append(e) or orig(s, e, out))
    def same(a, b):  # bit patterns: w holds a NaN
        return torch.equal(a.contiguous().view(torch.uint16), b.contiguous().view(torch.uint16))
    ids = torch.tensor([[3, 1], [3, 0]])
    assert same(st[ids], dense[ids])
    assert sorted(seen) == [0, 1, 3]  # each distinct id once
    assert same(st[1:3], dense[1:3])
    assert same(st.transpose(1, 2), dense.transpose(1, 2))
    assert same(torch.cat([st, st]), torch.cat([dense, dense]))
    assert st.size(2) == COLS and st.dim() == 3 and len(st) == E and st.numel() == w.size


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_routed_bmm_decodes_only_experts_with_input(weights, encoding, monkeypatch):
    w, _, _ = weights
    w = w.copy()
    w[1, 0, :4] = 0x3F80  # finite weights: the full product's zero rows are exact zeros
    _, st = _stored_stack(w, encoding)
    x = torch.randn(E, 3, ROWS).to(torch.bfloat16)
    x[0] = 0
    x[2] = -0.0  # negative zeros count as zero input too
    x[4, 1] = 0
    seen = []
    orig = ex.ExpertStack.decode_expert
    monkeypatch.setattr(ex.ExpertStack, "decode_expert", lambda s, e, out: seen.append(e) or orig(s, e, out))
    want = torch.bmm(x, _bf16(w))
    for got in (torch.bmm(x, st), x @ st, torch.matmul(x, st)):
        assert torch.equal(got, want)
    assert seen == [1, 3, 4] * 3


def _experts_module(cls_path: str, config_kwargs: dict, seed: int = 0):
    import importlib

    from transformers import AutoConfig
    mod_name, cls_name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(mod_name), cls_name)
    cfg = AutoConfig.for_model(config_kwargs.pop("model_type"), **config_kwargs)
    m = cls(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return m.to(torch.bfloat16)


@pytest.mark.parametrize("cls_path, cfg", [
    ("transformers.models.mixtral.modeling_mixtral.MixtralExperts",
     dict(model_type="mixtral", hidden_size=64, intermediate_size=32, num_local_experts=6)),
    ("transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts",
     dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, num_local_experts=6)),
])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
def test_routed_forward_is_batched_mm_bitwise(cls_path, cfg, weights_dtype):
    pytest.importorskip("transformers")
    from transformers.integrations.moe import (
        batched_mm_experts_forward,
        grouped_mm_experts_forward,
    )
    m = _experts_module(cls_path, dict(cfg))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 64, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(9)])
    wts = torch.softmax(torch.randn(9, 2, generator=g), -1).to(weights_dtype)
    with torch.no_grad():
        want = batched_mm_experts_forward(m, x, idx, wts)
        assert torch.equal(grouped_mm_experts_forward(m, x, idx, wts), want)
        assert torch.equal(ex.routed_experts_forward(m, x, idx, wts), want)
        # an expert-parallel sentinel (id >= num_experts, weight 0) contributes nothing
        idx2, wts2 = idx.clone(), wts.clone()
        idx2[0, 1], wts2[0, 1] = 6, 0
        m._is_expert_parallel = True
        assert torch.equal(ex.routed_experts_forward(m, x, idx2, wts2), batched_mm_experts_forward(m, x, idx2, wts2))


def test_hf_renamer_follows_transformers_mapping():
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("mixtral", hidden_size=32, intermediate_size=32, num_local_experts=3,
                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    rename = ex.hf_renamer(model)
    key, f = rename("model.layers.0.block_sparse_moe.experts.2.w3.weight")
    assert key == "model.layers.0.mlp.experts.gate_up_proj"
    assert (f.target, f.source, f.n_sources, f.expert, f.supported) == (key, 1, 2, 2, True)
    key, f = rename("model.layers.0.block_sparse_moe.experts.1.w2.weight")
    assert (key, f.source, f.n_sources, f.expert) == ("model.layers.0.mlp.experts.down_proj", 0, 1, 1)
    # plane keys are only renamed: a converter's pattern ends on a name boundary
    assert rename("model.layers.0.block_sparse_moe.experts.2.w3.weight__sm") == (
        "model.layers.0.mlp.experts.2.w3.weight__sm", None)
    assert rename("model.layers.0.block_sparse_moe.gate.weight") == ("model.layers.0.mlp.gate.weight", None)
    assert ex.hf_renamer(nn.Linear(2, 2))("a.weight") == ("a.weight", None)


def test_whole_names_keeps_plane_keys_out_of_unanchored_converters():
    """transformers before 5.21 compiles a converter's sources without a name boundary, so
    ``experts.*.w2.weight`` also matched ``experts.0.w2.weight__hdr``; whole_names adds the
    boundary to branches ending in a name character only, in place, once."""
    import re

    class Transform:  # the one attribute whole_names reads and replaces
        def __init__(self, pattern):
            self.compiled_sources = re.compile(pattern)

    conv = Transform(r"(?P<g0>experts\..*\.w1\.weight)|(?P<g1>experts\..*\.w2\.weight)")
    renaming = Transform(r"(?P<g0>\.block_sparse_moe\.)")
    prefixing = Transform(r"(?P<g0>^model\.(.+))")
    before = [t.compiled_sources.pattern for t in (renaming, prefixing)]
    assert conv.compiled_sources.search("m.experts.0.w2.weight__hdr")  # the 5.17 behaviour
    assert ex.whole_names([conv, renaming, prefixing, object()])[0] is conv
    rx = conv.compiled_sources
    assert rx.search("m.experts.0.w2.weight__hdr") is None and rx.search("m.experts.0.w1.weight__sm") is None
    m = rx.search("m.experts.0.w2.weight")
    assert m and m.lastgroup == "g1" and m.group(0) == "experts.0.w2.weight"
    assert [t.compiled_sources.pattern for t in (renaming, prefixing)] == before
    ex.whole_names([conv])
    assert conv.compiled_sources.pattern == rx.pattern  # idempotent (transformers >= 5.21 is left as is)


def test_ensure_holder_and_dense_conversion(weights):
    _, gate, up = weights
    root = nn.Module()
    root.experts = nn.Module()
    root.experts.gate_up_proj = nn.Parameter(torch.empty(E, 48, COLS, dtype=torch.bfloat16))
    made = []
    src = []
    for name, w in (("gate_proj", gate), ("up_proj", up)):
        per = []
        for e in range(E):
            h, created = ex.ensure_holder(root, f"experts.{e}.{name}")
            made += created
            per.append(_register(h, "weight", tc.encode(w[e], "huffman", threads=1)))
        src.append(per)
    assert "experts.0" in made and "experts.0.gate_proj" in made and made.count("experts.0") == 1
    st = ex.ExpertStack("experts.gate_up_proj", (E, 48, COLS), torch.bfloat16, src)
    del root.experts._parameters["gate_up_proj"]
    root.experts.gate_up_proj = st
    assert ex.expert_stacks(root)[0][3] is st
    ex.to_dense(root, root.experts, "gate_up_proj", st, made)
    p = root.experts.gate_up_proj
    assert isinstance(p, nn.Parameter) and list(root.experts.children()) == []
    want = np.concatenate([gate, up], axis=1)
    assert torch.equal(p.detach().view(torch.uint16), torch.from_numpy(want))
    with pytest.raises(Exception, match="not a module"):
        root.experts.x = 1
        ex.ensure_holder(root, "experts.x.y")


def test_transcode_keeps_every_expert(weights):
    w, _, _ = weights
    _, st = _stored_stack(w, "huffman")
    ex.transcode(st, "palette")
    ex.prepare_planes(st)
    assert st.encodings() == {"palette"} and st.planes()[0].header.stack == E
    for e in range(E):
        assert torch.equal(st[e].view(torch.uint16), torch.from_numpy(w[e]))


def test_compressed_modules_have_a_lazy_weight(monkeypatch):
    torch.manual_seed(0)
    emb = CompressedEmbedding.from_embedding(nn.Embedding(300, 64).to(torch.bfloat16))
    lin = CompressedLinear.from_linear(nn.Linear(64, 96).to(torch.bfloat16))
    calls = []
    monkeypatch.setattr(CompressedEmbedding, "decode_weight",
                        lambda self: calls.append(1) or CompressedLinear.decode_weight(self))
    assert emb.weight.device.type == "cpu" and emb.weight.dtype == torch.bfloat16
    assert emb.weight.shape == (300, 64) and calls == []  # nothing decoded for shape/dtype/device
    assert torch.equal(emb.weight[3], emb(torch.tensor([3]))[0]) and calls == [1]
    assert torch.equal(lin.weight.t().contiguous(), lin.decode_weight().t().contiguous())
    assert C.SUFFIX_SM not in dict(lin.named_parameters())


@pytest.mark.parametrize("encoding", ["huffman", "huffman+index", "palette"])
def test_cuda_kernel_logic_decodes_one_expert_from_its_views(weights, encoding):
    # What the runtime hands the CUDA decode ops for expert e of a stack (absolute offsets into
    # the shared stream; the rows of the load index for its segments; palette block ids
    # rebased to the matrix), run through the kernels' host emulation.
    cu = pytest.importorskip("unweight._cuda")
    w, _, _ = weights
    _, st = _stored_stack(w, encoding.split("+")[0])
    if encoding == "huffman+index":
        # what experts.add_index does to a stack kept on a GPU (S = 16 here: several chains
        # per segment of these small matrices)
        p = st.planes()[0]
        idx = tc.with_index(p.header, {s: t.numpy() for s, t in p.planes().items()}, threads=1, chk_interval=16)
        assert idx.header.chk_interval == 16 and idx.planes[C.SUFFIX_CHK].shape[0] == E * p.header.n_segments
        p.replace(idx.header, idx.planes)
        np.testing.assert_array_equal(tc.decode(idx.header, idx.planes, verify=True), w)
    for e in range(E):
        p = st.pieces(e)[0]
        out = np.empty((ROWS, COLS), dtype=np.uint16)
        if encoding.startswith("huffman"):
            assert int(p.off[0]) > 0 or e == 0
            assert (p.chk is not None) == (encoding == "huffman+index")
            chk = {} if p.chk is None else {"chk": p.chk.numpy(), "S": p.chk_interval}
            nerr = cu.emulate_huffman_decode(p.exp.numpy(), p.off.numpy(), ROWS, COLS, p.rows_per_group,
                                             p.cols_per_chunk, p.table.numpy(), p.exp_lo, p.exp_hi, 0,
                                             -(-ROWS // p.rows_per_group), 0, -(-COLS // p.cols_per_chunk),
                                             p.sm.numpy(), out, **chk)
        else:
            nerr = cu.emulate_palette_decode(p.sm.numpy(), p.idx.numpy(), 0, ROWS, 0, COLS, bytes(p.palette),
                                             p.vpos.numpy(), p.vexp.numpy(), out)
        assert nerr == 0
        np.testing.assert_array_equal(out, w[e])


class _ForcedFused:
    """A policy that runs the tensor-core GEMV (else the GEMM) wherever the kernels take the
    problem, on any device (the measured policy does so only where CUDA timed it faster)."""

    def __init__(self):
        from unweight.runtime.policy import DispatchPolicy
        self.base, self.asked = DispatchPolicy(None), []

    def linear_path(self, w, M, device):
        from unweight.runtime import kernel_plan as kp
        from unweight.runtime.policy import DECODE_CUBLAS, GEMV_PATHS, PALETTE_GEMM, PALETTE_GEMV_MMA
        self.asked.append((w.rows, w.cols, M))
        if w.is_huffman or not kp.pmma_supported(M, w.cols):
            return DECODE_CUBLAS
        return PALETTE_GEMV_MMA if kp.pgemv_supported(M, w.cols, GEMV_PATHS[PALETTE_GEMV_MMA]) else PALETTE_GEMM

    def __getattr__(self, name):  # decoder choice, dense GEMM, refusals: the plain policy's
        return getattr(self.base, name)


def test_fused_linear_runs_the_policys_kernel_on_the_compressed_expert():
    """ExpertStack.fused_linear: x @ W_e^T through the kernel the policy picks for expert e's
    pieces (bitwise what that kernel gives on the piece), or None (decode as before) without a
    policy, for a Huffman stack, a non-bf16 x or one autograd tracks."""
    from unweight.runtime import dispatch
    rng = np.random.default_rng(3)
    w = bf16_gaussian(rng, (E, ROWS, 128))
    w[2, 1, 5] = 0x0003  # a verbatim block in matrix 2
    _, st = _stored_stack(w, "palette")
    x = torch.randn(3, 128).to(torch.bfloat16)
    assert st.fused_linear(2, x) is None  # no policy
    st.policy = _ForcedFused()
    for e in (2, -1):
        got = st.fused_linear(e, x)
        want = dispatch.fused(st.pieces(e % E)[0], x, "palette_gemv_mma")
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert st.policy.asked[-1] == (ROWS, 128, 3)
    assert st.fused_linear(2, x.float()) is None
    with torch.enable_grad():
        assert st.fused_linear(2, x.clone().requires_grad_()) is None
    with pytest.raises(IndexError):
        st.fused_linear(E, x)
    _, hs = _stored_stack(w, "huffman")
    hs.policy = _ForcedFused()
    assert hs.fused_linear(2, x) is None


def test_routed_forward_takes_fused_kernels_where_the_policy_picks_them(monkeypatch):
    """A Mixtral experts module with compressed palette stacks under a policy that picks the
    fused kernels: every routed expert's two projections run them (none is decoded), and the
    output stays within bf16 rounding of batched_mm's."""
    pytest.importorskip("transformers")
    from transformers.integrations.moe import batched_mm_experts_forward
    m = _experts_module("transformers.models.mixtral.modeling_mixtral.MixtralExperts",
                        dict(model_type="mixtral", hidden_size=64, intermediate_size=64, num_local_experts=6))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 64, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(9)])
    wts = torch.softmax(torch.randn(9, 2, generator=g), -1)
    with torch.no_grad():
        want = batched_mm_experts_forward(m, x, idx, wts)
    holders = []
    for attr in ("gate_up_proj", "down_proj"):
        dense = getattr(m, attr).detach()
        holder, st = _stored_stack(dense.view(torch.uint16).numpy(), "palette")
        st.policy = _ForcedFused()
        holders.append(holder)
        del m._parameters[attr]
        setattr(m, attr, st)
    decoded = []
    orig = ex.ExpertStack.decode_expert
    monkeypatch.setattr(ex.ExpertStack, "decode_expert", lambda s, e, out: decoded.append(e) or orig(s, e, out))
    with torch.no_grad():
        got = ex.routed_experts_forward(m, x, idx, wts)
    assert decoded == []
    routed = torch.unique(idx).tolist()
    counts = [int((idx == e).sum()) for e in routed]
    for st, rows, cols in ((m.gate_up_proj, 128, 64), (m.down_proj, 64, 64)):
        # each routed expert's batch: asked by fused_linear, then by dispatch.linear
        assert sorted(set(st.policy.asked)) == sorted({(rows, cols, n) for n in counts})
        assert len(st.policy.asked) == 2 * len(routed)
    assert got.dtype == want.dtype and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("per_expert", [False, True])
def test_paired_palette_order_holds_the_same_experts_and_gives_back_the_stored_bytes(weights, per_expert):
    """hold_paired (what prepare does on CUDA) rewrites each palette tensor's index for its
    reordered palette: every expert decodes to the same bits, the holder's state_dict() gives
    the stored bytes, a state-dict load puts the tensors back as stored, and a transcode
    reads the stored bytes."""
    from unweight import ops
    w, gate, up = weights
    holder, st = _per_expert_stack(gate, up, "palette") if per_expert else _stored_stack(w, "palette")
    want = [st[e].view(torch.uint16).clone() for e in range(E)]
    stored = {k: v.clone() for k, v in holder.state_dict().items()}
    can = [p for p in st.planes() if ops.paired_palette([int(b) for b in p.header.palette[: p.header.pal_size]])]
    assert can  # the writer's order does not pair
    before = [{s: a.copy() for s, a in p.host_planes().items()} for p in st.planes()]
    assert ex.hold_paired(st, True) == len(can) and ex.hold_paired(st, True) == len(can)
    assert all(ops.palette_pairs(p.weight(0 if p.header.stack else None).palette) for p in can)
    held = dict(holder.named_buffers())  # what the kernels read
    assert any(not torch.equal(t, stored[k]) for k, t in held.items() if k.endswith(C.SUFFIX_IDX))
    for p, b in zip(st.planes(), before):  # the CPU codec reads them as stored (load check, transcode)
        assert all(np.array_equal(a, b[s]) for s, a in p.host_planes().items())
    for e in range(E):
        assert torch.equal(st[e].view(torch.uint16), want[e])
    assert all(torch.equal(v, stored[k]) for k, v in holder.state_dict().items())
    holder.load_state_dict(stored)
    assert all(p.paired() is None for p in st.planes())
    for e in range(E):
        assert torch.equal(st[e].view(torch.uint16), want[e])
    ex.hold_paired(st, True)
    ex.transcode(st, "huffman")
    ex.prepare_planes(st)
    assert st.encodings() == {"huffman"} and all(p.paired() is None for p in st.planes())
    for e in range(E):
        assert torch.equal(st[e].view(torch.uint16), want[e])
    assert ex.hold_paired(st) == 0  # huffman, and on the CPU


def test_stack_row_index_is_each_matrixs_own_row_index():
    """The row index a CUDA palette stack holds per matrix (stack_row_index: one search of the
    stack's list) is ops.verbatim_rows of each matrix's own entries, rebased to the matrix."""
    from unweight import ops
    rng = np.random.default_rng(5)
    E, rows, cols = 5, 19, 200  # 7 blocks per row, the last short
    f = (rng.standard_normal((E, rows, cols)) * np.exp2(rng.integers(-20, 20, (E, rows, cols)))).astype(np.float32)
    w = (f.view(np.uint32) >> 16).astype(np.uint16)
    w[2] = 0x3F80  # a matrix with no verbatim block
    enc = tc.encode(w, "palette")
    vpos = enc.planes[C.SUFFIX_VPOS].astype(np.int64)
    got = ex.stack_row_index(torch.from_numpy(vpos), E, rows, cols)
    per = rows * -(-cols // C.PAL_BLOCK)
    assert got.dtype == torch.uint32 and tuple(got.shape) == (E, rows + 1)
    for e in range(E):
        own = vpos[(vpos >= e * per) & (vpos < (e + 1) * per)] - e * per
        want = ops.verbatim_rows(torch.from_numpy(own).to(torch.uint32), rows, cols)
        assert torch.equal(got[e], want), e
    assert got[2].sum() == 0
