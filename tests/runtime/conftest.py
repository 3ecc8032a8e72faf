"""Shared checkpoints for the runtime tests: tiny synthetic models (fast) and the bundled
real models (slow), compressed once per session into temp folders."""
import os

import pytest
import torch

from unweight import api


def tiny_llama(tie: bool = True, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie, initializer_range=0.02, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def save_and_compress(model, root, name, encoding="huffman"):
    src = os.path.join(root, name + "-src")
    if not os.path.exists(src):
        model.save_pretrained(src)
    dst = os.path.join(root, f"{name}-{encoding}")
    if not os.path.exists(dst):
        api.compress(src, dst, encoding=encoding, progress=False)
    return src, dst


@pytest.fixture(scope="session")
def ckroot(tmp_path_factory):
    return str(tmp_path_factory.mktemp("unweight_runtime"))


@pytest.fixture(scope="session")
def llama_ck(ckroot):
    """(src folder, {encoding: compressed folder}) of a tiny tied Llama."""
    m = tiny_llama()
    src, h = save_and_compress(m, ckroot, "llama", "huffman")
    _, p = save_and_compress(m, ckroot, "llama", "palette")
    return src, {"huffman": h, "palette": p}


@pytest.fixture(scope="session")
def smol_ck(ckroot):
    from unweight.sources import bundled_smollm2
    src = bundled_smollm2()
    dst = os.path.join(ckroot, "smol-huffman")
    if not os.path.exists(dst):
        api.compress(src, dst, progress=False)
    return src, dst


@pytest.fixture(scope="session")
def minilm_ck(ckroot):
    from unweight.sources import bundled_minilm
    src = bundled_minilm()
    dst = os.path.join(ckroot, "minilm-huffman")
    if not os.path.exists(dst):
        api.compress(src, dst, progress=False)
    return src, dst
