"""CompressedLinear / CompressedEmbedding: bitwise equality with nn.Linear / nn.Embedding,
plane buffers, tying, row-group-only embedding decode, scratch reuse."""
import pytest
import torch
import torch.nn as nn

from unweight import ops
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.ops import _ext
from unweight.runtime import prepare, scratch
from unweight.runtime.modules import CompressedEmbedding, CompressedLinear

ENCODINGS = ["huffman", "palette"]


def _linear(n_out, n_in, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(n_in, n_out, bias=bias).to(torch.bfloat16)
    nn.init.normal_(lin.weight, std=0.02)  # trained-weight-like exponents
    return lin


def _embedding(n, k, seed=0):
    torch.manual_seed(seed)
    emb = nn.Embedding(n, k).to(torch.bfloat16)
    nn.init.normal_(emb.weight, std=0.02)
    return emb


@pytest.mark.parametrize("enc", ENCODINGS)
@pytest.mark.parametrize("shape", [(256, 512), (100, 130), (37, 1000), (4096, 64)])
def test_linear_bitwise(enc, shape):
    lin = _linear(*shape)
    cl = CompressedLinear.from_linear(lin, enc)
    assert cl.encoding_name == enc
    assert torch.equal(cl.decode_weight(), lin.weight)
    for x_shape in [(1, shape[1]), (3, 5, shape[1])]:
        x = torch.randn(*x_shape, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(cl(x), lin(x))
    # fp32 input: the weight is cast (the decoded bits are still the original ones)
    x = torch.randn(2, shape[1])
    with torch.no_grad():
        assert torch.equal(cl(x), nn.functional.linear(x, lin.weight.float(), lin.bias.float()))


def test_linear_no_bias_and_state_dict_keys():
    lin = _linear(64, 128, bias=False)
    cl = CompressedLinear.from_linear(lin, "huffman")
    assert cl.bias is None
    keys = set(cl.state_dict())
    assert keys == {"weight" + s for s in tc.planes_for(cl.header)}  # + __chk when indexed
    cp = CompressedLinear.from_linear(lin, "palette")
    assert set(cp.state_dict()) == {"weight" + s for s in C.PALETTE_PLANES}
    assert cl.held_bytes() < 0.7 * cl.decoded_bytes()


@pytest.mark.parametrize("enc", ENCODINGS)
def test_embedding_bitwise(enc):
    emb = _embedding(1000, 96)
    ce = CompressedEmbedding.from_embedding(emb, enc)
    for ids in [torch.tensor([0]), torch.tensor([[5, 999, 0], [17, 17, 300]]), torch.arange(1000)]:
        assert torch.equal(ce(ids), emb(ids))
    with pytest.raises(IndexError):
        ce(torch.tensor([1000]))


def test_embedding_decodes_only_needed_groups(monkeypatch):
    emb = _embedding(4096, 64)
    ce = CompressedEmbedding.from_embedding(emb, "huffman")
    R = ce.rows_per_group
    assert R < 4096
    calls = []
    real = _ext._C

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def huffman_decode(self, *a):
            calls.append((a[9], a[10]))  # g0, g1
            return real.huffman_decode(*a)

    monkeypatch.setattr(_ext, "_C", Spy())
    ids = torch.tensor([3, 3 * R + 1, 3 * R + 2, 4 * R, 4000])
    assert torch.equal(ce(ids), emb(ids))
    groups = sum(g1 - g0 for g0, g1 in calls)
    assert groups == len({int(i) // R for i in ids}) == 3 + (4000 // R != 4)
    assert groups * R < 4096


def test_tied_linear_shares_planes():
    emb = _embedding(512, 64)
    ce = CompressedEmbedding.from_embedding(emb, "huffman")
    head = CompressedLinear.tied_to(ce)
    assert head.held_bytes() == 0 and list(head.state_dict()) == []
    assert head.planes()[C.SUFFIX_SM].data_ptr() == ce.weight__sm.data_ptr()
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert torch.equal(head(x), nn.functional.linear(x, emb.weight))
    # transcoding the source is seen by the tied head
    prepare._transcode(ce, "palette")
    assert head.encoding_name == "palette"
    assert torch.equal(head(x), nn.functional.linear(x, emb.weight))


def test_scratch_is_reused_not_reallocated():
    scratch.release()
    a = CompressedLinear.from_linear(_linear(256, 256), "huffman")
    b = CompressedLinear.from_linear(_linear(128, 256, seed=1), "palette")
    buf = scratch.reserve("cpu", 256 * 256)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    for _ in range(3):
        a(x), b(x)
    assert scratch.weights("cpu", 1) is buf and buf.numel() == 256 * 256


def test_to_dense():
    lin = _linear(64, 256)
    d = CompressedLinear.from_linear(lin, "palette").to_dense()
    assert type(d) is nn.Linear and torch.equal(d.weight, lin.weight) and torch.equal(d.bias, lin.bias)
    emb = _embedding(300, 64)
    e = CompressedEmbedding.from_embedding(emb, "huffman").to_dense()
    assert type(e) is nn.Embedding and torch.equal(e.weight, emb.weight)


def test_transcode_both_ways():
    lin = _linear(200, 192)
    cl = CompressedLinear.from_linear(lin, "huffman")
    prepare._transcode(cl, "palette")
    assert cl.encoding_name == "palette" and set(cl.state_dict()) == {"weight" + s for s in C.PALETTE_PLANES} | {"bias"}
    assert torch.equal(cl.decode_weight(), lin.weight)
    prepare._transcode(cl, "huffman")
    assert cl.encoding_name == "huffman" and torch.equal(cl.decode_weight(), lin.weight)


def test_plane_order_only_for_palette_matmul_weights_and_reset_by_a_new_encoding():
    """set_plane_order("tiled") permutes a palette CompressedLinear of whole 16 x 64 tiles (its
    forward, dense copy and palette -> huffman transcode unchanged), is a no-op elsewhere
    (huffman, odd shapes, embeddings and the head tied to one), and a transcode's new planes
    are file order."""
    lin = _linear(48, 128)
    cl = CompressedLinear.from_linear(lin, "palette")
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    want = cl(x)
    sm = cl.weight__sm.clone()
    assert cl.can_tile() and cl.set_plane_order("tiled") and cl.plane_order == "tiled"
    assert not torch.equal(cl.weight__sm, sm) and not cl.set_plane_order("tiled")
    assert cl.encoded().tiled and torch.equal(cl(x).view(torch.int16), want.view(torch.int16))
    assert torch.equal(cl.decode_weight(), lin.weight) and torch.equal(cl.to_dense().weight, lin.weight)
    prepare._transcode(cl, "huffman")  # from the file-order bytes
    assert cl.plane_order == "file" and torch.equal(cl.decode_weight(), lin.weight)
    assert not cl.set_plane_order("tiled")  # huffman: nothing to permute
    odd = CompressedLinear.from_linear(_linear(40, 128), "palette")
    emb = CompressedEmbedding.from_embedding(_embedding(64, 64), "palette")
    head = CompressedLinear.tied_to(emb)
    for m in (odd, emb, head):
        assert not m.can_tile() and not m.set_plane_order("tiled") and m.plane_order == "file"
    with pytest.raises(ValueError, match="plane order"):
        cl.set_plane_order("columns")


def test_paired_palette_order_holds_the_same_weight_and_gives_back_the_stored_bytes():
    """set_palette_order("paired") rewrites idx for a reordered palette (ops.paired_palette):
    forward, dense copy and row gather unchanged, tile-major on top too; state_dict() and
    host_planes() give the stored bytes, a state-dict load puts the module back in file order,
    "file" undoes it; no-op for huffman and for a head tied to an embedding (the source's order)."""
    lin = _linear(48, 128)
    cl = CompressedLinear.from_linear(lin, "palette")
    assert not ops.palette_pairs(cl.palette)  # the writer's count order
    stored = {k: v.clone() for k, v in cl.state_dict().items()}
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    want = cl(x).view(torch.int16)
    assert cl.set_palette_order("paired") and cl.palette_order == "paired" and not cl.set_palette_order("paired")
    assert ops.palette_pairs(cl.encoded().palette)
    assert cl.palette == [int(b) for b in cl.header.palette[: cl.header.pal_size]]  # the stored palette
    assert not torch.equal(cl.weight__idx, stored["weight__idx"])
    assert torch.equal(cl(x).view(torch.int16), want) and torch.equal(cl.decode_weight(), lin.weight)
    assert torch.equal(torch.from_numpy(cl.host_planes()[C.SUFFIX_IDX]), stored["weight__idx"])
    assert cl.set_plane_order("tiled") and torch.equal(cl(x).view(torch.int16), want)
    assert all(torch.equal(v, stored[k]) for k, v in cl.state_dict().items())
    cl.load_state_dict(stored)
    assert cl.palette_order == "file" and cl.plane_order == "file" and torch.equal(cl(x).view(torch.int16), want)
    assert cl.set_palette_order("paired") and cl.set_palette_order("file")
    assert torch.equal(cl.weight__idx, stored["weight__idx"])
    emb_dense = _embedding(64, 64)
    emb = CompressedEmbedding.from_embedding(emb_dense, "palette")
    head = CompressedLinear.tied_to(emb)
    ids = torch.tensor([[3, 63, 0, 17]])
    xe = torch.randn(2, 64, dtype=torch.bfloat16)
    want_e, want_h = emb(ids), head(xe).view(torch.int16)
    if ops.paired_palette(emb.palette) is not None:
        assert emb.set_palette_order("paired")
    assert not head.set_palette_order("paired") and head.palette_order == emb.palette_order
    assert torch.equal(emb(ids), want_e) and torch.equal(head(xe).view(torch.int16), want_h)
    hl = CompressedLinear.from_linear(lin, "huffman")
    assert not hl.set_palette_order("paired") and hl.palette_order == "file"
    with pytest.raises(ValueError, match="palette order"):
        cl.set_palette_order("sorted")


def test_auto_plane_order_follows_the_policy():
    """set_plane_order("auto") holds a weight in the order its policy names for its shape and
    device (file order without a policy, and for a module that cannot tile)."""
    class Says:
        def __init__(self, order):
            self.order, self.asked = order, []

        def plane_order(self, n, k, device):
            self.asked.append((n, k, str(device)))
            return self.order

    cl = CompressedLinear.from_linear(_linear(48, 128), "palette")
    assert not cl.set_plane_order("auto") and cl.plane_order == "file"  # no policy
    cl.policy = Says("tiled")
    assert cl.set_plane_order("auto") and cl.plane_order == "tiled" and cl.policy.asked == [(48, 128, "cpu")]
    cl.policy = Says("file")
    assert cl.set_plane_order("auto") and cl.plane_order == "file"
    odd = CompressedLinear.from_linear(_linear(40, 128), "palette")
    odd.policy = Says("tiled")
    assert not odd.set_plane_order("auto") and odd.policy.asked == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("enc", ENCODINGS)
def test_cuda_linear_and_embedding_bitwise(enc):
    if not ops.cuda_kernels_built():
        pytest.skip("unweight._cuda not built")
    lin = _linear(1024, 768).cuda()
    scratch.reset_device_errors("cuda")  # the counter is per device: earlier corrupt-input tests add to it
    cl = CompressedLinear.from_linear(lin, enc)
    prepare.prepare_module(cl)
    x = torch.randn(16, 768, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(cl.decode_weight(), lin.weight)
    assert torch.equal(cl(x), lin(x))
    emb = _embedding(4000, 256).cuda()
    ce = CompressedEmbedding.from_embedding(emb, enc)
    prepare.prepare_module(ce)
    ids = torch.randint(0, 4000, (3, 7), device="cuda")
    assert torch.equal(ce(ids), emb(ids))
    assert scratch.device_errors("cuda") == 0


def test_a_state_dict_load_decodes_with_the_loaded_header():
    """Two palette weights of one shape, their palettes different and no verbatim block in
    either (so every plane has the same size): loading one's state dict into the other's module
    must decode with the loaded palette, not the one the module was built with."""
    a, b = _linear(32, 64, bias=False, seed=1), _linear(32, 64, bias=False, seed=2)
    with torch.no_grad():
        b.weight.mul_(64.0)  # every exponent 6 up: another palette
    ca, cb = CompressedLinear.from_linear(a, "palette"), CompressedLinear.from_linear(b, "palette")
    assert ca.palette != cb.palette and ca.weight__vpos.numel() == cb.weight__vpos.numel() == 0
    ca.load_state_dict(cb.state_dict())
    assert ca.palette == cb.palette
    assert torch.equal(ca.decode_weight().view(torch.int16), b.weight.detach().view(torch.int16))


def test_encoded_weight_is_kept_until_the_module_changes():
    """encoded() hands back the same record while it describes the module, and a new one after
    anything that changes what the ops must be given: a state-dict load (another palette), a
    plane order, a transcode, a move; the forward stays bitwise right through each."""
    a, b = _linear(32, 64, bias=False, seed=1), _linear(32, 64, bias=False, seed=2)
    with torch.no_grad():
        b.weight.mul_(64.0)
    cl = CompressedLinear.from_linear(a, "palette")
    x = torch.randn(3, 64, dtype=torch.bfloat16)

    def right(lin):
        with torch.no_grad():
            return torch.equal(cl(x).view(torch.int16), lin(x).view(torch.int16))

    w = cl.encoded()
    assert cl.encoded() is w and right(a)
    cl.load_state_dict(CompressedLinear.from_linear(b, "palette").state_dict())
    w2 = cl.encoded()
    assert w2 is not w and w2.palette == cl.palette and right(b)
    assert cl.set_plane_order("tiled")
    w3 = cl.encoded()
    assert w3 is not w2 and w3.tiled and right(b)
    prepare._transcode(cl, "huffman")
    w4 = cl.encoded()
    assert w4 is not w3 and w4.is_huffman and right(b)
    cl.to("meta")
    assert "_uw_encoded" not in cl.__dict__  # a move lets the old device's planes go at once
    assert cl.encoded().sm.device.type == "meta"
