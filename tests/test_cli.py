"""The unweight command: output, exit codes, one-line errors, interruption."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from .conftest import write_checkpoint

CLI = [sys.executable, "-m", "unweight"]  # what the console script runs (unweight/__main__.py)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, **kw):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=300, **kw)


def assert_one_line_error(p, code=None, stderr=None):
    """p failed with exactly one non-blank stderr line, ``error: ...`` (stderr: when p is a Popen)."""
    err = p.stderr if stderr is None else stderr
    assert p.returncode != 0
    if code is not None:
        assert p.returncode == code, err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def test_compress_prints_summary_and_tools_agree(tiny_model, tmp_path):
    src, _ = tiny_model
    c, d = str(tmp_path / "c"), str(tmp_path / "d")
    p = run("compress", src, c)
    assert p.returncode == 0, p.stderr
    for word in ("category", "mlp", "attention", "embedding", "total", "ratio", "bits/weight", "GB/s"):
        assert word in p.stdout
    p = run("verify", c)
    assert p.returncode == 0 and p.stdout.startswith("ok:")
    p = run("verify", c, "--against", src)
    assert p.returncode == 0 and "byte-identical" in p.stdout
    p = run("inspect", c)
    assert p.returncode == 0 and "exp H" in p.stdout and "huffman" in p.stdout
    p = run("inspect", c, "--json")
    assert json.loads(p.stdout)["totals"]["encoded"] == 4
    p = run("decompress", c, d)
    assert p.returncode == 0, p.stderr
    p = run("compress", src, str(tmp_path / "p"), "--encoding", "palette", "-j", "1", "--no-verify", "--json")
    assert json.loads(p.stdout)["verified"] is False


def test_bad_inputs_give_one_line_errors(tiny_model, tmp_path):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    assert run("compress", src, c).returncode == 0
    assert_one_line_error(run("compress", src, c), 2)                      # dst exists
    assert_one_line_error(run("compress", src, src, "--overwrite"), 2)     # src == dst
    assert_one_line_error(run("compress", str(tmp_path / "nope"), str(tmp_path / "x")), 2)
    assert_one_line_error(run("verify", src), 2)                           # not an unweight checkpoint
    assert_one_line_error(run("decompress", str(tmp_path / "nope"), str(tmp_path / "x")), 2)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert_one_line_error(run("compress", str(junk), str(tmp_path / "y")), 3)
    empty = write_checkpoint(str(tmp_path / "empty"), {})
    assert_one_line_error(run("compress", empty, str(tmp_path / "z")), 2)
    p = run("compress", src, str(tmp_path / "w"), "--encoding", "zstd")
    assert p.returncode == 2  # click's own usage error


def _big_model(folder, weights=48 * 2**20):
    rng = np.random.default_rng(0)
    n = weights // (1024 * 1024)
    tensors = {f"layers.{i}.mlp.weight": ("BF16", (rng.standard_normal((1024, 1024), dtype=np.float32) * 0.02)
                                          .view(np.uint32).__rshift__(16).astype(np.uint16)) for i in range(n)}
    return write_checkpoint(folder, tensors, {"model_type": "toy"})


def _signal_at(point, args, tmp_path, sigs):
    """Run the CLI until it reaches `point` (tests/pause_runner.py), send `sigs` there, return
    (process, stdout, stderr).  No race: the process waits at the point."""
    marker = tmp_path / f"reached-{point}"
    if marker.exists():
        marker.unlink()
    env = dict(os.environ)
    env.pop("UNWEIGHT_DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "tests.pause_runner", point, str(marker)] + args, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not marker.exists():
        if p.poll() is not None:
            raise AssertionError(f"exited ({p.returncode}) before reaching {point}: {p.communicate()}")
        assert time.time() < deadline, f"never reached {point}"
        time.sleep(0.01)
    for sig in sigs:
        p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    return p, out, err


def _assert_clean_abort(p, err, tmp_path, dst):
    assert_one_line_error(p, 130, err)
    assert "interrupted" in err
    assert not dst.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(f".{dst.name}.")]


# Start-up (the entry point's first statement; between click and the rest of the CLI; between
# numpy and the codec) and mid-compress (temp output staged).
POINTS = ["start", "import-cli", "import-api", "compress"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("point", POINTS)
def test_interrupt_at_any_point_is_one_line(tmp_path, point, sig):
    src = write_checkpoint(str(tmp_path / "src"), {"w": ("F32", np.zeros((4, 4), np.float32))})
    dst = tmp_path / "c"
    p, _, err = _signal_at(point, ["compress", src, str(dst), "-j", "1"], tmp_path, [sig])
    _assert_clean_abort(p, err, tmp_path, dst)


@pytest.mark.parametrize("point", ["start", "compress"])
def test_repeated_ctrl_c_is_still_one_line(tmp_path, point):
    src = write_checkpoint(str(tmp_path / "src"), {"w": ("F32", np.zeros((4, 4), np.float32))})
    dst = tmp_path / "c"
    p, _, err = _signal_at(point, ["compress", src, str(dst), "-j", "1"], tmp_path,
                           [signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGINT])
    _assert_clean_abort(p, err, tmp_path, dst)


def test_interrupt_leaves_source_intact_and_kill_9_is_cleaned_up_next_run(tmp_path):
    src = _big_model(str(tmp_path / "src"), weights=4 * 2**20)
    before = open(os.path.join(src, "model.safetensors"), "rb").read()
    dst = tmp_path / "c"
    p, _, err = _signal_at("compress", ["compress", src, str(dst), "-j", "1"], tmp_path, [signal.SIGINT])
    _assert_clean_abort(p, err, tmp_path, dst)
    assert open(os.path.join(src, "model.safetensors"), "rb").read() == before
    # kill -9 cannot clean up: its temp folder stays, and the next run removes it.
    p, _, _ = _signal_at("compress", ["compress", src, str(dst), "-j", "1"], tmp_path, [signal.SIGKILL])
    assert p.returncode == -signal.SIGKILL
    assert [f for f in os.listdir(tmp_path) if f.startswith(".c.unweight-tmp-")]
    small = write_checkpoint(str(tmp_path / "small"), {"w": ("F32", np.zeros((4, 4), np.float32))})
    assert run("compress", small, str(dst)).returncode == 0
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".c.")]


def test_corrupt_checkpoint_is_one_line_exit_3(tmp_path):
    golden = os.path.join(os.path.dirname(__file__), "golden", "corrupt", "checkpoints")
    for case in ("raw_bit_flip", "raw_overlap", "index_lost_shard"):
        for args in (["verify"], ["inspect"], ["decompress"]):
            cmd = args + [os.path.join(golden, case)] + ([str(tmp_path / "d")] if args == ["decompress"] else [])
            p = run(*cmd)
            assert_one_line_error(p, 3)
            assert "internal error" not in p.stderr
    assert not (tmp_path / "d").exists()


def test_offline_commands_never_import_torch(tiny_model, tmp_path):
    # The offline CLI installs without torch (the runtime extra): nothing it imports may need it.
    code = ("import sys, unweight.__main__ as m\n"
            "rc = m.main(sys.argv[1:])\n"
            "assert not [k for k in sys.modules if k == 'torch' or k.startswith('torch.')], 'torch imported'\n"
            "sys.exit(rc)\n")
    src, _ = tiny_model
    c, d = str(tmp_path / "c"), str(tmp_path / "d")
    for args in (["compress", src, c], ["verify", c], ["inspect", c], ["decompress", c, d], ["--help"]):
        p = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (args, p.stderr)
