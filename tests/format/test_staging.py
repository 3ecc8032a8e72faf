"""Output staging: the swap of a finished output into place completes or rolls back as a unit,
whatever signal comes during it, and a copy of dst that a killed run had moved aside is put
back, never deleted.  Signals are sent for real from a patched os.rename at each step of the
swap (no timing), with a handler that raises KeyboardInterrupt as the command's does."""
import os
import signal
import subprocess
import sys

import pytest

from unweight.format import staging
from unweight.format.errors import InputError


def _tree(folder):
    """{relative path: text} of the files under folder, or None when it does not exist."""
    if not os.path.lexists(folder):
        return None
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = open(p).read()
    return out


def _make(folder, text):
    os.makedirs(folder)
    with open(os.path.join(folder, "w.txt"), "w") as f:
        f.write(text)


def _others(tmp_path, name="out"):
    return sorted(f for f in os.listdir(tmp_path) if f != name)


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def raising_handlers():
    """SIGINT and SIGTERM raise KeyboardInterrupt (pytest's own SIGINT handling set aside)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signum)
    saved = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    yield interrupt
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture(autouse=True)
def _forget_written():
    staging.written.clear()
    yield
    staging.written.clear()


def _signal_on_rename(monkeypatch, sig, at, before=False):
    """os.rename sends `sig` to this process just before or after its `at`-th call (1-based)."""
    real, calls = os.rename, []

    def rename(a, b):
        calls.append((a, b))
        if before and len(calls) == at:
            os.kill(os.getpid(), sig)
        real(a, b)
        if not before and len(calls) == at:
            os.kill(os.getpid(), sig)
    monkeypatch.setattr(os, "rename", rename)
    return calls


# The swap with dst present is: rename(dst, old), rename(tmp, dst), remove old; a signal just
# before or after either rename.  Without dst it is one rename.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("overwrite,at,before", [(True, 1, True), (True, 1, False), (True, 2, True),
                                                 (True, 2, False), (False, 1, True), (False, 1, False)])
def test_signal_during_swap_is_delivered_once_the_new_output_is_in_place(
        tmp_path, monkeypatch, raising_handlers, sig, overwrite, at, before):
    dst = str(tmp_path / "out")
    if overwrite:
        _make(dst, "old")
    with pytest.raises(KeyboardInterrupt) as e:
        with staging.staged_output(dst, overwrite) as tmp:
            with open(os.path.join(tmp, "w.txt"), "w") as f:
                f.write("new")
            calls = _signal_on_rename(monkeypatch, sig, at, before)
    assert e.value.args == (sig,)  # the signal's own handler ran, once
    assert len(calls) == (2 if overwrite else 1)
    assert _tree(dst) == {"w.txt": "new"}
    assert _others(tmp_path) == []  # no old copy, no temp folder
    assert staging.written == [dst]  # what lets the command say the output was written
    assert signal.getsignal(signal.SIGINT) is raising_handlers
    assert signal.getsignal(signal.SIGTERM) is raising_handlers


def test_signal_while_building_removes_the_temp_folder(tmp_path, raising_handlers):
    dst = str(tmp_path / "out")
    _make(dst, "old")
    with pytest.raises(KeyboardInterrupt):
        with staging.staged_output(dst, True) as tmp:
            open(os.path.join(tmp, "w.txt"), "w").close()
            os.kill(os.getpid(), signal.SIGINT)
    assert _tree(dst) == {"w.txt": "old"}
    assert _others(tmp_path) == [] and staging.written == []


def test_failed_swap_puts_dst_back(tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    _make(dst, "old")
    real = os.rename

    def rename(a, b):
        if b == dst and ".unweight-tmp-" in a:
            raise OSError(13, "Permission denied")
        real(a, b)
    with pytest.raises(InputError, match="cannot write .*out: Permission denied$"):
        with staging.staged_output(dst, True) as tmp:
            _make(os.path.join(tmp, "sub"), "new")
            monkeypatch.setattr(os, "rename", rename)
    assert _tree(dst) == {"w.txt": "old"}
    assert _others(tmp_path) == [] and staging.written == []


def test_failed_rollback_names_the_old_copy(tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    _make(dst, "old")
    real = os.rename

    def rename(a, b):
        if b == dst:  # neither the new output nor the old copy can go back to dst
            raise OSError(5, "Input/output error")
        real(a, b)
    with pytest.raises(InputError) as e:
        with staging.staged_output(dst, True):
            monkeypatch.setattr(os, "rename", rename)
    old = os.path.join(str(tmp_path), f".out.unweight-old-{os.getpid()}")
    assert str(e.value).endswith(f"its previous contents are in {old}")
    assert _tree(old) == {"w.txt": "old"} and _others(tmp_path) == [os.path.basename(old)]


def test_old_copy_of_a_killed_run_is_restored_when_dst_is_missing(tmp_path):
    # kill -9 between rename(dst, old) and rename(tmp, dst): dst is missing, its contents in
    # the old copy; the temp folder is complete but was never swapped in.
    pid = _dead_pid()
    _make(str(tmp_path / f".out.unweight-old-{pid}"), "old")
    _make(str(tmp_path / f".out.unweight-tmp-{pid}"), "new")
    staging.remove_stale_temps(str(tmp_path), "out")
    assert _tree(str(tmp_path / "out")) == {"w.txt": "old"}
    assert _others(tmp_path) == []


def test_next_run_restores_before_it_checks_for_dst(tmp_path):
    pid = _dead_pid()
    _make(str(tmp_path / f".out.unweight-old-{pid}"), "old")
    dst = str(tmp_path / "out")
    with pytest.raises(InputError, match="exists: pass --overwrite"):
        with staging.staged_output(dst, False):
            pass
    assert _tree(dst) == {"w.txt": "old"} and _others(tmp_path) == []
    with staging.staged_output(dst, True) as tmp:
        _make(os.path.join(tmp, "sub"), "new")
    assert _tree(dst) == {os.path.join("sub", "w.txt"): "new"} and _others(tmp_path) == []


def test_stale_old_copy_is_removed_when_dst_is_present_and_live_runs_are_left_alone(tmp_path):
    pid = _dead_pid()
    _make(str(tmp_path / "out"), "current")
    _make(str(tmp_path / f".out.unweight-old-{pid}"), "older")
    _make(str(tmp_path / f".out.unweight-tmp-{os.getppid()}"), "a live run's")
    staging.remove_stale_temps(str(tmp_path), "out")
    assert _tree(str(tmp_path / "out")) == {"w.txt": "current"}
    assert _others(tmp_path) == [f".out.unweight-tmp-{os.getppid()}"]


def test_old_copy_that_cannot_be_restored_is_one_line_naming_it(tmp_path, monkeypatch):
    pid = _dead_pid()
    old = str(tmp_path / f".out.unweight-old-{pid}")
    _make(old, "old")

    def rename(a, b):
        raise OSError(13, "Permission denied")
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(InputError, match=f"missing and its previous contents are in {old}"):
        staging.remove_stale_temps(str(tmp_path), "out")
    assert _tree(old) == {"w.txt": "old"}
