"""Sibling projections stacked into one palette matrix (unweight/runtime/siblings.py)."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import unweight
from unweight.runtime import dispatch, prepare, siblings
from unweight.runtime import tuning_table as tt
from unweight.runtime.modules import CompressedLinear, compressed_modules


def _bits(t):
    return t.detach().contiguous().view(torch.int16)


def _linear(rows, cols, std, special=False, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(cols, rows, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(rows, cols, generator=g) * std)
        if special:  # NaN payloads, infinities, subnormals, signed zeros, huge and tiny exponents
            w = lin.weight.view(torch.int16)
            w[0, :10] = torch.tensor([0x7FC1, -127, 0x7F80, -128, 0x0001, -32767, 0, -32768, 0x7F7F, 0x0080],
                                     dtype=torch.int16)
        if bias:
            lin.bias.copy_(torch.randn(rows, generator=g))
    return lin


class _Attn(nn.Module):
    """q/k/v of one input, with palettes far apart (k's weights 100x q's, v's 1/1000)."""

    def __init__(self, cols=128, bias=False):
        super().__init__()
        self.q_proj = CompressedLinear.from_linear(_linear(48, cols, 0.02, special=True, bias=bias, seed=1), "palette")
        self.k_proj = CompressedLinear.from_linear(_linear(16, cols, 2.0, bias=bias, seed=2), "palette")
        self.v_proj = CompressedLinear.from_linear(_linear(32, cols, 2e-5, bias=bias, seed=3), "palette")

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def _dense(mods):
    return [m.decode_weight() for m in mods]


@pytest.mark.parametrize("bias", [False, True])
def test_stacked_members_keep_their_weights_and_outputs(bias):
    a = _Attn(bias=bias)
    mods = [a.q_proj, a.k_proj, a.v_proj]
    want = _dense(mods)
    x = torch.randn(3, 5, 128).to(torch.bfloat16)
    with torch.no_grad():
        ref = a(x)
    assert len({tuple(m.palette) for m in mods}) == 3  # three different palettes before
    out = siblings.merge_siblings(a)
    assert out["groups"] == [["q_proj", "k_proj", "v_proj"]] and not out["skipped"]
    g = a.q_proj.__dict__["_uw_group"]
    assert len({tuple(m.palette) for m in mods}) == 1 and g.w.rows == 96 and g.w.vpos.numel() > 0
    # one storage for the stacked planes, each member's rows a view of it
    assert len({m.weight__sm.untyped_storage().data_ptr() for m in mods}) == 1
    assert a.q_proj.weight__sm.untyped_storage().nbytes() == 96 * 128  # held once
    for m, w in zip(mods, want):
        assert torch.equal(_bits(m.decode_weight()), _bits(w))
    stacked = dispatch.decode_new([g.w], g.w.rows, g.w.cols)
    assert torch.equal(_bits(stacked), _bits(torch.cat(want)))
    with torch.no_grad():
        got = a(x)
    for y, r in zip(got, ref):  # decode + GEMM: member by member, the original bits
        assert y.shape == r.shape and torch.equal(_bits(y), _bits(r))
    assert g.intact() and g._stash is None  # every output handed out


def test_a_member_called_on_another_input_runs_alone():
    a = _Attn()
    x, x2 = (torch.randn(4, 128).to(torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        want_k2 = a.k_proj(x2)
        want_k = a.k_proj(x)
        siblings.merge_siblings(a)
        q = a.q_proj(x)
        assert torch.equal(_bits(a.k_proj(x2)), _bits(want_k2))  # not the stashed output of x
        assert torch.equal(_bits(a.k_proj(x)), _bits(want_k))
        x.add_(1)  # in place: the stash of x's old value must not be used
        a.q_proj(x)
        want_v = torch.nn.functional.linear(x, a.v_proj.decode_weight())
        assert torch.equal(_bits(a.v_proj(x)), _bits(want_v))
        assert q.shape == (4, 48)


def test_tracked_inputs_and_inference_tensors_run_each_member_alone():
    a = _Attn(bias=True)
    siblings.merge_siblings(a)
    x = torch.randn(2, 128).to(torch.bfloat16).requires_grad_()
    y = sum(t.float().sum() for t in a(x))
    y.backward()
    assert x.grad is not None and a.q_proj.__dict__["_uw_group"]._stash is None
    with torch.inference_mode():
        xi = torch.randn(2, 128).to(torch.bfloat16)
        ys = a(xi)
    with torch.no_grad():
        want = a(xi.clone())
    assert all(torch.equal(_bits(p), _bits(q)) for p, q in zip(ys, want))


def test_a_traced_forward_runs_each_member_alone(monkeypatch):
    """Inside a torch.compile trace the group keeps no stash (Python state a graph cannot hold):
    every member runs its own forward, so a compiled model is the unstacked compiled model."""
    a = _Attn()
    siblings.merge_siblings(a)
    seen = []
    real = dispatch.linear_group
    monkeypatch.setattr(dispatch, "linear_group", lambda *args: (seen.append(1), real(*args))[1])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(2, 128).to(torch.bfloat16)
    with torch.no_grad():
        got = a(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    with torch.no_grad():
        want = a(x)
    assert len(seen) == 1  # the eager forward only
    assert all(torch.equal(_bits(p), _bits(q)) for p, q in zip(got, want))


def test_a_changed_member_ends_its_group():
    a = _Attn()
    x = torch.randn(2, 128).to(torch.bfloat16)
    siblings.merge_siblings(a)
    g = a.q_proj.__dict__["_uw_group"]
    with torch.no_grad():
        want = a(x)
    assert a.k_proj.set_plane_order("tiled")  # in place on its rows of the stacked planes
    assert not g.intact()
    with torch.no_grad():
        got = a(x)
    assert "_uw_group" not in a.q_proj.__dict__ and "_uw_group" not in a.k_proj.__dict__
    assert all(torch.equal(_bits(p), _bits(q)) for p, q in zip(got, want))


def test_the_fused_branch_slices_one_product(monkeypatch):
    """linear_group's fused branch (CUDA only) with a reference product in the kernel's place:
    one call on the stacked weight, column views for the members, each bias added to its own."""
    a = _Attn(bias=True)
    siblings.merge_siblings(a)
    g = a.q_proj.__dict__["_uw_group"]
    calls = []

    class _Fused(dispatch._DECODE_ONLY.__class__):
        def linear_path(self, w, M, device):
            return tt.PALETTE_GEMV_MMA

    def fake_fused(w, x2, path):
        calls.append((w.rows, tuple(x2.shape), path))
        return x2 @ dispatch.decode_new([w], w.rows, w.cols).T

    pol = _Fused(None)
    x = torch.randn(2, 3, 128).to(torch.bfloat16)
    monkeypatch.setattr(dispatch, "fused", fake_fused)
    outs = dispatch.linear_group(g.w, x, g.rows, [m.bias for m in g.members], pol)
    assert calls == [(96, (6, 128), tt.PALETTE_GEMV_MMA)]
    full = x.reshape(6, 128) @ torch.cat(_dense(g.members)).T
    r = 0
    for o, m in zip(outs, g.members):
        assert o.shape == (2, 3, m.n_rows)
        assert torch.equal(_bits(o), _bits((full[:, r:r + m.n_rows] + m.bias).view(2, 3, -1)))
        r += m.n_rows


def test_a_loaded_llama_stacks_its_projections(llama_ck):
    """unweight.load(merge_siblings=True): each layer's gate/up stacked, the logits the
    unstacked model's bit for bit (decode + GEMM on this CPU), in file and tile-major order;
    a state-dict load ends the groups and restores the checkpoint's planes."""
    _, ck = llama_ck
    ids = torch.tensor([[1, 5, 9, 33, 200]])
    ref = unweight.load(ck["palette"], device="cpu", mode="palette")
    with torch.no_grad():
        want = ref(ids).logits
    for order in ("file", "tiled"):
        m = unweight.load(ck["palette"], device="cpu", mode="palette", plane_order=order, merge_siblings=True)
        # (gate, up) x 2 layers; this model's k and v (32 x 64) are too small to be compressed
        assert m.unweight_info["sibling_groups"] == 2
        mods = dict(compressed_modules(m))
        assert all("_uw_group" in mods[f"model.layers.{i}.mlp.{p}_proj"].__dict__ for i in (0, 1)
                   for p in ("gate", "up"))
        with torch.no_grad():
            assert torch.equal(_bits(m(ids).logits), _bits(want))
        rmods = dict(compressed_modules(ref))
        for n, x in mods.items():
            assert torch.equal(_bits(x.decode_weight()), _bits(rmods[n].decode_weight())), n
    m.load_state_dict(ref.state_dict())
    with torch.no_grad():
        assert torch.equal(_bits(m(ids).logits), _bits(want))
    assert not any("_uw_group" in x.__dict__ for _, x in compressed_modules(m))
    assert ref.unweight_info["sibling_groups"] == 0  # the default, "auto": nothing measured on a CPU
    with pytest.raises(unweight.InputError, match="merge_siblings"):
        unweight.load(ck["palette"], device="cpu", merge_siblings="yes")
    with pytest.raises(ValueError, match="merge_siblings"):
        prepare.prepare(m, "palette", merge_siblings="always")


def test_groups_it_cannot_stack_are_left_as_they_are(llama_ck):
    _, ck = llama_ck
    m = unweight.load(ck["huffman"], device="cpu", mode="huffman", merge_siblings=True)
    assert m.unweight_info["sibling_groups"] == 0
    out = siblings.merge_siblings(m)
    assert not out["groups"] and set(out["skipped"].values()) == {"not every member is palette-encoded"}
    a = _Attn()
    a.k_proj = CompressedLinear.from_linear(_linear(16, 64, 0.02), "palette")
    assert siblings.merge_siblings(a)["skipped"] == {"": "the members differ in columns or device"}
    b = _Attn()
    siblings.merge_siblings(b)
    assert siblings.merge_siblings(b)["skipped"] == {"": "a member is in a group already"}
    assert np.all([x.plane_order == "file" for x in (b.q_proj, b.k_proj, b.v_proj)])


def test_stack_weights_takes_pieces_in_any_order():
    """A vLLM merged layer's pieces (runtime.siblings.stack_weights): tile-major, paired-palette
    and file-order pieces under three palettes give one file-order weight of their rows."""
    from unweight.runtime.weights import hold_paired
    from unweight.ops import layout as ops_layout
    a = _Attn()
    ws = [m.encoded() for m in (a.q_proj, a.k_proj, a.v_proj)]
    want = torch.cat(_dense([a.q_proj, a.k_proj, a.v_proj]))
    ws[0].sm, ws[0].idx = ops_layout.tile_palette_planes(ws[0].sm, ws[0].idx)
    ws[0].tiled = True
    ws[2] = hold_paired(ws[2])
    w = siblings.stack_weights(ws)
    assert (w.rows, w.cols, w.tiled, w.is_huffman) == (96, 128, False, False)
    assert torch.equal(_bits(dispatch.decode_new([w], 96, 128)), _bits(want))
    with pytest.raises(ValueError, match="one column count"):
        siblings.stack_weights([ws[0], CompressedLinear.from_linear(_linear(16, 64, 0.02), "palette").encoded()])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("order", ["file", "tiled"])
def test_cuda_stacked_group_on_the_fused_kernels(order):
    """On the GPU: the stack re-encoded by the device passes (ops.transcode.encode_palette) with
    the members' paired palette and plane order; decode + GEMM gives each member's own bits,
    the tensor-core GEMV (forced) one launch over the stack within bf16 rounding of them, in a
    CUDA graph too."""
    from unweight import ops
    from unweight.runtime import scratch
    from unweight.runtime.policy import DispatchPolicy
    if not ops.cuda_kernels_built():
        pytest.skip("unweight._cuda not built")

    class Forced(DispatchPolicy):
        def linear_path(self, w, M, device):
            return tt.PALETTE_GEMV_MMA if M <= 32 else tt.DECODE_CUBLAS

    a = nn.Module()
    a.q_proj = CompressedLinear.from_linear(_linear(512, 1024, 0.02, seed=1).cuda(), "palette")
    a.k_proj = CompressedLinear.from_linear(_linear(128, 1024, 0.5, seed=2).cuda(), "palette")
    a.v_proj = CompressedLinear.from_linear(_linear(128, 1024, 0.002, seed=3).cuda(), "palette")
    mods = [a.q_proj, a.k_proj, a.v_proj]
    for m in mods:
        prepare.prepare_module(m)
        m.set_plane_order(order)
    want_w = _dense(mods)
    scratch.reset_device_errors("cuda")
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        ref = [torch.nn.functional.linear(x, w) for w in want_w]
        assert siblings.merge_siblings(a)["groups"]
        assert all(m.plane_order == order and m.palette_order == mods[0].palette_order for m in mods)
        assert all(torch.equal(_bits(m.decode_weight()), _bits(w)) for m, w in zip(mods, want_w))
        got = [m(x) for m in mods]  # decode + GEMM
        assert all(torch.equal(_bits(y), _bits(r)) for y, r in zip(got, ref))
        for m in mods:
            m.policy = Forced(None)
        fused = [m(x) for m in mods]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = [m(x) for m in mods]
        g.replay()
        torch.cuda.synchronize()
    for y, c, r in zip(fused, captured, ref):
        assert torch.equal(_bits(y), _bits(c))
        err = (y.float() - r.float()).abs().max().item()
        assert err <= 0.02 * r.float().abs().max().item() + 1e-3, err
    assert "_uw_group" in a.q_proj.__dict__ and scratch.device_errors("cuda") == 0


def _table_policy(entries):
    """A DispatchPolicy on a table of {(N, K, encoding, bucket): {path: ms}} for device "GPU"."""
    from unweight.runtime.policy import DispatchPolicy
    t = tt.TuningTable()
    for (n, k, enc, M), times in entries.items():
        t.record("GPU", n, k, enc, M, times)
    pol = DispatchPolicy(t)
    pol.device_name = lambda device: "GPU"
    return pol


def test_stack_gain_reads_the_table():
    """DispatchPolicy.stack_gain: members' best times apart over the stack's fused time; a member
    the table never timed counts as its rows' share of the stack's decode + cuBLAS time."""
    cuda = torch.device("cuda", 0)
    pol = _table_policy({(6144, 4096, "palette", 1): {"decode_cublas": 36.0, tt.PALETTE_GEMV_MMA: 18.0},
                         (4096, 4096, "palette", 1): {"decode_cublas": 30.0, tt.PALETTE_GEMV_MMA: 12.0}})
    assert pol.stack_gain([4096, 1024, 1024], 4096, cuda, False) == pytest.approx((12.0 + 2 * 36.0 / 6) / 18.0)
    assert pol.stack_gain([4096, 1024, 1024], 4096, cuda, True) is None  # no tile-major entry
    assert pol.stack_gain([4096, 1024, 1024], 4096, torch.device("cpu"), False) is None
    assert pol.stack_gain([4096, 4096], 4096, cuda, False) is None  # 8192 x 4096 never timed
    slow = _table_policy({(6144, 4096, "palette", 1): {"decode_cublas": 36.0}})
    assert slow.stack_gain([4096, 1024, 1024], 4096, cuda, False) is None  # decode + cuBLAS won there


def test_auto_stacks_only_what_was_measured_faster(monkeypatch):
    from unweight.runtime.policy import DispatchPolicy
    a = _Attn()
    for m in (a.q_proj, a.k_proj, a.v_proj):
        m.policy = DispatchPolicy(None)
    out = siblings.merge_siblings(a, "auto")
    assert not out["groups"] and out["skipped"] == {"": "no fused path measured faster for the stacked shape"}
    monkeypatch.setattr(DispatchPolicy, "stack_gain", lambda self, *args, **kw: 0.9)
    assert siblings.merge_siblings(a, "auto")["skipped"] == {"": "the stack is not measured faster than its members"}
    monkeypatch.setattr(DispatchPolicy, "stack_gain", lambda self, *args, **kw: 1.3)
    assert a.k_proj.set_plane_order("tiled") and a.q_proj.plane_order == "file"

    def broken(ws, policy=None):
        raise unweight.FormatError("no")
    real = siblings.stack_planes
    monkeypatch.setattr(siblings, "stack_planes", broken)
    out = siblings.merge_siblings(a, "auto", plane_order="file")  # a failure in "auto": the members run alone
    assert out["skipped"] == {"": "stacking failed: no"} and a.k_proj.plane_order == "tiled"
    with pytest.raises(unweight.FormatError):
        siblings.merge_siblings(a, "always")
    monkeypatch.setattr(siblings, "stack_planes", real)
    assert siblings.merge_siblings(a, "auto", plane_order="file")["groups"] == [["q_proj", "k_proj", "v_proj"]]
    assert a.k_proj.plane_order == "file"  # the stack's order, on CPU "file" whatever the member held
    with pytest.raises(ValueError, match="when"):
        siblings.merge_siblings(a, "sometimes")
