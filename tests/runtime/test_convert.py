"""Model surgery and the never-silently-wrong rule (unweight/runtime/convert.py): a model that
loads is the original model, or the load fails with one line naming what does not fit."""
import json
import os
import shutil

import pytest
import torch

import unweight


def _with_layers(ck, tmp_path, n):
    dst = str(tmp_path / f"layers{n}")
    shutil.copytree(ck, dst)
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    cfg["num_hidden_layers"] = n
    json.dump(cfg, open(p, "w"))
    return dst


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("mode", ["huffman", "dense"])
def test_stored_tensor_with_no_place_fails(llama_ck, tmp_path, mode):
    # One layer fewer in the model than in the checkpoint: layer 1's tensors have no place.
    dst = _with_layers(llama_ck[1]["huffman"], tmp_path, 1)
    with pytest.raises(unweight.InputError) as e:
        unweight.load(dst, device="cpu", mode=mode)
    assert "model.layers.1." in _one_line(e) and "no place" in str(e.value)


def test_parameter_left_uninitialised_fails(llama_ck, tmp_path):
    # One layer more in the model than in the checkpoint: layer 2 would keep its random init.
    dst = _with_layers(llama_ck[1]["huffman"], tmp_path, 3)
    with pytest.raises(unweight.InputError) as e:
        unweight.load(dst, device="cpu", mode="huffman")
    assert "model.layers.2." in _one_line(e) and "initial value" in str(e.value)


def test_automodel_path_applies_the_same_rule(llama_ck, tmp_path):
    from transformers import AutoModelForCausalLM
    dst = _with_layers(llama_ck[1]["palette"], tmp_path, 3)
    with pytest.raises(unweight.InputError, match="model.layers.2."):
        AutoModelForCausalLM.from_pretrained(dst)


def test_complete_checkpoint_loads_and_matches(llama_ck):
    from transformers import AutoModelForCausalLM
    src, cks = llama_ck
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    m = AutoModelForCausalLM.from_pretrained(cks["huffman"]).eval()
    ids = torch.tensor([[1, 5, 9, 300]])
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
