"""Shared fixtures: small synthetic checkpoints made in the test itself."""
import contextlib
import fcntl
import json
import os

import numpy as np
import pytest


def bf16_gaussian(rng, shape, std=0.02):
    """uint16 [shape] BF16 bit patterns of N(0, std) (round to nearest even)."""
    f = (rng.standard_normal(shape, dtype=np.float32) * std).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)


def write_checkpoint(folder, tensors: dict, config: dict | None = None, extra_files: dict | None = None):
    """Write {name: (dtype, np array)} with the safetensors package; returns the folder."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    td = {}
    for name, (dt, arr) in tensors.items():
        t = torch.from_numpy(np.ascontiguousarray(arr))
        if dt == "BF16":
            t = t.view(torch.bfloat16)
        elif dt == "F16":
            t = t.view(torch.float16)
        td[name] = t
    save_file(td, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
    for fname, text in (extra_files or {}).items():
        with open(os.path.join(folder, fname), "w") as f:
            f.write(text)
    return folder


@pytest.fixture
def tiny_model(tmp_path):
    """A small mixed checkpoint: BF16 matrices (odd shapes, special values), 1-D, F32, I64."""
    rng = np.random.default_rng(1234)
    special = bf16_gaussian(rng, (65, 130))
    special[0, :8] = [0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x0000, 0x8000]  # NaNs, ±Inf, subnormals, ±0
    tensors = {
        "model.embed_tokens.weight": ("BF16", bf16_gaussian(rng, (300, 64))),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", bf16_gaussian(rng, (64, 64))),
        "model.layers.0.mlp.up_proj.weight": ("BF16", special),
        "model.layers.0.mlp.down_proj.weight": ("BF16", bf16_gaussian(rng, (63, 4097))),
        "model.norm.weight": ("BF16", bf16_gaussian(rng, (64,))),
        "model.tiny.weight": ("BF16", bf16_gaussian(rng, (4, 4))),
        "model.f32_proj.weight": ("F32", rng.standard_normal((32, 32), dtype=np.float32)),
        "model.position_ids": ("I64", np.arange(16, dtype=np.int64)[None]),
    }
    folder = write_checkpoint(str(tmp_path / "src"), tensors, {"model_type": "toy", "hidden_size": 64},
                              {"tokenizer.json": "{}", "generation_config.json": "{}", "README.md": "toy"})
    return folder, tensors


# ------------------------------------------------------------------------ model checkpoints
# Tiny synthetic models (fast) and the bundled real models (slow), compressed once per
# session into temp folders; shared by the runtime and integration tests.


def tiny_llama(tie: bool = True, seed: int = 0):
    """A 2-layer Llama [hidden 64, vocab 320] in bf16, eval mode (random N(0, 0.02) weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie, initializer_range=0.02, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def flip_stored_byte(path, tensor, delta=1, at=0.5, offset=None):
    """Change one byte of a stored tensor in a safetensors file, in place: the byte `offset`
    bytes into it, else at fraction `at` of it, plus delta (mod 256)."""
    from unweight.format.safetensors_io import SafetensorsFile
    f = SafetensorsFile(path)
    _, _, b, e = f.info(tensor)
    start = f.data_start
    f.close()
    pos = start + b + (offset if offset is not None else int((e - b) * at))
    with open(path, "r+b") as fh:
        fh.seek(pos)
        v = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([(v + delta) & 0xFF]))


def n_encoded(path) -> int:
    """How many encoded tensors a compressed checkpoint folder holds."""
    from unweight.format.checkpoint import CompressedCheckpoint
    ck = CompressedCheckpoint(path)
    try:
        return len(ck.encoded)
    finally:
        ck.close()


def save_and_compress(model, root, name, encoding="huffman"):
    """Save model under root/name-src once and compress it to root/name-<encoding> once."""
    from unweight import api
    src = os.path.join(root, name + "-src")
    with _built_once(src) as build:
        if build:
            model.save_pretrained(src + ".tmp")
            os.replace(src + ".tmp", src)
    dst = os.path.join(root, f"{name}-{encoding}")
    with _built_once(dst) as build:
        if build:
            api.compress(src, dst, encoding=encoding, progress=False)
    return src, dst


@contextlib.contextmanager
def _built_once(path):
    """Yields True when the caller must build `path` (it does not exist yet), else False.

    pytest-xdist runs one process per CPU and each builds its own session fixtures; a lock file
    next to `path` makes the first process build it and the others wait and reuse it, so a bundled
    model is compressed once per run and held on disk once (the CI disk is small).  The builders
    write through temporary names and rename, so an existing `path` is always complete."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield not os.path.exists(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def ckroot(tmp_path_factory):
    """A folder shared by every test process of the run (the xdist workers' common parent)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, which holds each worker's popen-gwK/
    root = base / "unweight_runtime"
    root.mkdir(exist_ok=True)
    return str(root)


@pytest.fixture(scope="session")
def llama_ck(ckroot):
    """(src folder, {encoding: compressed folder}) of a tiny tied Llama."""
    m = tiny_llama()
    src, h = save_and_compress(m, ckroot, "llama", "huffman")
    _, p = save_and_compress(m, ckroot, "llama", "palette")
    return src, {"huffman": h, "palette": p}


def _bundled_compressed(root, name):
    """(BF16 folder, huffman-compressed folder) of a bundled real model, compressed once."""
    from unweight import api, sources
    src = sources.resolve(name)
    dst = os.path.join(root, f"{name}-huffman")
    with _built_once(dst) as build:
        if build:
            api.compress(src, dst, progress=False)
    return src, dst


@pytest.fixture(scope="session")
def smol_ck(ckroot):
    return _bundled_compressed(ckroot, "smollm2-135m")


@pytest.fixture(scope="session")
def minilm_ck(ckroot):
    return _bundled_compressed(ckroot, "minilm-l6")


def train_step_grads(model, ids):
    """Loss and gradients of one training step of `model` on token ids [batch, seq] with only
    its 1-D parameters (norms) trainable: {name: grad} of every parameter that got one."""
    model.train()
    for p in model.parameters():
        p.requires_grad_(p.dim() == 1)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
