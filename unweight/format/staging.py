"""Output staging: every output is built in a temporary folder next to its destination and
renamed into place only when complete, so an interrupted or failed run leaves the destination
as it was (absent, or the old copy) and the source untouched."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil

from .errors import InputError

log = logging.getLogger(__name__)

# Files of a checkpoint folder that hold weights (never copied as side files: the output
# writes its own).
WEIGHT_EXTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx")


def remove_stale_temps(parent: str, base: str):
    """Delete temp folders that a killed run (kill -9, power loss) left next to dst: their
    owning process is gone, so nobody will finish or rename them."""
    prefix = f".{base}.unweight-"
    for f in os.listdir(parent):
        if not f.startswith(prefix):
            continue
        try:
            pid = int(f.rsplit("-", 1)[1])
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
        p = os.path.join(parent, f)
        log.info("removing %s left by an interrupted run", p)
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)


@contextlib.contextmanager
def staged_output(dst: str, overwrite: bool):
    """Yield a temp folder next to dst; on success swap it into place, on any failure
    (exception, Ctrl-C) remove it and leave dst as it was."""
    dst = os.path.abspath(dst)
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise InputError(f"{parent}: output folder's parent does not exist")
    if os.path.exists(dst) and not overwrite:
        raise InputError(f"{dst} exists: pass --overwrite to replace it")
    remove_stale_temps(parent, os.path.basename(dst))
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.unweight-tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        old = None
        if os.path.exists(dst):
            old = os.path.join(parent, f".{os.path.basename(dst)}.unweight-old-{os.getpid()}")
            os.rename(dst, old)
        os.rename(tmp, dst)
        if old:
            shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.unlink(old)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            raise InputError(f"no space left on device while writing {dst}; nothing was written") from None
        raise InputError(f"cannot write {dst}: {e.strerror or e}") from None
    except BaseException:
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
