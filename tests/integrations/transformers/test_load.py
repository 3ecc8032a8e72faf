"""unweight.load: modes, bitwise logits vs the BF16 model, generation, memory, ties,
odd architectures, corrupt input, torch.compile of a whole model."""
import logging
import os
import shutil

import pytest
import torch

import unweight
from unweight.format.errors import ChecksumError, FormatError
from unweight.runtime import scratch
from unweight.runtime.modules import CompressedEmbedding, CompressedLinear, compressed_modules

from tests.conftest import flip_stored_byte, n_encoded, save_and_compress, train_step_grads

IDS = torch.tensor([[1, 17, 45, 200, 3, 99, 310, 5]])


def _ref(src):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("enc", ["huffman", "palette"])
@pytest.mark.parametrize("mode", ["huffman", "palette", "dense", "auto"])
def test_modes_bitwise_logits(llama_ck, enc, mode):
    src, cks = llama_ck
    ref = _ref(src)
    m = unweight.load(cks[enc], device="cpu", mode=mode)
    info = m.unweight_info
    assert torch.equal(_logits(m), _logits(ref))
    if mode in ("huffman", "palette"):
        # q,o,gate,up,down per layer + embedding + tied head (k,v are 64x32 < 4096 weights: stored raw)
        assert info["modules"][mode] == 2 * 5 + 2
        assert isinstance(m.model.embed_tokens, CompressedEmbedding)
        assert isinstance(m.lm_head, CompressedLinear) and m.lm_head.is_tied
    else:  # auto on CPU with plenty of memory = dense
        assert info["modules"]["dense"] == 12
        assert type(m.lm_head) is torch.nn.Linear and m.lm_head.weight is m.model.embed_tokens.weight


def test_greedy_generation_identical(llama_ck):
    src, cks = llama_ck
    ref = _ref(src)
    m = unweight.load(cks["huffman"], device="cpu", mode="huffman")
    a = m.generate(IDS, max_new_tokens=6, do_sample=False)
    b = ref.generate(IDS, max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)


def test_memory_accounting_and_scratch(llama_ck):
    src, cks = llama_ck
    scratch.release()
    m = unweight.load(cks["huffman"], device="cpu", mode="huffman")
    info = m.unweight_info
    owners = [mod for _, mod in compressed_modules(m) if not mod.is_tied]
    assert info["held_bytes"] == sum(mod.held_bytes() for mod in owners)
    assert info["held_bytes"] <= 0.70 * info["bf16_bytes"]  # tiny random model; real-model bound in the slow test
    largest_linear = max(mod.decoded_bytes() for _, mod in compressed_modules(m) if isinstance(mod, CompressedLinear))
    assert info["scratch_bytes"]["cpu"] == largest_linear  # the tied head: vocab x hidden
    # no plane is stored twice, no decoded weight is kept
    ptrs = [t.data_ptr() for t in m.state_dict().values()]
    assert len(ptrs) == len(set(ptrs))
    for _, mod in compressed_modules(m):
        assert all(t.dtype in (torch.uint8, torch.uint16, torch.uint32)  # uint16: the __chk index
                   for k, t in mod.state_dict().items() if k != "bias")


def test_compiled_model_matches(llama_ck):
    src, cks = llama_ck
    torch._dynamo.reset()
    m = unweight.load(cks["palette"], device="cpu", mode="palette")
    ref = _logits(_ref(src))
    f = torch.compile(m, backend="eager")
    assert torch.equal(_logits(f), ref)


@pytest.mark.parametrize("mode", ["palette", "huffman"])
def test_inductor_compiled_model_is_the_bf16_model(llama_ck, mode):
    """Under inductor the whole compressed model is one graph (fullgraph: no break at a
    compressed layer) whose logits are the BF16 model's, eager or compiled, bit for bit, with
    inductor's bf16 rounding emulated.  (Without it a fused kernel keeps some bf16 intermediates
    in fp32, by where its fusions end, so even the BF16 model compiled differs from itself
    eager, and a compressed layer's ops move those ends.)"""
    import torch._inductor.config as inductor_config
    src, cks = llama_ck
    ref = _ref(src)
    want = _logits(ref)
    with inductor_config.patch(emulate_precision_casts=True):
        torch._dynamo.reset()
        assert torch.equal(_logits(torch.compile(ref, backend="inductor", fullgraph=True)), want)
        torch._dynamo.reset()
        m = unweight.load(cks[mode], device="cpu", mode=mode)
        assert torch.equal(_logits(torch.compile(m, backend="inductor", fullgraph=True)), want)
    torch._dynamo.reset()


def _copy(ck, tmp_path):
    dst = str(tmp_path / "ck")
    shutil.copytree(ck, dst)
    return dst, os.path.join(dst, "model.safetensors")


