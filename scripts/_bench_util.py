"""Shared pieces of the benchmark harnesses (scripts/bench_*.py): environment check,
CUDA-event timing, shape table, result JSON and its name (benchmarks/README.md).  Not part of
the library."""
from __future__ import annotations

import csv
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def require_gpu():
    """Exit with status 2 and one line on stderr when there is no CUDA GPU or no _cuda module."""
    try:
        import torch
    except ImportError:
        print("bench: torch is not installed; this benchmark needs torch with CUDA", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to measure", file=sys.stderr)
        sys.exit(2)
    try:
        from unweight import _cuda  # noqa: F401
    except ImportError:
        print("bench: unweight._cuda is not built (reinstall with nvcc available)", file=sys.stderr)
        sys.exit(2)
    return torch


def load_shapes(path=None, models=None):
    """Rows of benchmarks/shapes.csv as dicts (model, layer, N, K); '#' lines are comments."""
    path = path or os.path.join(ROOT, "benchmarks", "shapes.csv")
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    rows = [dict(r, N=int(r["N"]), K=int(r["K"])) for r in csv.DictReader(lines)]
    return [r for r in rows if not models or r["model"] in models]


def time_cuda(torch, fn, warmup=5, iters=50):
    """Median milliseconds of fn() over `iters` runs, each bracketed by CUDA events (the same
    measurement the runtime's dispatch tuning uses)."""
    from unweight.runtime.tuning import time_cuda as _time_cuda
    return _time_cuda(fn, warmup=warmup, iters=iters)


def environment(torch):
    dev = torch.cuda.get_device_properties(0)
    driver = ""
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - informative only
        pass
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        commit = ""
    return {"gpu": dev.name, "sm": f"{dev.major}{dev.minor}", "driver": driver, "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "git_commit": commit}


def short_commit():
    """HEAD's short hash, with '-dirty' when tracked files differ from it ('' outside git)."""
    def git(*a):
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("-dirty" if commit and git("status", "--porcelain", "--untracked-files=no") else "")
    except Exception:  # noqa: BLE001 - informative only
        return ""


def machine_tag(gpu_name=None):
    """Short name of the measuring machine: the GPU's model ('h100-80gb-hbm3') or, for a
    CPU-only run, 'cpu' and the core count ('cpu2')."""
    if gpu_name:
        return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-").removeprefix("nvidia-")
    return f"cpu{os.cpu_count()}"


def result_path(name, machine, commit=None):
    """benchmarks/results/<name>-<UTC date>-<machine>-<short commit>.json; a repeated run on the
    same day and commit gets -run2, -run3, ... rather than overwriting the first."""
    out_dir = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out_dir, exist_ok=True)
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    stem = "-".join(p for p in (name, day, machine, commit if commit is not None else short_commit()) if p)
    path, n = os.path.join(out_dir, stem + ".json"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(out_dir, f"{stem}-run{n}.json")
    return path


def write_results(name, env, rows):
    commit = env.get("git_commit", "")[:7]
    path = result_path(name, machine_tag(env["gpu"]), commit or None)
    with open(path, "w") as f:
        json.dump({"benchmark": name, "environment": env, "results": rows}, f, indent=1)
    return path


def print_table(rows, cols):
    widths = [max(len(c), *(len(f"{r[c]}") for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(f"{r[c]}".rjust(w) for c, w in zip(cols, widths)))


def bf16_weights(torch, N, K, seed=0):
    """Trained-like BF16 weights on the GPU: N(0, 0.02) (exponent statistics like real layers)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn((N, K), generator=g, device="cuda") * 0.02).to(torch.bfloat16)
