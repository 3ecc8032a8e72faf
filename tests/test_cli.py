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
    if "stdout" in kw:
        return subprocess.run(CLI + list(args), stderr=subprocess.PIPE, text=True, timeout=300, **kw)
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


@pytest.mark.parametrize("args,where", [
    (["compress", "x"], "compress"),                                       # missing DST
    (["compress", "x", "y", "--encoding", "zstd"], "compress"),            # bad choice
    (["compress", "x", "y", "--bogus"], "compress"),                       # unknown option
    (["compress", "x", "y", "--jobs"], "compress"),                        # option without its value
    (["compress", "x", "y", "-j", "-3"], "compress"),
    (["compress", "x", "y", "-j", "0"], "compress"),                       # no "0 = all cores"
    (["compress", "x", "y", "--segment-weights", "0"], "compress"),
    (["compress", "x", "y", "--segment-weights", "-5"], "compress"),
    (["compress", "x", "y", "-j", "two"], "compress"),
    (["decompress", "x", "y", "-j", "-1"], "decompress"),
    (["verify", "x", "-j", "-1"], "verify"),
    (["inspect", "x", "-j", "0"], "inspect"),
    (["inspect"], "inspect"),
    (["eval", "a", "b", "--threads", "0"], "eval"),
    (["eval", "a", "b", "--mode", "fast"], "eval"),
    (["frobnicate"], None),                                                # unknown command
    (["--bogus"], None),
])
def test_usage_errors_are_one_line_exit_2(args, where, tmp_path):
    p = run(*args, cwd=tmp_path)
    assert_one_line_error(p, 2)
    assert p.stderr.rstrip().endswith(f"(see unweight{' ' + where if where else ''} --help)"), p.stderr
    assert "Usage:" not in p.stderr and p.stdout == ""


def test_help_is_unchanged():
    for args in (["--help"], ["compress", "--help"], ["verify", "-h"]):
        p = run(*args)
        assert p.returncode == 0 and p.stderr == ""
        assert p.stdout.startswith("Usage: unweight") and "Options:" in p.stdout
    p = run()  # a bare `unweight` shows the help, as click does
    assert p.returncode == 2 and "Commands:" in p.stdout + p.stderr


def test_verify_against_a_compressed_checkpoint_is_refused(tiny_model, tmp_path):
    src, _ = tiny_model
    c, c2 = str(tmp_path / "c"), str(tmp_path / "c2")
    assert run("compress", src, c).returncode == 0
    assert run("compress", src, c2, "--encoding", "palette").returncode == 0
    for against in (c2, c, os.path.join(c2, "model.safetensors")):  # folder; itself; a lone shard
        p = run("verify", c, "--against", against)
        assert_one_line_error(p, 2)
        assert "is a compressed checkpoint" in p.stderr and "uncompressed" in p.stderr
        assert "tensor sets differ" not in p.stderr
    assert run("verify", c, "--against", os.path.join(src, "model.safetensors")).returncode == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_write_failure_is_one_line(tiny_model, tmp_path):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    with open("/dev/full", "w") as full:
        p = run("compress", src, c, stdout=full)
        assert_one_line_error(p, 1)
        # the output itself was complete when its report could not be printed
        assert "no space left on device" in p.stderr and f"{c} was written" in p.stderr
        assert os.path.exists(os.path.join(c, "model.safetensors"))
        for args in (["inspect", c], ["inspect", c, "--json"], ["verify", c], ["decompress", c, str(tmp_path / "d")],
                     ["--help"], ["--version"]):
            p = run(*args, stdout=full)
            assert_one_line_error(p, 1)
            assert "cannot write the result to standard output: no space left on device" in p.stderr


def test_broken_pipe_exits_quietly_with_141(tiny_model, tmp_path):
    src, _ = tiny_model
    for args in (["compress", src, str(tmp_path / "c")], ["inspect", str(tmp_path / "c")]):
        r, w = os.pipe()
        os.close(r)  # the reader is gone (`| head` that already exited, `| true`)
        try:
            p = run(*args, stdout=w)
        finally:
            os.close(w)
        assert p.returncode == 141 and p.stderr == "", (args, p.returncode, p.stderr)


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


