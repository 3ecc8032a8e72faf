"""scripts/bench_codec.py's accounting, without running the benchmark: the exponent-bit
breakdown against its entropy bounds, the README tables from the committed runs, and the
OpenZL contender's round trip where openzl is installed."""
import glob
import io
import json
import os
import re
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_codec as bc  # noqa: E402
from unweight.codec import tensor_codec as tc  # noqa: E402


def _bf16(rng, shape, scale):
    f = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32)
    return (f >> 16).astype(np.uint16)


def test_exponent_bits_against_bounds():
    rng = np.random.default_rng(3)
    # Rows whose scale changes by block: the block entropy sits below the tensor's.
    emb = np.concatenate([_bf16(rng, (64, 1024), 0.002), _bf16(rng, (64, 1024), 0.2)])
    mats = {"model.embed_tokens.weight": emb, "layers.0.mlp.up_proj.weight": _bf16(rng, (256, 512), 0.02)}
    names = list(mats)
    encs = [tc.encode(mats[n], "huffman") for n in names]
    out = bc.exponent_bits(names, mats, encs, None, block=65536)
    assert set(out) == {"embeddings", "other"}
    for g, n in (("embeddings", names[0]), ("other", names[1])):
        x = out[g]
        assert x["weights"] == mats[n].size and x["openzl_fse"] is None
        # A per-tensor prefix code under the 4 contexts cannot go below their conditional
        # entropy, and conditioning or splitting into blocks never raises the entropy.
        assert x["unweight_huffman"] >= x["h_ctx"] - 1e-9
        assert x["h_ctx"] <= x["h0"] + 1e-9 and x["h0_blocks"] <= x["h0"] + 1e-9
        assert x["unweight_huffman"] == 8 * memoryview(encs[names.index(n)].planes["__exp"]).nbytes / mats[n].size
    assert out["embeddings"]["h0"] - out["embeddings"]["h0_blocks"] > 0.5


def _runs():
    runs = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "codec-*-run[0-9].json")))
    by_commit = {}
    for p in runs:
        with open(p) as f:
            doc = json.load(f)
        if "exponent_bits" in doc["results"][0]:
            by_commit.setdefault(doc["commit"], []).append(p)
    if not by_commit:
        pytest.skip("no committed codec runs with the exponent breakdown")
    return max(by_commit.values(), key=len)


def test_summarize_committed_runs():
    paths = _runs()
    out = io.StringIO()
    bc.summarize(paths, out)
    text = out.getvalue()
    with open(paths[0]) as f:
        r = json.load(f)["results"][0]
    assert f"| {r['model']} | {r['ratio_huffman']:.4f} | {r['ratio_palette']:.4f} |" in text
    assert "| OpenZL FSE |" in text and "H(e \\| m6 m5) per tensor" in text
    # The file's bytes split into parts that add up to the huffman ratio.
    line = next(ln for ln in text.splitlines() if ln.startswith(f"  {r['model']}: __hdr"))
    parts = [float(v) for v in re.findall(r"\d+\.\d+", line)]  # 4 planes, other tensors, header; input's
    assert len(parts) == 7
    assert abs(sum(parts[:6]) - r["file_bytes_huffman"] / r["input_file_bytes"]) < 6 * 5e-6


def test_summarize_refuses_mixed_commits(tmp_path):
    paths = _runs()[:1]
    with open(paths[0]) as f:
        doc = json.load(f)
    doc["commit"] = "0000000"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="one commit"):
        bc.summarize(paths + [str(other)], io.StringIO())


@pytest.mark.parametrize("coder", bc.OPENZL_CODERS)
def test_openzl_contender_round_trip(coder):
    pytest.importorskip("openzl.ext")
    rng = np.random.default_rng(5)
    a = _bf16(rng, (300, 700), 0.02)
    a[0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]  # NaN payload, -Inf, subnormal, -0
    z = bc.OpenZL(coder)
    frames = [z.compress(a), z.compress(a[:17])]  # a context per frame: a second frame works
    assert z.decompress(frames[0]).tobytes() == a.tobytes()
    assert z.decompress(frames[1]).tobytes() == a[:17].tobytes()
    assert len(frames[0]) < 0.7 * a.nbytes


def test_dfloat11_sizes_groups_blocks():
    if bc._dfloat11_utils() is None:
        pytest.skip("dfloat11 not installed")
    pytest.importorskip("dahuffman")
    rng = np.random.default_rng(7)
    mats = {"model.embed_tokens.weight": _bf16(rng, (64, 128), 0.02),
            "model.layers.0.mlp.up_proj.weight": _bf16(rng, (128, 64), 0.02),
            "model.layers.0.self_attn.q_proj.weight": _bf16(rng, (64, 64), 0.02),
            "model.layers.1.mlp.up_proj.weight": _bf16(rng, (128, 64), 0.02)}
    enc = sum(a.nbytes for a in mats.values())
    mats["model.layers.1.mlp.up_proj.weight"][0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]
    d = bc.dfloat11_sizes(list(mats), mats, enc + 100, enc, verify=True)  # its stream decodes to the weights
    assert d["blocks"] == 3  # the embedding alone, then one code per layer
    assert 0.6 < d["tensor_ratio"] < 0.8
    assert d["checkpoint_ratio"] == pytest.approx((d["tensor_ratio"] * enc + 100) / (enc + 100))


# --------------------------------------------------------------------------- failure paths
# A run that cannot do what was asked says so in one line and exits non-zero, before it
# measures anything; a peer that did not run is "n/a", never a number.


