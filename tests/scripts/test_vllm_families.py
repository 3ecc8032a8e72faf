"""scripts/vllm_families.py in the vLLM venv: a family's tiny model served compressed beside its
original, the table and the JSON saying what each layer did."""
from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("vllm")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import vllm_families  # noqa: E402


def test_llama4_serves_compressed_with_the_layers_its_loader_rewrites_decoded(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "families.json"
    assert vllm_families.main(["--families", "llama4_text", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["architecture"] == "Llama4ForCausalLM" and row["tokens_match_original"], row
    assert row["layers_compressed"] == 10 and 0.6 < row["held_over_bf16"] < 0.7, row
    assert row["decoded"]["model.layers.1.self_attn.qkv_proj"] == (
        "vLLM's loader of Llama4ForCausalLM rewrites q_proj at load (view, transpose, reshape)")
    table = capsys.readouterr().out
    assert "llama4_text    Llama4ForCausalLM" in table and " equal " in table and f"wrote {out}" in table