def _assert_clean_abort(p, err, tmp_path, dst, sig=signal.SIGINT):
    assert_one_line_error(p, 128 + sig, err)
    assert ("interrupted;" if sig == signal.SIGINT else "terminated (SIGTERM);") in err
    assert "the output was not written" in err
    assert not dst.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(f".{dst.name}.")]


# Start-up (the entry point's first statement; between click and the rest of the CLI; between
# numpy and the codec) and mid-compress (temp output staged).
POINTS = ["start", "import-cli", "import-api", "compress"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("point", POINTS)
def test_interrupt_at_any_point_is_one_line(tmp_path, point, sig):
    src = write_checkpoint(str(tmp_path / "src"), {"w": ("BF16", np.zeros((4, 4), np.uint16))})
    dst = tmp_path / "c"
    p, _, err = _signal_at(point, ["compress", src, str(dst), "-j", "1"], tmp_path, [sig])
    _assert_clean_abort(p, err, tmp_path, dst, sig)


@pytest.mark.parametrize("point", ["start", "compress"])
def test_repeated_ctrl_c_is_still_one_line(tmp_path, point):
    src = write_checkpoint(str(tmp_path / "src"), {"w": ("BF16", np.zeros((4, 4), np.uint16))})
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
    small = write_checkpoint(str(tmp_path / "small"), {"w": ("BF16", np.zeros((4, 4), np.uint16))})
    assert run("compress", small, str(dst)).returncode == 0
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".c.")]


# Runs the entry point with os.rename sending a signal to the process right after the
# `at`-th rename of the final swap (1: dst moved aside, or tmp renamed in when there was no
# dst; 2: tmp renamed in): the windows where an interrupt used to hide or lose dst.
_SIGNAL_AT_RENAME = r"""
import os, sys
sig, at, dst = int(sys.argv[1]), int(sys.argv[2]), os.path.abspath(sys.argv[3])
real, n = os.rename, [0]
def rename(a, b):
    real(a, b)
    if b == dst or ".unweight-old-" in b:
        n[0] += 1
        if n[0] == at:
            os.kill(os.getpid(), sig)
os.rename = rename
import unweight.__main__ as m
sys.exit(m.main(sys.argv[4:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("overwrite,at", [(True, 1), (True, 2), (False, 1)])
def test_signal_during_the_final_swap_says_the_output_was_written(tiny_model, tmp_path, sig, overwrite, at):
    src, _ = tiny_model
    dst = tmp_path / "c"
    if overwrite:
        dst.mkdir()
        (dst / "old.txt").write_text("old")
    p = subprocess.run([sys.executable, "-c", _SIGNAL_AT_RENAME, str(int(sig)), str(at), str(dst), "compress",
                        src, str(dst), "-j", "1"] + (["--overwrite"] if overwrite else []),
                       capture_output=True, text=True, timeout=300)
    assert_one_line_error(p, 128 + sig)
    assert p.stderr.startswith("error: interrupted after" if sig == signal.SIGINT else "error: terminated (SIGTERM) after")
    assert f"the output was written: {dst} is complete" in p.stderr
    assert sorted(os.listdir(dst)) == ["README.md", "config.json", "generation_config.json", "model.safetensors",
                                       "model.safetensors.index.json", "tokenizer.json", "unweight_report.json"]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".c.")]  # no old copy, no temp folder
    assert run("verify", str(dst), "--against", src).returncode == 0


def test_kill_9_between_the_renames_is_repaired_by_the_next_run(tiny_model, tmp_path):
    src, _ = tiny_model
    dst = tmp_path / "c"
    # What kill -9 leaves after rename(dst, old): dst missing, its contents only in the old copy.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = tmp_path / f".c.unweight-old-{dead.pid}"
    old.mkdir()
    (old / "old.txt").write_text("old")
    p = run("compress", src, str(dst))
    assert p.returncode == 2 and "exists: pass --overwrite" in p.stderr
    assert f"restored {dst} from {old}" in p.stderr
    assert os.listdir(dst) == ["old.txt"] and not old.exists()


# A signal as the interpreter shuts down after a finished command (atexit callbacks run
# after the entry point returned).
_SIGNAL_AT_EXIT = r"""
import atexit, os, sys, time
def late():
    os.kill(os.getpid(), int(sys.argv[1]))
    time.sleep(0.05)  # a Python handler would run here
