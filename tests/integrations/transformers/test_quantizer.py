"""transformers integration: registration on `import unweight`, from_pretrained with the
Auto classes, device_map, config round trip, lm-eval's HFLM."""
import json
import os
import subprocess
import sys

import pytest
import torch

import unweight
from unweight.runtime.modules import CompressedLinear


def test_import_unweight_stays_cheap_and_registers_lazily(llama_ck):
    path = llama_ck[1]["huffman"]
    code = (
        "import sys, json, torch\n"
        "import unweight\n"
        "assert 'transformers' not in sys.modules\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({path!r})\n"
        "print(json.dumps({'cls': type(m).__name__, 'q': type(m.config.quantization_config).__name__,\n"
        "                  'mode': m.unweight_info['mode']}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"cls": "LlamaForCausalLM", "q": "UnweightConfig", "mode": "auto"}
    out = subprocess.run([sys.executable, "-c", "import sys, unweight; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("device_map", [None, "cpu", "auto", {"": "cpu"}])
def test_from_pretrained_device_maps(llama_ck, device_map):
    from transformers import AutoModelForCausalLM
    src, cks = llama_ck
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    kw = {} if device_map is None else {"device_map": device_map}
    m = AutoModelForCausalLM.from_pretrained(cks["huffman"], **kw).eval()
    ids = torch.tensor([[1, 5, 9, 77]])
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    assert m.is_quantized and m.config.quantization_config.quant_method == "unweight"


def test_mode_through_config(llama_ck):
    from transformers import AutoConfig, AutoModelForCausalLM
    path = llama_ck[1]["huffman"]
    cfg = AutoConfig.from_pretrained(path)
    cfg.quantization_config = dict(cfg.quantization_config, mode="palette")
    m = AutoModelForCausalLM.from_pretrained(path, config=cfg)
    assert isinstance(m.lm_head, CompressedLinear) and m.lm_head.encoding_name == "palette"
    d = m.config.quantization_config.to_dict()
    with open(os.path.join(path, "config.json")) as f:
        on_disk = json.load(f)["quantization_config"]
    assert d["mode"] == "palette"
    assert {k: d[k] for k in on_disk} == on_disk  # every key compress wrote survives


def test_config_rejects_other_major_version():
    from unweight.integrations.transformers.quantizer import UnweightConfig
    with pytest.raises(unweight.VersionError):
        UnweightConfig(format_version="2.0")
    c = UnweightConfig.from_dict({"quant_method": "unweight", "format_version": "1.0", "tool_version": "0.1.0"})
    assert c.to_dict()["tool_version"] == "0.1.0" and c.mode == "auto"


@pytest.mark.slow
def test_automodel_minilm(minilm_ck):
    from transformers import AutoModel
    src, dst = minilm_ck
    ref = AutoModel.from_pretrained(src, dtype=torch.bfloat16).eval()
    m = AutoModel.from_pretrained(dst).eval()
    x = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        assert torch.equal(m(x).last_hidden_state, ref(x).last_hidden_state)


def test_lm_eval_hflm(llama_ck):
    lm_eval = pytest.importorskip("lm_eval")  # noqa: F841
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast
    pytest.importorskip("tokenizers")
    m = unweight.load(llama_ck[1]["huffman"], device="cpu", mode="huffman")
    from unweight.sources import bundled_smollm2
    tok = PreTrainedTokenizerFast.from_pretrained(bundled_smollm2())
    lm = HFLM(pretrained=m, tokenizer=tok, batch_size=1)
    assert lm.model is m


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_are_refused_in_one_line(llama_ck, dtype):
    """Compressed weights decode to bfloat16: a load or cast to another dtype fails in one line
    rather than giving a model that is neither the original nor the original cast."""
    from transformers import AutoModelForCausalLM
    from unweight.format.errors import InputError
    src, cks = llama_ck
    with pytest.raises(InputError) as e:
        AutoModelForCausalLM.from_pretrained(cks["huffman"], dtype=dtype)
    assert "bfloat16" in str(e.value) and "\n" not in str(e.value)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[1, 5, 9, 77]])
    for mode in ("huffman", "palette"):
        m = unweight.load(cks["huffman"], device="cpu", mode=mode)
        with pytest.raises(InputError) as e:
            m.to(dtype)
        assert str(dtype) in str(e.value) and "\n" not in str(e.value)
        m.to("cpu")  # a device move is not a cast
        with torch.no_grad():
            assert torch.equal(m(ids).logits, ref(ids).logits)
    # Dense mode holds ordinary parameters: the cast is the original's cast, bit for bit.
    d = unweight.load(cks["huffman"], device="cpu", mode="dense").to(dtype)
    with torch.no_grad():
        assert torch.equal(d(ids).logits, ref.to(dtype)(ids).logits)


def test_save_pretrained_is_refused_with_the_reason_logged(llama_ck, tmp_path, caplog):
    # The compressed folder is the checkpoint; transformers' refusal points to the logger for why.
    m = unweight.load(llama_ck[1]["huffman"], device="cpu", mode="huffman")
    with caplog.at_level("WARNING", logger="unweight"), pytest.raises(ValueError, match="not serializable"):
        m.save_pretrained(str(tmp_path / "s"))
    assert any("unweight decompress" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(tmp_path / "s" / "model.safetensors")


@pytest.mark.parametrize("device_map, said", [("meta", "meta device"), ({"": "meta"}, "meta device"),
                                              ({"model.embed_tokens": "cpu", "lm_head": "cpu", "model.layers": "meta",
                                                "model.norm": "cpu", "model.rotary_emb": "cpu"}, "model.layers"),
                                              ({"": "disk"}, "disk")])
def test_meta_and_disk_device_maps_are_refused_in_one_line(llama_ck, device_map, said):
    """Planes on the meta device hold no bytes to check and prepare (it failed with torch's
    "Cannot copy out of meta tensor")."""
    from transformers import AutoModelForCausalLM
    with pytest.raises(unweight.InputError) as e:
        AutoModelForCausalLM.from_pretrained(llama_ck[1]["huffman"], device_map=device_map)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_disk_offload_from_max_memory_is_refused(llama_ck):
    from transformers import AutoModelForCausalLM
    with pytest.raises(unweight.InputError, match="cannot be offloaded to disk"):
        AutoModelForCausalLM.from_pretrained(llama_ck[1]["huffman"], device_map="auto", max_memory={"cpu": 2000})


def test_a_head_the_checkpoint_lacks_is_one_line_without_transformers_report(llama_ck, capfd):
    """A causal checkpoint into AutoModelForSequenceClassification leaves its score head at its
    initial value: refused in one line, without transformers' multi-line loading report."""
    from transformers import AutoModelForSequenceClassification
    capfd.readouterr()
    with pytest.raises(unweight.InputError) as e:
        AutoModelForSequenceClassification.from_pretrained(llama_ck[1]["huffman"])
    assert "'score.weight'" in str(e.value) and "\n" not in str(e.value)
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "MISSING" not in err, err
