"""Output staging: every output is built in a temporary folder next to its destination and
renamed into place only when complete, so an interrupted or failed run leaves the destination
as it was (absent, or the old copy) and the source untouched."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import tempfile
import threading

from .errors import InputError

log = logging.getLogger(__name__)

# Files of a checkpoint folder that hold weights, by extension, with the serialisation each
# names (never copied as side files: the output writes its own; a source folder holding only
# the others is refused by name, checkpoint.refuse_foreign_weights).
WEIGHT_FORMATS = {".safetensors": "safetensors", ".bin": "PyTorch pickle", ".pt": "PyTorch pickle",
                  ".pth": "PyTorch pickle", ".ckpt": "PyTorch pickle", ".gguf": "GGUF", ".h5": "Keras/TF HDF5",
                  ".msgpack": "Flax msgpack", ".onnx": "ONNX"}
WEIGHT_EXTS = tuple(WEIGHT_FORMATS)


# Outputs this process has renamed into place (absolute paths), so the command can tell an
# interrupt that came after its output was complete from one that stopped it.
written: list[str] = []

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def write_atomic(path: str, text: str, temp_prefix: str | None = None) -> str:
    """Write `text` (utf-8) to `path` through a temporary file in the same folder, fsynced and
    renamed into place once complete, so an interrupted or failed write leaves no half file (and
    an old one as it was); missing folders on the way are made.  Returns the path."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix or f".{os.path.basename(path)}.unweight-tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _stale_temps(parent: str, base: str):
    """(path, kind) of the temp folders and old copies next to dst whose owning process is gone."""
    prefix = f".{base}.unweight-"
    for f in sorted(os.listdir(parent)):
        if not f.startswith(prefix):
            continue
        try:
            kind, pid = f[len(prefix):].rsplit("-", 1)
            pid = int(pid)
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # still running: another unweight writing the same dst
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        yield os.path.join(parent, f), kind


def _remove(p: str):
    shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)


def remove_stale_temps(parent: str, base: str):
    """Clean up after a killed run (kill -9, power loss): delete its temp folders, nobody will
    finish or rename them.  An old copy of dst it had moved aside (killed between the two
    renames of the swap) is put back when dst is missing, never deleted: it is the only copy."""
    dst = os.path.join(parent, base)
    for p, kind in _stale_temps(parent, base):
        if kind == "old" and not os.path.lexists(dst):
            try:
                os.rename(p, dst)
            except OSError as e:
                raise InputError(f"{dst} is missing and its previous contents are in {p} (left by an "
                                 f"interrupted run), which cannot be put back: {e.strerror or e}") from None
            log.warning("restored %s from %s, left by an interrupted run", dst, p)
            continue
        log.info("removing %s left by an interrupted run", p)
        try:
            _remove(p)
        except FileNotFoundError:
            pass  # another run cleaned it up first


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver the first one: the
    block (the output swap) then completes or rolls back as a unit.  Handlers are swapped, not
    signals blocked, because a signal blocked in the main thread still reaches the codec's
    threads, whose C handler queues the Python one for the main thread all the same.  Only the
    main thread may set handlers; elsewhere KeyboardInterrupt cannot be raised anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held, saved, holding = [], {}, [True]

    def deliver(signum, frame):
        h = saved[signum]
        if callable(h):
            h(signum, frame)
        else:  # SIG_DFL, already restored: let the system act on it as it would have
            signal.raise_signal(signum)

    def hold(signum, frame):
        if holding[0]:
            held.append(signum)
        else:  # left installed by an interrupted restore: behave as the handler it replaced
            deliver(signum, frame)

    try:
        for s in _SIGNALS:
            h = signal.getsignal(s)
            if h is not None and h is not signal.SIG_IGN:
                saved[s] = h
                signal.signal(s, hold)
        yield
    finally:
        holding[0] = False
        for s, h in saved.items():
            signal.signal(s, h)
    # Not when the block failed: its error says more (where dst's old contents are) and the
    # command stops on it anyway.
    if held:
        deliver(held[0], None)


def _swap(tmp: str, dst: str, old: str):
    """Rename tmp to dst, moving an existing dst aside to old first and deleting it after;
    on failure dst is as it was.  Runs with signals held (see staged_output)."""
    if not os.path.lexists(dst):
        os.rename(tmp, dst)
        written.append(dst)
        return
    os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except OSError as e:
        try:
            os.rename(old, dst)
        except OSError:
            raise InputError(f"cannot write {dst}: {e.strerror or e}; its previous contents are in {old}") from None
        raise
    written.append(dst)
    try:
        _remove(old)
    except OSError as e:  # the new output is in place: a left-over old copy is no failure
        log.warning("could not remove the previous %s (kept at %s): %s", dst, old, e.strerror or e)


@contextlib.contextmanager
def staged_output(dst: str, overwrite: bool):
    """Yield a temp folder next to dst; on success swap it into place, on any failure
    (exception, Ctrl-C) remove it and leave dst as it was.

    The swap runs with SIGINT and SIGTERM held: a signal that comes during it is delivered
    once the new output is in place (or dst is back as it was), so there is no moment where an
    interrupt leaves dst missing.  Paths renamed into place are recorded in ``written``."""
    dst = os.path.abspath(dst)
    parent, base = os.path.split(dst)
    if not os.path.isdir(parent):
        raise InputError(f"{parent}: output folder's parent does not exist")
    # Before the exists check: this may put back a dst that a killed run had moved aside.
    remove_stale_temps(parent, base)
    if os.path.lexists(dst) and not overwrite:
        raise InputError(f"{dst} exists: pass --overwrite (overwrite=True) to replace it")
    tmp = os.path.join(parent, f".{base}.unweight-tmp-{os.getpid()}")
    old = os.path.join(parent, f".{base}.unweight-old-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        yield tmp
        with _signals_held():
            _swap(tmp, dst, old)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            raise InputError(f"no space left on device while writing {dst}; nothing was written") from None
        raise InputError(f"cannot write {dst}: {e.strerror or e}") from None
    except BaseException:
        # Also a signal delivered after a completed swap: tmp is gone then and this is a no-op.
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def same_or_inside(a: str, b: str) -> bool:
    """True when a and b are the same path or one lies inside the other (symlinks resolved)."""
    a, b = os.path.realpath(a), os.path.realpath(b)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep) or b.startswith(a.rstrip(os.sep) + os.sep)


def copy_side_files(src_folder: str | None, dst: str, skip=()) -> list[str]:
    """Copy tokenizer, generation config, chat template, README...: every non-weight file of
    src_folder (hidden files and the top-level names in `skip` left out); returns their paths
    relative to src_folder."""
    if not src_folder:
        return []
    copied = []
    for root, dirs, files in os.walk(src_folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = os.path.relpath(root, src_folder)
        for f in files:
            if f in skip and rel == "." or f.endswith(WEIGHT_EXTS) or f.startswith("."):
                continue
            out_dir = os.path.join(dst, rel) if rel != "." else dst
            os.makedirs(out_dir, exist_ok=True)
            shutil.copy2(os.path.join(root, f), os.path.join(out_dir, f))
            copied.append(os.path.normpath(os.path.join(rel, f)))
    return copied