atexit.register(late)
import unweight.__main__ as m
sys.exit(m.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_after_the_command_finished_changes_nothing(tiny_model, tmp_path, sig):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    for args in (["compress", src, c, "-j", "1"], ["verify", c], ["verify", str(tmp_path / "nope")]):
        p = subprocess.run([sys.executable, "-c", _SIGNAL_AT_EXIT, str(int(sig))] + args,
                           capture_output=True, text=True, timeout=300)
        if args[1] == str(tmp_path / "nope"):
            assert_one_line_error(p, 2)  # an error's status and line, untouched by the late signal
        else:
            assert p.returncode == 0 and p.stderr == "" and p.stdout, (args, p.returncode, p.stderr)


# A signal while a __del__ runs (tqdm's progress bar, as api.compress returns): CPython would
# swallow its KeyboardInterrupt and print it as "Exception ignored".
_SIGNAL_IN_DEL = r"""
import os, signal, sys
import unweight.__main__ as m
from unweight import api
real = api.compress
class Bar:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        sum(i for i in range(100))  # the handler runs in here
def compress(*a, **k):
    bar = Bar()
    return real(*a, **k)
api.compress = compress
sys.exit(m.main(sys.argv[1:]))
"""


def test_signal_during_a_finalizer_is_not_lost(tiny_model, tmp_path):
    src, _ = tiny_model
    c = tmp_path / "c"
    p = subprocess.run([sys.executable, "-c", _SIGNAL_IN_DEL, "compress", src, str(c), "-j", "1"],
                       capture_output=True, text=True, timeout=300)
    assert_one_line_error(p, 130)
    assert f"after the output was written: {c} is complete" in p.stderr
    assert (c / "model.safetensors").exists()


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


@pytest.mark.parametrize("args,match", [
    (["--max-shard-size", "."], "bad max_shard_size '.'"),
    (["--max-shard-size", "1..2GB"], "bad max_shard_size '1..2GB'"),
    (["--max-shard-size", "0"], "max_shard_size must be at least 1 byte"),
    (["--revision", "v1"], "applies to hub ids only"),
    (["--encoding", "palette", "--index"], "index of huffman tensors"),
])
def test_bad_compress_options_are_one_line_exit_2(tiny_model, tmp_path, args, match):
    p = run("compress", tiny_model[0], str(tmp_path / "c"), *args)
    assert_one_line_error(p, 2)
    assert match in p.stderr and "internal error" not in p.stderr
    assert not (tmp_path / "c").exists()


def test_bad_decompress_shard_size_is_one_line_exit_2(tmp_path):
    p = run("decompress", str(tmp_path), str(tmp_path / "d"), "--max-shard-size", "-1")
    assert_one_line_error(p, 2)
    assert "bad max_shard_size '-1'" in p.stderr


def test_tune_off_a_gpu_and_bad_paths_are_one_line(tiny_model, tmp_path):
    """`unweight tune` measures on a CUDA GPU: off one, and for a path that is not a compressed
    checkpoint, it says so in one line (exit 2, or 3 for a foreign file) and writes no cache."""
    src, _ = tiny_model
    c = str(tmp_path / "c")
    assert run("compress", src, c).returncode == 0
    env = {**os.environ, "UNWEIGHT_TUNING_CACHE": str(tmp_path / "cache.json"), "CUDA_VISIBLE_DEVICES": ""}
    p = run("tune", c, env=env)
    assert_one_line_error(p, 2)
    assert "CUDA GPU" in p.stderr
    p = run("tune", str(tmp_path / "missing"), env=env)
    assert_one_line_error(p, 2)
    assert "no such file or folder" in p.stderr
    p = run("tune", src, env=env)  # an uncompressed checkpoint
    assert_one_line_error(p)
    p = run("tune", c, "--tp", "0", env=env)
    assert_one_line_error(p, 2)
    assert not (tmp_path / "cache.json").exists()


def test_tune_table_names_each_rows_plane_order_and_the_auto_order(monkeypatch):
    """`unweight tune`'s table (from api.tune's result): a row per path entry with the plane
    order it was timed in, the decoder, and the order plane_order="auto" then holds the shape in."""
    from click.testing import CliRunner

    from unweight import api
    from unweight.cli import main
    entry = {"N": 4096, "K": 4096, "bucket": "1", "times_ms": {}}
    res = {"device": "NVIDIA H200", "cache": "/tmp/t.json", "shapes": [[4096, 4096]], "seconds": 3.0,
           "paths": [{**entry, "encoding": "palette", "plane_order": "file", "choice": "palette_gemv_mma"},
                     {**entry, "encoding": "palette", "plane_order": "tiled", "choice": "palette_gemv_mma"},
                     {**entry, "encoding": "huffman", "plane_order": "file", "choice": "decode_cublas"}],
           "decoders": [{"N": 4096, "K": 4096, "encoding": "huffman", "S": 256, "choice": "ring", "times_ms": {}}],
           "plane_orders": {"4096x4096": "tiled"}}
    monkeypatch.setattr(api, "tune", lambda *a, **k: res)
    r = CliRunner().invoke(main, ["tune", "anything"])
    assert r.exit_code == 0, r.output
    rows = [ln.split() for ln in r.output.splitlines() if ln.startswith("4096x4096")]
    assert rows == [["4096x4096", "palette", "file", "1", "palette_gemv_mma", "-", "tiled"],
                    ["4096x4096", "palette", "tiled", "1", "palette_gemv_mma", "-", "tiled"],
                    ["4096x4096", "huffman", "file", "1", "decode_cublas", "ring", "-"]]
    assert "1 shapes timed on NVIDIA H200" in r.output


def test_selftest_off_a_gpu_is_one_line():
    p = run("selftest", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert_one_line_error(p, 2)
    assert "CUDA GPU" in p.stderr
    p = run("selftest", "--device", "cpu")
    assert_one_line_error(p, 2)


@pytest.mark.parametrize("passed", [True, False])
def test_selftest_table_and_exit_status(monkeypatch, passed):
    """`unweight selftest`'s table (from api.selftest's result): a row per kind of kernel, the
    failed fused checks listed under theirs, and exit 1 when a kernel failed."""
    from click.testing import CliRunner

    from unweight import api
    from unweight.cli import main
    failed = [] if passed else ["palette_gemv_mma (tile-major) at batch 1: max error 0.3 against 0.01"]
    res = {"device": "NVIDIA H200", "crc32": True, "fused": {"checked": 156, "failed": failed},
           "row_gathers": {"palette": True, "huffman": True}, "expert_slots": {"decode": True, "gemv": passed},
           "passed": passed, "seconds": 0.4}
    monkeypatch.setattr(api, "selftest", lambda **k: res)
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == (0 if passed else 1), r.output
    assert f"156 checks, {len(failed)} failed" in r.output and "palette ok, huffman ok" in r.output
    assert ("every check passed" in r.output) == passed
    assert ("palette_gemv_mma (tile-major) at batch 1" in r.output) != passed
    assert ("gemv FAILED" in r.output) != passed
    r = CliRunner().invoke(main, ["selftest", "--json"])
    assert json.loads(r.output) == res