@pytest.mark.parametrize("plane", ["__exp", "__sm", "__off"])
def test_corrupt_plane_fails_load_naming_tensor_and_file(llama_ck, tmp_path, plane):
    dst, shard = _copy(llama_ck[1]["huffman"], tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    flip_stored_byte(shard, name + plane, delta=0x40 if plane == "__off" else 1, at=0.5)
    with pytest.raises(FormatError) as ei:
        unweight.load(dst, device="cpu", mode="huffman")
    msg = str(ei.value)
    assert "\n" not in msg and name in msg and "model.safetensors" in msg


def test_corrupt_raw_tensor_fails_checksum(llama_ck, tmp_path):
    dst, shard = _copy(llama_ck[1]["huffman"], tmp_path)
    flip_stored_byte(shard, "model.norm.weight")
    with pytest.raises(ChecksumError, match="model.norm.weight"):
        unweight.load(dst, device="cpu", mode="huffman")


def test_truncated_shard(llama_ck, tmp_path):
    dst, shard = _copy(llama_ck[1]["palette"], tmp_path)
    size = os.path.getsize(shard)
    with open(shard, "r+b") as fh:
        fh.truncate(size * 2 // 3)
    with pytest.raises(FormatError) as ei:
        unweight.load(dst, device="cpu")
    assert "model.safetensors" in str(ei.value) and "\n" not in str(ei.value)


def test_verify_off_still_validates_structure(llama_ck, tmp_path, monkeypatch):
    dst, shard = _copy(llama_ck[1]["huffman"], tmp_path)
    flip_stored_byte(shard, "model.layers.0.self_attn.q_proj.weight__sm")  # data error: only the checksum pass sees it
    m = unweight.load(dst, device="cpu", mode="huffman", verify=False)
    assert m.unweight_info["modules"]["huffman"] == 12
    monkeypatch.setenv("UNWEIGHT_VERIFY", "1")
    with pytest.raises(ChecksumError, match="q_proj"):
        unweight.load(dst, device="cpu", mode="huffman", verify=False)


def test_odd_architecture_falls_back_to_dense(ckroot, caplog):
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4, initializer_range=0.02)
    model = GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
    src, dst = save_and_compress(model, ckroot, "gpt2", "huffman")
    with caplog.at_level(logging.INFO, logger="unweight"):
        m = unweight.load(dst, device="cpu", mode="huffman")
    info = m.unweight_info
    assert any("c_attn" in s and "Conv1D" in s for s in info["dense_fallback"])
    assert "c_attn" in caplog.text and "dense" in caplog.text
    assert isinstance(m.transformer.wte, CompressedEmbedding) and m.lm_head.is_tied
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    ids = IDS % 300
    assert torch.equal(_logits(m, ids), _logits(ref, ids))


def test_bad_mode_and_not_a_checkpoint(llama_ck):
    with pytest.raises(unweight.InputError):
        unweight.load(llama_ck[1]["huffman"], mode="fast")
    with pytest.raises(unweight.InputError):
        unweight.load(llama_ck[0], device="cpu")
    from pathlib import Path
    with pytest.raises(unweight.InputError, match="path must be a path, got NoneType"):
        unweight.load(None)
    m = unweight.load(Path(llama_ck[1]["huffman"]), device="cpu")  # any os.PathLike
    assert m.unweight_info["mode"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_one_line(llama_ck):
    with pytest.raises(unweight.InputError) as e:
        unweight.load(llama_ck[1]["huffman"], device="cuda:0")
    assert "no CUDA GPU" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("mode", ["huffman", "palette"])
def test_backward_through_compressed_layers_gives_the_original_gradients(llama_ck, mode):
    """Every compressed layer decodes into the same scratch: a backward must not read a weight a
    later layer has overwritten (torch raised "modified by an inplace operation")."""
    src, cks = llama_ck
    want_loss, want = train_step_grads(_ref(src), IDS)
    loss, got = train_step_grads(unweight.load(cks["huffman"], device="cpu", mode=mode), IDS)
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_load_passes_output_loading_info_through(llama_ck):
    m, info = unweight.load(llama_ck[1]["huffman"], device="cpu", mode="huffman", output_loading_info=True)
    assert not m.training and m.unweight_info["mode"] == "huffman"
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()


@pytest.mark.parametrize("mode", ["huffman", "palette", "dense"])
def test_num_parameters_is_the_original_models(llama_ck, mode):
    """The compressed weights are buffers, not Parameters: the count still is the original's
    (lm-eval records it with its results); they take no gradient, so they are not trainable."""
    src, cks = llama_ck
    ref = _ref(src)
    m = unweight.load(cks["huffman"], device="cpu", mode=mode)
    assert m.num_parameters() == ref.num_parameters()
    assert m.num_parameters(exclude_embeddings=True) == ref.num_parameters(exclude_embeddings=True)
    frozen = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert m.num_parameters(only_trainable=True) == frozen


# ----------------------------------------------------------------------------- real models


@pytest.mark.slow
def test_smollm2_all_modes_bitwise(smol_ck):
    src, dst = smol_ck
    ref = _ref(src)
    ids = torch.tensor([[1, 504, 3458, 314, 260, 3622, 28, 2593, 30]])
    want = _logits(ref, ids)
    gen_want = ref.generate(ids, max_new_tokens=4, do_sample=False)
    for mode, bound in [("huffman", 0.68), ("palette", 0.76), ("dense", None)]:
        scratch.release()
        m = unweight.load(dst, device="cpu", mode=mode)
        assert torch.equal(_logits(m, ids), want), mode
        info = m.unweight_info
        if bound:
            assert info["held_bytes"] <= bound * info["bf16_bytes"], (mode, info["ratio"])
            assert info["scratch_bytes"]["cpu"] == 49152 * 576 * 2  # the (tied) lm_head, the largest layer
            assert info["tied"] == [{"module": "lm_head", "source": "model.embed_tokens"}]
        if mode == "huffman":
            assert torch.equal(m.generate(ids, max_new_tokens=4, do_sample=False), gen_want)
        del m


@pytest.mark.slow
def test_minilm_automodel(minilm_ck):
    from transformers import AutoModel
    src, dst = minilm_ck
    ref = AutoModel.from_pretrained(src, dtype=torch.bfloat16).eval()
    x = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102]])
    for mode in ("huffman", "palette"):
        m = unweight.load(dst, device="cpu", mode=mode, model_class=AutoModel)
        assert isinstance(m.embeddings.word_embeddings, CompressedEmbedding)
        with torch.no_grad():
            assert torch.equal(m(x).last_hidden_state, ref(x).last_hidden_state), mode


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["huffman", "palette", "dense"])
def test_cuda_load_matches_cuda_reference(llama_ck, mode, monkeypatch):
    # Decode + cuBLAS for every shape the table did not measure (these): the reference's bits.
    monkeypatch.setenv("UNWEIGHT_NEAREST_SHAPES", "0")
    src, cks = llama_ck
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map="cuda").eval()
    scratch.reset_device_errors("cuda")  # the counter is per device: earlier corrupt-input tests add to it
    m = unweight.load(cks["huffman"], device="cuda", mode=mode)
    assert m.unweight_info["verified_tensors"] == n_encoded(cks["huffman"])  # each checked on the GPU
    ids = IDS.cuda()
    assert torch.equal(_logits(m, ids), _logits(ref, ids))
    assert scratch.device_errors("cuda") == 0


