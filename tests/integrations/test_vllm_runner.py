"""The vLLM tests' runner without vLLM: the startup shim of its processes
(vllm_quick_gc/sitecustomize.py: full collections taken as young ones, and the sitecustomize it
shadows still run), and how run_tp_configs watches its rank processes and merges what they
report."""
import json
import os
import subprocess
import sys
import time

from tests.integrations import vllm_runner

PROBE = ("import gc, os, sitecustomize; "
         "print(gc.collect is not sitecustomize.FULL_COLLECT, os.environ.get('SHADOWED_RAN'))")


def _probe(*extra_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((vllm_runner._QUICK_GC,) + extra_path))
    env.pop("SHADOWED_RAN", None)
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_full_collections_are_young_and_nothing_else_is_needed():
    assert _probe() == ["True", "None"]


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    assert _probe(str(tmp_path)) == ["True", "yes"]


def _fake_rank(tmp_path, r: int, lines: list, hang: bool) -> tuple:
    """A process standing in for a rank: it writes `lines` to its log, then hangs (as a rank
    left waiting in a collective) or ends."""
    path = str(tmp_path / f"rank{r}.log")
    code = f"import sys, time\nsys.stdout.write({''.join(ln + chr(10) for ln in lines)!r})\nsys.stdout.flush()\n"
    if hang:
        code += "time.sleep(600)\n"
    with open(path, "w") as f:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT)
    return p, path


def _result(**kw) -> str:
    return "RESULT " + json.dumps(kw)


def _report(layer: str, rank: int) -> str:
    return "unweight layer report " + json.dumps({"layer": layer, "tp_rank": rank})


def test_a_rank_left_waiting_after_anothers_error_is_stopped_and_the_error_kept(tmp_path):
    ok = [1, 2, 3]
    rank0 = ["BEGIN 0", _report("lm_head", 0), _result(tokens=ok), "BEGIN 1", _result(error="InputError: bad plane")]
    rank1 = ["BEGIN 0", _report("lm_head", 1), _result(tokens=ok), "BEGIN 1"]
    procs, paths = zip(*(_fake_rank(tmp_path, r, lines, hang=r == 1) for r, lines in enumerate((rank0, rank1))))
    t = time.monotonic()
    got = vllm_runner._watch_ranks(list(procs), list(paths), 3, time.monotonic() + 120, grace=1.0)
    assert time.monotonic() - t < 60 and all(p.poll() is not None for p in procs)
    assert [len(g) for g in got] == [2, 1]
    merged = vllm_runner._merge_ranks([{"m": 0}, {"m": 1}, {"m": 2}], got, ["\n".join(rank0), "\n".join(rank1)])
    assert [m.get("tokens") for m in merged] == [ok, None]
    assert merged[1]["error"] == "InputError: bad plane" and merged[1]["config"] == {"m": 1}
    assert sorted(merged[0]["reports"]) == [0, 1] and merged[0]["reports"][1] == {"lm_head": {"layer": "lm_head",
                                                                                            "tp_rank": 1}}


def test_ranks_that_disagree_or_end_without_a_word_are_not_a_result(tmp_path):
    got = [[{"tokens": [1]}, {"tokens": [5]}], [{"tokens": [1]}, {"tokens": [6]}]]
    merged = vllm_runner._merge_ranks([{}, {}], got, ["", ""])
    assert merged[0]["tokens"] == [1] and merged[1]["error"] == "the ranks did not all generate the same tokens"
    assert len(vllm_runner._merge_ranks([{}, {}], [[{"tokens": [1]}, {"tokens": [2]}], [{"tokens": [1]}]],
                                        ["", ""])) == 1
    # (a line still being written is not read)
    p, path = _fake_rank(tmp_path, 0, [_result(tokens=[1])], hang=False)
    p.wait()
    with open(path, "a") as f:
        f.write('RESULT {"tok')
    assert vllm_runner._watch_ranks([p], [path], 2, time.monotonic() + 10, grace=1.0) == [[{"tokens": [1]}]]
