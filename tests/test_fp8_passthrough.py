"""FP8 checkpoints (DeepSeek-V3 / Kimi-K2 style: e4m3 weights with per-block F32
``weight_scale_inv``, BF16 embeddings and norms) through compress / verify / inspect /
decompress: FP8 tensors and their scales are stored as they are, BF16 matrices are encoded,
every tensor and config.json round-trip exactly, and the decompressed model loads as the
original does (transformers dequantizes FP8 on a CPU-only machine: same logits, bit for bit).
A runtime handed the compressed folder itself says in one line to decompress it first.
"""
import json
import os

import numpy as np
import pytest
import torch

from unweight import api
from unweight.format.errors import InputError
from unweight.format.safetensors_io import SafetensorsFile

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory):
    """A 1-layer Llama whose projections are e4m3 with [N/128, K/128] F32 inverse scales."""
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    d = tmp_path_factory.mktemp("fp8")
    src = str(d / "src")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(src)
    f = os.path.join(src, "model.safetensors")
    out = {}
    for k, v in load_file(f).items():
        if k.endswith("proj.weight"):
            n, kk = v.shape
            blocks = v.float().reshape(n // 128, 128, kk // 128, 128)
            scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
            out[k] = (blocks / scale[:, None, :, None]).reshape(n, kk).to(torch.float8_e4m3fn)
            out[k + "_scale_inv"] = scale.float()
        else:
            out[k] = v
    save_file(out, f, metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as fh:
        c = json.load(fh)
    c["quantization_config"] = FP8_CONFIG
    with open(os.path.join(src, "config.json"), "w") as fh:
        json.dump(c, fh, indent=2)
    comp, back = str(d / "comp"), str(d / "back")
    report = api.compress(src, comp, progress=False)
    api.decompress(comp, back, progress=False)
    return src, comp, back, report


def _raw(folder):
    f = SafetensorsFile(os.path.join(folder, "model.safetensors"))
    try:
        return {n: (f.info(n)[0], f.info(n)[1], np.array(f.array(n)).tobytes()) for n in f.names()}
    finally:
        f.close()


def test_fp8_tensors_are_stored_unchanged_and_bf16_is_encoded(fp8_model):
    src, comp, _, report = fp8_model
    recs = {t["name"]: t for t in report["tensors"]}
    fp8 = [n for n in recs if n.endswith("proj.weight")]
    assert len(fp8) == 7
    for n in fp8:
        assert recs[n]["dtype"] == "F8_E4M3" and recs[n]["encoding"] == "raw"
        assert recs[n + "_scale_inv"]["dtype"] == "F32" and recs[n + "_scale_inv"]["encoding"] == "raw"
    assert recs["model.embed_tokens.weight"]["encoding"] == "huffman"
    assert recs["lm_head.weight"]["encoding"] == "huffman"
    assert report["passthrough_dtypes"] == ["F32", "F8_E4M3"]
    # the FP8 bytes in the compressed shard are the original's
    orig, stored = _raw(src), _raw(comp)
    for n in fp8 + [n + "_scale_inv" for n in fp8]:
        assert stored[n] == orig[n], n
    with open(os.path.join(comp, "config.json")) as fh:
        qc = json.load(fh)["quantization_config"]
    assert qc["quant_method"] == "unweight" and qc["source_quantization_config"] == FP8_CONFIG


def test_verify_inspect_and_decompress_are_exact(fp8_model):
    src, comp, back, _ = fp8_model
    assert api.verify(comp)["ok"]
    assert api.verify(comp, against=src)["ok"]
    info = {r["name"]: r for r in api.inspect(comp)["tensors"]}
    q = info["model.layers.0.self_attn.q_proj.weight"]
    assert (q["dtype"], q["encoding"], q["ratio"]) == ("F8_E4M3", "raw", 1.0)
    assert _raw(back) == _raw(src)  # every tensor: name, dtype, shape, bytes
    with open(os.path.join(src, "config.json")) as a, open(os.path.join(back, "config.json")) as b:
        assert json.load(b) == json.load(a)  # quantization_config (fp8) restored


def test_decompressed_model_loads_as_the_original(fp8_model):
    from transformers import AutoModelForCausalLM
    src, comp, back, _ = fp8_model
    ids = torch.tensor([[1, 5, 9, 77, 100, 3]])
    logits = []
    for folder in (src, back):
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            logits.append(m(ids).logits)
    assert torch.equal(logits[0], logits[1])
    # The compressed folder itself: one line that says what to do.
    import unweight  # noqa: F401  (registers the quantizer)
    with pytest.raises(InputError, match=r"quantized with 'fp8' before compression.*unweight decompress"):
        AutoModelForCausalLM.from_pretrained(comp, dtype=torch.bfloat16)


def test_a_quantization_config_under_text_config_is_kept_as_the_source(fp8_model, tmp_path):
    """A multimodal model may keep its quantization_config under text_config only: compress
    records it as the source (and where it was), leaves it there, and decompress gives back
    the config as it was."""
    import shutil
    src = str(tmp_path / "src")
    shutil.copytree(fp8_model[0], src)
    p = os.path.join(src, "config.json")
    with open(p) as fh:
        c = json.load(fh)
    c["text_config"] = {"quantization_config": c.pop("quantization_config"), "hidden_size": 256}
    with open(p, "w") as fh:
        json.dump(c, fh, indent=2)
    comp, back = str(tmp_path / "comp"), str(tmp_path / "back")
    api.compress(src, comp, progress=False)
    with open(os.path.join(comp, "config.json")) as fh:
        out = json.load(fh)
    qc = out["quantization_config"]
    assert qc["quant_method"] == "unweight" and qc["source_quantization_config"] == FP8_CONFIG
    assert qc["source_quantization_config_in"] == "text_config"
    assert out["text_config"]["quantization_config"] == FP8_CONFIG
    api.decompress(comp, back, progress=False)
    with open(os.path.join(back, "config.json")) as fh:
        assert json.load(fh) == c