@pytest.mark.parametrize("enc", ["huffman", "palette"])
@pytest.mark.parametrize("mode", ["huffman", "palette", "dense"])
def test_resize_token_embeddings_matches_the_original(llama_ck, enc, mode):
    """transformers' resize_token_embeddings works in every mode: the compressed embedding and
    its tied head become one dense Parameter of the new size, bit for bit the original model's
    resize under the same seed; a resize to the current size keeps them compressed."""
    src, cks = llama_ck
    m = unweight.load(cks[enc], device="cpu", mode=mode)
    ref = _ref(src)
    n = m.config.vocab_size
    assert m.resize_token_embeddings(n - 5, pad_to_multiple_of=16).num_embeddings == n  # rounds back to n
    assert len(compressed_modules(m)) == (0 if mode == "dense" else 12)
    for kw in ({"new_num_tokens": n + 8}, {"new_num_tokens": n - 20, "pad_to_multiple_of": 16}):
        torch.manual_seed(0)
        want = ref.resize_token_embeddings(**kw)
        torch.manual_seed(0)
        got = m.resize_token_embeddings(**kw)
        assert type(got) is torch.nn.Embedding and got.weight.shape == want.weight.shape
        assert torch.equal(got.weight.view(torch.int16), want.weight.view(torch.int16))
        assert m.lm_head.weight is m.model.embed_tokens.weight
        assert m.config.vocab_size == ref.config.vocab_size == got.num_embeddings
        ids = torch.tensor([[1, 17, got.num_embeddings - 1, 3]])
        assert torch.equal(_logits(m, ids), _logits(ref, ids))
    if mode != "dense":
        info = m.unweight_info
        assert not any(isinstance(x, (CompressedEmbedding,)) for _, x in compressed_modules(m))
        assert info["modules"] == {"dense": 2, "huffman": 10 * (mode == "huffman"), "palette": 10 * (mode == "palette")}
        assert info["held_bytes"] == sum(x.held_bytes() for _, x in compressed_modules(m))
