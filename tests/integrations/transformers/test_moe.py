"""Mixture-of-experts models through unweight.load and AutoModelForCausalLM, every mode, each
checkpoint layout: per-expert 2-D tensors (Qwen3-MoE, Mixtral, DeepSeek-V3) and stacked 3-D
tensors (Llama 4, gpt-oss).  Logits are compared with torch.equal against the BF16 model as
transformers loads it (its default experts implementation); in huffman / palette modes a spy
on the one decode point shows that only the experts the routers picked are decoded."""
import collections
import os

import pytest
import torch

import unweight
from unweight import api
from unweight.format.errors import InputError
from unweight.runtime import experts as ex

from tests.conftest import n_encoded, train_step_grads

transformers = pytest.importorskip("transformers")

COMMON = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
LAYOUTS = {
    # model_type: (config kwargs, how the checkpoint stores the experts)
    "qwen3_moe": (dict(COMMON, head_dim=32, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                       num_experts_per_tok=2), "per-expert"),
    "mixtral": (dict(COMMON, head_dim=32, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
                "per-expert"),
    "deepseek_v3": (dict(COMMON, intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8,
                         num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                         kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32),
                    "per-expert"),
    "llama4_text": (dict(COMMON, head_dim=32, intermediate_size=64, intermediate_size_mlp=128, num_local_experts=4,
                         num_experts_per_tok=1), "stacked"),
    "gpt_oss": (dict(COMMON, head_dim=32, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
                "stacked"),
}
IDS = torch.tensor([[5, 17, 45, 200, 3, 99, 310, 7, 11, 400], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])


def _make(kind: str, folder: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **LAYOUTS[kind][0]))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


class _Models(dict):
    """{kind: (bf16 folder, {encoding: compressed folder}, reference logits)}, each kind made
    on first use (a run of a few tests, e.g. the GPU tier's, makes only theirs)."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, kind):
        from transformers import AutoModelForCausalLM
        src = _make(kind, str(self.root / kind))
        cks = {}
        for enc in ("huffman", "palette"):
            cks[enc] = str(self.root / f"{kind}-{enc}")
            api.compress(src, cks[enc], encoding=enc, progress=False)
        with torch.no_grad():
            ref = AutoModelForCausalLM.from_pretrained(src).eval()(IDS).logits
        self[kind] = (src, cks, ref)
        return self[kind]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return _Models(tmp_path_factory.mktemp("moe"))


class Spy:
    """Records every expert decode (ExpertStack.decode_expert, the one decode point) and every
    routing decision (the experts forward's top_k_index; Llama 4: its router's non-zero scores)."""

    def __init__(self, model, monkeypatch):
        self.decoded = collections.defaultdict(collections.Counter)  # layer -> Counter((param, expert))
        self.routed = collections.defaultdict(set)  # layer -> experts
        orig = ex.ExpertStack.decode_expert
        spy = self

        def decode_expert(stack, e, out):
            layer, _, attr = stack.name.rpartition(".experts.")
            spy.decoded[layer][(attr, e)] += 1
            return orig(stack, e, out)

        monkeypatch.setattr(ex.ExpertStack, "decode_expert", decode_expert)
        for name, mod in model.named_modules():
            if name.endswith(".experts") and hasattr(mod, "has_gate"):
                mod.register_forward_pre_hook(self._experts_hook(name.rpartition(".experts")[0]), with_kwargs=True)
            if name.endswith(".router") and type(mod).__name__ == "Llama4Router":
                mod.register_forward_hook(self._router_hook(name.rpartition(".router")[0]))

    def _experts_hook(self, layer):
        def hook(mod, args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            self.routed[layer] |= {int(e) for e in idx.reshape(-1) if int(e) < mod.num_experts}
        return hook

    def _router_hook(self, layer):
        def hook(mod, args, out):
            scores = out[0]  # [tokens, experts], zero where a token was not routed
            self.routed[layer] |= {int(e) for e in (scores != 0).any(dim=0).nonzero().reshape(-1)}
        return hook


def _load(path, mode):
    return unweight.load(path, device="cpu", mode=mode)


@pytest.mark.parametrize("mode", ["huffman", "palette", "dense", "auto"])
@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_logits_bitwise_and_only_routed_experts_decoded(moe, kind, mode, monkeypatch):
    _, cks, ref = moe[kind]
    model = _load(cks["huffman"], mode)
    info = model.unweight_info["experts"]
    with torch.no_grad():
        logits = model(IDS).logits
    assert torch.equal(logits, ref), f"{kind} {mode}: logits differ from the BF16 model's"
    spy = Spy(model, monkeypatch)
    with torch.no_grad():  # one token: its top-k experts, fewer than all
        model(IDS[:1, :1])
    n_moe_layers = 1 if kind == "deepseek_v3" else 2
    if mode in ("dense", "auto"):  # auto on a CPU with memory to spare: dense
        assert info["stacks"] == 0 and info["dense"] == 2 * n_moe_layers
        assert not ex.expert_stacks(model) and not spy.decoded
        return
    assert info["stacks"] == 2 * n_moe_layers and info["encodings"] == [mode]
    assert set(spy.routed) == set(spy.decoded) and len(spy.routed) == n_moe_layers
    for layer, routed in spy.routed.items():
        assert 0 < len(routed) < model.get_submodule(layer + ".experts").num_experts
        for attr in ("gate_up_proj", "down_proj"):
            got = {e for (a, e) in spy.decoded[layer] if a == attr}
            assert got == routed, f"{layer}.{attr}: decoded {sorted(got)}, router picked {sorted(routed)}"
        assert max(spy.decoded[layer].values()) == 1  # each routed expert decoded once per forward


@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_held_bytes_are_the_compressed_size(moe, kind):
    _, cks, _ = moe[kind]
    model = _load(cks["huffman"], "huffman")
    info = model.unweight_info
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())
               if t.dtype != torch.float32)  # rotary tables are computed, not stored
    stored = sum(os.path.getsize(os.path.join(cks["huffman"], f)) for f in os.listdir(cks["huffman"])
                 if f.endswith(".safetensors"))
    assert held <= stored  # the model holds the checkpoint's planes and raw tensors, nothing decoded
    assert held > 0.95 * (stored - 64 * 1024)  # (less the safetensors headers)
    e = info["experts"]
    assert e["held_bytes"] < 0.7 * e["bf16_bytes"]
    for *_, st in ex.expert_stacks(model):
        assert st.held_bytes() < 0.7 * st.decoded_bytes()


@pytest.mark.parametrize("mode", ["dense", "auto"])
@pytest.mark.parametrize("kind", ["gpt_oss", "llama4_text"])
def test_palette_stacks_decode_whole_without_a_prepared_mode(moe, kind, mode):
    """Dense (and auto on CPU) decode a palette stack matrix by matrix with no mode having
    prepared its verbatim ranges first."""
    _, cks, ref = moe[kind]
    with torch.no_grad():
        assert torch.equal(_load(cks["palette"], mode)(IDS).logits, ref)


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_palette_checkpoint_and_from_pretrained(moe, kind):
    from transformers import AutoConfig, AutoModelForCausalLM
    _, cks, ref = moe[kind]
    cfg = AutoConfig.from_pretrained(cks["palette"])
    cfg.quantization_config["mode"] = "palette"
    model = AutoModelForCausalLM.from_pretrained(cks["palette"], config=cfg)
    assert model.unweight_info["experts"]["encodings"] == ["palette"]
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref)
    huff = _load(cks["palette"], "huffman")  # transcoded at load
    with torch.no_grad():
        assert torch.equal(huff(IDS).logits, ref)


def test_greedy_generation_identical(moe):
    from transformers import AutoModelForCausalLM
    src, cks, _ = moe["qwen3_moe"]
    ref = AutoModelForCausalLM.from_pretrained(src).eval()
    model = _load(cks["huffman"], "huffman")
    a = model.generate(IDS[:1], max_new_tokens=5, do_sample=False)
    assert torch.equal(a, ref.generate(IDS[:1], max_new_tokens=5, do_sample=False))


@pytest.mark.parametrize("mode", ["huffman", "palette"])
@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_backward_through_compressed_experts(moe, kind, mode):
    """Routed experts (Qwen3-MoE) and Llama 4's bmm over the stack: the backward reads each
    expert's own decoded weight, not a scratch slot a later layer overwrote (torch raised
    "modified by an inplace operation", and "mm(): functions with out=..." for the bmm)."""
    src, cks, _ = moe[kind]
    want_loss, want = train_step_grads(transformers.AutoModelForCausalLM.from_pretrained(src), IDS)
    loss, got = train_step_grads(_load(cks["huffman"], mode), IDS)
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_num_parameters_counts_compressed_experts(moe, kind):
    src, cks, _ = moe[kind]
    ref = transformers.AutoModelForCausalLM.from_pretrained(src)
    model = _load(cks["huffman"], "huffman")
    for kw in ({}, {"exclude_embeddings": True}):
        assert model.num_parameters(**kw) == ref.num_parameters(**kw)


def test_eager_implementation_is_kept(moe):
    src, cks, _ = moe["mixtral"]
    model = unweight.load(cks["huffman"], device="cpu", mode="huffman", experts_implementation="eager")
    assert model.unweight_info["experts"]["implementation"] == "eager"
    ref = transformers.AutoModelForCausalLM.from_pretrained(src, experts_implementation="eager")
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_experts_partly_raw_fail_with_one_line(moe, tmp_path):
    src, _, _ = moe["qwen3_moe"]
    dst = str(tmp_path / "mixed")
    api.compress(src, dst, exclude=["*layers.1.mlp.experts.3.up_proj*"], progress=False)
    with pytest.raises(InputError, match="fused from compressed and raw experts") as e:
        _load(dst, "huffman")
    assert "\n" not in str(e.value)


def test_experts_of_another_model_fail_with_one_line(moe):
    from transformers import AutoModelForCausalLM
    cks = moe["qwen3_moe"][1]
    with pytest.raises(InputError) as e:  # 8 experts stored, a model of 4 asked for
        AutoModelForCausalLM.from_pretrained(cks["huffman"], num_experts=4)
    assert "\n" not in str(e.value) and "experts" in str(e.value)


def test_stacked_experts_round_trip_offline(moe, tmp_path):
    from safetensors.torch import load_file
    src, cks, _ = moe["llama4_text"]
    orig = load_file(os.path.join(src, "model.safetensors"))
    for enc, ck in cks.items():
        stacked = [t for t in api.inspect(ck)["tensors"] if len(t["shape"]) == 3]
        assert stacked and all(t["encoding"] == enc for t in stacked)  # stored as format-1.1 stacks
        assert api.verify(ck, against=src)["ok"]
        api.decompress(ck, str(tmp_path / enc), progress=False)
        back = load_file(str(tmp_path / enc / "model.safetensors"))
        assert back.keys() == orig.keys()
        for k, t in orig.items():
            assert back[k].shape == t.shape and torch.equal(back[k].view(-1).view(torch.uint8),
                                                            t.view(-1).view(torch.uint8)), k


def test_a_stack_of_another_shape_fails_with_one_line(moe):
    from transformers import AutoConfig, AutoModelForCausalLM
    cks = moe["llama4_text"][1]
    cfg = AutoConfig.from_pretrained(cks["huffman"])
    cfg.num_local_experts = 2  # 4 experts stored
    with pytest.raises(InputError, match=r"is \[4, \d+, 128\], the model's .* is \[2, ") as e:
        AutoModelForCausalLM.from_pretrained(cks["huffman"], config=cfg)
    assert "\n" not in str(e.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_cuda_palette_load_of_a_huffman_checkpoint(moe, kind, monkeypatch):
    # the expert stacks (per-expert pieces, and a stored 3-D stack) are transcoded on the GPU;
    # decode + cuBLAS for every shape the table did not measure (these): the reference's bits
    monkeypatch.setenv("UNWEIGHT_NEAREST_SHAPES", "0")
    from transformers import AutoModelForCausalLM

    from unweight.runtime import scratch
    src, cks, _ = moe[kind]
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map="cuda").eval()
    scratch.reset_device_errors("cuda")
    model = unweight.load(cks["huffman"], device="cuda", mode="palette")
    assert model.unweight_info["experts"]["encodings"] == ["palette"]
    assert model.unweight_info["verified_tensors"] == n_encoded(cks["huffman"])  # checked on the GPU
    ids = IDS.cuda()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert scratch.device_errors("cuda") == 0


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("mode", ["huffman", "palette", "dense"])
@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_load_check_reaches_every_expert(moe, kind, mode, on_device, monkeypatch):
    """Every checkpoint tensor, each expert's included, is checked once placed (runtime/verify.py);
    on_device: through the branch a GPU takes (decode into the scratch, hash, combine)."""
    from unweight.runtime import verify as rv
    if on_device:
        monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    _, cks, ref = moe[kind]
    m = _load(cks["huffman"], mode)
    assert m.unweight_info["verified_tensors"] == n_encoded(cks["huffman"])
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, ref)


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("mode", ["palette", "dense"])
@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_an_expert_changed_after_placing_is_named(moe, kind, mode, on_device, monkeypatch):
    from unweight.format.errors import ChecksumError
    from unweight.runtime import verify as rv
    if on_device:
        monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    _, cks, _ = moe[kind]
    m = unweight.load(cks["palette"], device="cpu", mode="palette", verify=False)
    name, mod, attr, st = ex.expert_stacks(m)[0]
    headers = rv.HeldCheck.stack_headers(st)
    per_expert = isinstance(st.sources[-1], list)
    want = rv.piece_key(name, len(st.sources) - 1, st.num_experts - 1) if per_expert else name
    check = rv.HeldCheck()
    if mode == "palette":
        sm = (st.sources[-1][-1] if per_expert else st.sources[-1]).plane("__sm")
        sm.view(-1)[-3] ^= 1  # the last expert's last piece
        run = lambda: check.stack(name, st)  # noqa: E731
    else:
        ex.to_dense(m, mod, attr, st, [])
        w = getattr(mod, attr)
        with torch.no_grad():
            w.view(torch.int16)[-1, -1, -1] ^= 1
        run = lambda: check.dense_stack(name, headers, w)  # noqa: E731
    with pytest.raises(ChecksumError) as e:
        run()
        check.finish()
    assert want in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["qwen3_moe", "llama4_text"])
def test_a_device_fault_in_an_experts_decode_is_not_called_a_corrupt_checkpoint(moe, kind, monkeypatch):
    """An expert decoded on a GPU to other bytes than the CPU codec gives from the same intact
    planes (held in paired palette order, as on CUDA) fails the check as a DeviceFaultError."""
    from unweight.format.errors import DeviceFaultError, FormatError
    from unweight.runtime import verify as rv
    monkeypatch.setattr(rv.HeldCheck, "on_device", staticmethod(lambda device: True))
    _, cks, _ = moe[kind]
    m = unweight.load(cks["palette"], device="cpu", mode="palette", verify=False)
    name, _, _, st = ex.expert_stacks(m)[0]
    assert ex.hold_paired(st, True)
    real = ex.ExpertStack.decode_expert

    def decode_expert(self, e, out):
        w = real(self, e, out)
        if e == self.num_experts - 1:
            w.view(torch.int16)[-1, -1] ^= 1  # the last piece's last row
        return w

    monkeypatch.setattr(ex.ExpertStack, "decode_expert", decode_expert)
    check = rv.HeldCheck()
    check.stack(name, st)
    with pytest.raises(DeviceFaultError) as e:
        check.finish()
    per_expert = isinstance(st.sources[-1], list)
    want = rv.piece_key(name, len(st.sources) - 1, st.num_experts - 1) if per_expert else name
    assert want in str(e.value) and "\n" not in str(e.value) and not isinstance(e.value, FormatError)


def test_multimodal_llama4_checkpoint_loads_whole(tmp_path):
    """Llama 4 as Scout's published checkpoint holds it (Llama4ForConditionalGeneration: the
    language model under ``language_model.``, experts as stacks; a vision tower and its
    projector): in every mode, the image features and the logits of a prompt holding an image
    equal the BF16 model's, bit for bit."""
    from transformers import Llama4ForConditionalGeneration

    import unweight
    from tests.integrations.vllm_model import make_moe
    src = make_moe(str(tmp_path / "bf16"), "llama4")
    dst = str(tmp_path / "huffman")
    unweight.compress(src, dst, progress=False)
    torch.manual_seed(0)
    pix = torch.randn(1, 3, 112, 112).to(torch.bfloat16)
    ids = torch.tensor([[1, 5, 1001] + [1000] * 16 + [1002, 77, 100, 3]])  # <image> 16 patch groups </image>

    def run(m):
        with torch.no_grad():
            f = m.get_image_features(pixel_values=pix)
            f = getattr(f, "pooler_output", f)
            return (f if torch.is_tensor(f) else f[0]), m(input_ids=ids, pixel_values=pix).logits

    ref = run(Llama4ForConditionalGeneration.from_pretrained(src, dtype=torch.bfloat16).eval())
    assert ref[0].shape == (1, 16, 256)
    for mode in ("huffman", "palette", "dense"):
        m = unweight.load(dst, device="cpu", mode=mode)
        assert type(m).__name__ == "Llama4ForConditionalGeneration"
        got = run(m)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), mode