def _no_measuring(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the benchmark started measuring")
    monkeypatch.setattr(bc, "bench_model", refuse)


@pytest.mark.parametrize("argv, needle", [
    (["--models", "llama"], "unknown model 'llama'"),
    (["--models", ","], "no model named"),
    (["--repeat", "0"], "0 is not >= 1"),
    (["--repeat", "-1"], "-1 is not >= 1"),
    (["--threads", "0"], "0 is not >= 1"),
    (["--threads", "x"], "'x' is not a whole number"),
    (["--gaussian-weights", "0"], "0 is not >= 1"),
])
def test_bad_arguments_refused(argv, needle, monkeypatch, capsys):
    _no_measuring(monkeypatch)
    with pytest.raises(SystemExit) as e:
        bc.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err.splitlines()[-1] and "Traceback" not in err


def test_out_path_checked_before_measuring(tmp_path, monkeypatch, capsys):
    _no_measuring(monkeypatch)
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as e:
        bc.main(["--models", "minilm", "--out", str(tmp_path / "f" / "x.json")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"bench_codec: cannot write {tmp_path / 'f' / 'x.json'}: a part of its folder is a file"


def test_dfloat11_dependency_missing(monkeypatch, capsys, tmp_path):
    _no_measuring(monkeypatch)

    def missing():
        raise ModuleNotFoundError("No module named 'dahuffman'")
    monkeypatch.setattr(bc, "_dfloat11_utils", missing)
    with pytest.raises(SystemExit) as e:
        bc.main(["--models", "minilm", "--dfloat11", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --dfloat11 needs dfloat11 0.5.0 (No module named 'dahuffman')")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("timer", [False, True])
def test_cli_step_failure_is_one_line(tmp_path, timer):
    if timer and not os.path.exists("/usr/bin/time"):
        pytest.skip("no GNU time")
    prefix = ["/usr/bin/time", "-f", "%M"] if timer else []
    with pytest.raises(SystemExit) as e:
        bc.run_cli(["compress", str(tmp_path / "missing"), str(tmp_path / "o")], prefix)
    msg = str(e.value)
    assert msg.startswith("bench_codec: `unweight compress` failed (exit ")
    assert "missing" in msg and "\n" not in msg and "Command exited" not in msg


def _committed_run():
    with open(_runs()[0]) as f:
        return json.load(f)


def _without_peers(doc):
    for r in doc["results"]:
        for k in [k for k in r if k.startswith(("zipnn_", "paired_speed_ratio_", "openzl_"))]:
            del r[k]
        for g in r.get("exponent_bits", {}).values():
            g["openzl_fse"] = None
    doc["zipnn_version"] = doc["openzl_version"] = None
    return doc


def test_summarize_runs_without_peers(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps(_without_peers(_committed_run())))
    out = io.StringIO()
    bc.summarize([str(p)], out)
    text = out.getvalue()
    assert "nan" not in text
    r = json.loads(p.read_text())["results"][0]
    assert f"| {r['model']} | {r['ratio_huffman']:.4f} | {r['ratio_palette']:.4f} | n/a | n/a | n/a |" in text
    assert "| n/a | n/a | n/a |\n" in text  # ZipNN's speeds and both ratio columns


@pytest.mark.parametrize("content, needle", [(None, "No such file or directory"), ("not json", "Expecting value"),
                                             ('{"benchmark": "scale"}', "not a result of bench_codec.py")])
def test_summarize_unreadable_input(tmp_path, content, needle):
    p = tmp_path / "x.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(SystemExit) as e:
        bc.summarize([str(p)], io.StringIO())
    assert str(e.value).startswith(f"error: {p}: ") and needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit, match="usage: bench_codec.py --summarize"):
        bc.main(["--summarize"])


def test_report_states_no_number_for_a_peer_that_did_not_run():
    doc = _without_peers(_committed_run())
    out = io.StringIO()
    bc.report(doc["results"], [1], {"zipnn": None, "openzl": None, "dfloat11": None}, out)
    text = out.getvalue()
    assert "nan" not in text and "ZipNN not installed, not run" in text and "OpenZL" not in text.split("exponent")[0]
    # With the peers, their installed versions are named (not a version written into the script).
    doc = _committed_run()
    out = io.StringIO()
    bc.report(doc["results"], [1], {"zipnn": "9.9.1", "openzl": "8.8.2", "dfloat11": None}, out)
    assert "vs ZipNN 9.9.1" in out.getvalue() and "OpenZL 8.8.2, one thread" in out.getvalue()


def test_small_run_without_peers(tmp_path):
    """MiniLM, one repeat, one thread, with zipnn and openzl made unimportable: a table with no
    number for them, and a JSON that records the machine, torch and the commit."""
    from unweight import sources
    try:
        sources.bundled_minilm()
    except Exception as e:  # noqa: BLE001 - the bundled model's packages are optional
        pytest.skip(f"bundled MiniLM not available: {e}")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Gone:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('zipnn', 'openzl'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _Gone())\n")
    out = tmp_path / "res" / "codec.json"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    import subprocess
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_codec.py"), "--models", "minilm",
                        "--repeat", "1", "--threads", "1", "--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "zipnn not installed" in p.stderr and "openzl not installed" in p.stderr
    assert "nan" not in p.stdout and "one thread: checkpoint ratio" not in p.stdout  # no OpenZL section
    doc = json.loads(out.read_text())
    assert doc["zipnn_version"] is None and doc["openzl_version"] is None
    assert doc["environment"]["torch"] and doc["machine"]["cores"] and "commit" in doc
    r = doc["results"][0]
    assert not any(k.startswith(("zipnn_", "openzl_")) for k in r)
    assert r["raw_seconds_t1"]["huffman_c"] and r["cli_decompress_gbps"] > 0