def test_tensors_the_model_ignores_are_left_out(tmp_path):
    """DeepSeek-V3's checkpoints hold a multi-token-prediction layer (model.layers.61) that
    transformers' model drops (_keys_to_ignore_on_load_unexpected): compressed, it is left out
    the same way, and the model loads in every mode with the BF16 model's logits."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    src = _make("deepseek_v3", str(tmp_path / "bf16"))
    f = os.path.join(src, "model.safetensors")
    sd = load_file(f)
    torch.manual_seed(1)
    sd["model.layers.61.eh_proj.weight"] = (torch.randn(128, 256) * 0.02).to(torch.bfloat16)
    sd["model.layers.61.mlp.experts.0.gate_proj.weight"] = (torch.randn(64, 128) * 0.02).to(torch.bfloat16)
    save_file(sd, f, metadata={"format": "pt"})
    dst = str(tmp_path / "huffman")
    api.compress(src, dst, progress=False)
    from unweight.format.checkpoint import CompressedCheckpoint
    ck = CompressedCheckpoint(dst)
    assert {"model.layers.61.eh_proj.weight", "model.layers.61.mlp.experts.0.gate_proj.weight"} <= set(ck.encoded)
    ck.close()
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(src).eval()(IDS).logits
    for mode in ("huffman", "palette", "dense"):
        m = unweight.load(dst, device="cpu", mode=mode)
        assert "model.layers.61.eh_proj.weight" in m._unweight_plan["ignored"]
        with torch.no_grad():
            assert torch.equal(m(IDS).logits, ref), mode
