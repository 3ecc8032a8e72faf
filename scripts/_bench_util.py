"""Shared pieces of the benchmark harnesses (scripts/bench_*.py) and the GPU runbook
(scripts/gpu_check.py): environment record, GPU timing with CUDA graphs and L2-defeating
rotation, shape table, result JSON and its name (benchmarks/README.md).  Not part of the
library.

GPU timing method (``graph_time``): every variant is handed as k callables, one per copy of
its inputs, with k copies spanning at least 4x the L2 so no launch finds its weights in L2;
L launches (round robin over the copies) are captured in one CUDA graph and the graph is
replayed between two CUDA events, >= 20 times, with no host synchronization inside the
timed region; the per-launch time is the replay time / L (median and min reported, every
run kept).  When capture fails (an op that syncs with the host), the same L launches run as
an eager loop between the events and the record says so.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import functools
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Llama-3.1-8B layer shapes [N, K] (out_features, in_features): y[M, N] = x[M, K] @ W^T.
LLAMA8B_SHAPES = (("attn_o", 4096, 4096), ("qkv", 6144, 4096), ("mlp_up", 14336, 4096),
                  ("mlp_down", 4096, 14336), ("lm_head", 128256, 4096))
BATCHES = (1, 2, 4, 8, 16, 32, 64)
ROTATE_L2_FACTOR = 4  # copies of a variant's inputs span >= this many L2 sizes


def require_gpu():
    """torch, or exit with status 2 and one line on stderr when there is no CUDA GPU or no
    compiled unweight._cuda."""
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
        print("bench: unweight._cuda is not built (python setup.py build_ext --inplace with nvcc available)",
              file=sys.stderr)
        sys.exit(2)
    return torch


def fail(message: str, code: int = 2):
    """Exit with `message` as the one line on stderr (the harnesses' way of saying they cannot
    do what was asked: no traceback, nothing written)."""
    print(message, file=sys.stderr)
    sys.exit(code)


# argparse types: a bad value is refused before anything is built or measured, as one
# "error:" line under the usage, instead of a traceback (or a zero-repeat median) later.
def _int_at_least(text: str, least: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"{v} is not >= {least}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0")
    return v


def positive_int_list(text: str) -> list[int]:
    """'1,16' -> [1, 16], every entry >= 1."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("empty list")
    return [positive_int(p.strip()) for p in parts]


def shapes_arg(text: str):
    """--shapes as an argparse type: parse_shapes' list, a bad entry refused as an argument error."""
    try:
        return parse_shapes(text)
    except SystemExit as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def writable_path(path: str, who: str = "bench") -> str:
    """`path` (absolute), its folder created; exits with one line when the result JSON could not
    be written there.  Called before measuring, so a bad --out costs nothing."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        fail(f"{who}: {path} is a folder; give a file name for the result JSON")
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError:  # a file where a folder of the path should be
        fail(f"{who}: cannot write {path}: a part of its folder is a file")
    except OSError as e:
        fail(f"{who}: cannot create the folder for {path}: {e.strerror or e}")
    if not os.access(folder, os.W_OK):
        fail(f"{who}: cannot write into {folder} (permission denied)")
    return path


def read_result(path: str, who: str):
    """The JSON document at `path` (a recorded result), or None after one line on stderr when
    it cannot be read or parsed."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"{who}: {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return None


def tuning_stamp(env: dict, who: str, source: str | None = None, when: str | None = None) -> str:
    """Where a tuning table's measurements come from, for its comment: GPU, sm (when recorded),
    driver, torch, date (`when` where env has none), code, the script, and the recorded result
    it was taken from (`source`)."""
    sm = f"sm {env['sm']}, " if env.get("sm") else ""
    code = env.get("commit") or (env.get("source_sha256") or "")[:12]
    return (f"measured on {env.get('gpu')} ({sm}driver {env.get('driver')}, torch {env.get('torch')}) at "
            f"{env.get('date') or when}, code {code}, by scripts/{who}.py"
            + (f" (taken from {os.path.basename(source)})" if source else ""))


def write_tuning(measured, cache_path: str | None, defaults: bool, stamp: str, who: str) -> int:
    """Record a TuningTable of measurements in the user's tuning cache (cache_path: "" for the
    default, None for none) and/or, with defaults, the shipped tuning_defaults.json (entries of
    other devices and shapes are kept).  Returns 0, or 1 with one line when a file cannot be
    written."""
    from unweight.runtime import tuning_table as tt
    try:
        if cache_path is not None:
            path = cache_path or tt.default_cache_path()
            t = tt.TuningTable.load(path).update(measured)
            t.comment = t.comment or "unweight tuning cache"
            print("wrote", t.save(path))
        if defaults:
            t = tt.TuningTable.load(tt.DEFAULTS_PATH).update(measured)
            t.comment = ("Shipped dispatch defaults, written by scripts/bench_kernels.py and scripts/bench_decode.py "
                         "--write-defaults; a fused path is listed only where it beat decode + cuBLAS in the same "
                         "run, a decoder variant only where it beat the default decoder in the same run. Last "
                         + stamp + ".")
            print("wrote", t.save(tt.DEFAULTS_PATH))
    except OSError as e:
        print(f"{who}: cannot write the tuning table {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def measured_rows(res) -> list:
    """The rows of a decode or kernels result that hold a timing (not an error, not skipped)."""
    return [r for r in res.get("rows", ()) if "error" not in r and "skipped" not in r]


def nothing_measured(who: str, res, path: str) -> int:
    """Exit status of a harness's main: 0 when at least one row was timed; otherwise one line
    saying so (the JSON at `path` records only errors and skips) and 1."""
    if measured_rows(res):
        return 0
    why = "; ".join(f"{r.get('shape')}: {r['error']}" for r in res.get("rows", ()) if "error" in r)
    why = why or "; ".join(f"{s.get('shape') or s.get('variant')}: {s['why']}" for s in res.get("skipped", ())
                           if s.get("shape"))
    print(f"{who}: nothing was measured ({why or 'no shape ran'}); {path} records only the errors and skips",
          file=sys.stderr)
    return 1


def load_shapes(path=None, models=None):
    """Rows of benchmarks/shapes.csv as dicts (model, layer, N, K); '#' lines are comments."""
    path = path or os.path.join(ROOT, "benchmarks", "shapes.csv")
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    rows = [dict(r, N=int(r["N"]), K=int(r["K"])) for r in csv.DictReader(lines)]
    return [r for r in rows if not models or r["model"] in models]


def parse_shapes(spec: str | None):
    """'4096x4096,6144x4096' -> [(name, N, K)]; None -> LLAMA8B_SHAPES."""
    if not spec:
        return list(LLAMA8B_SHAPES)
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)x(\d+)\s*", part)
        if not m:
            raise SystemExit(f"bad shape {part!r}: write NxK, e.g. 4096x14336")
        out.append((f"{m.group(1)}x{m.group(2)}", int(m.group(1)), int(m.group(2))))
    return out


# --------------------------------------------------------------------------- provenance


def _run(cmd, timeout=20) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# What the card ran at while a benchmark timed it (nvidia-smi's own sampling; the clocks are
# read, never set): the SM and memory clocks, power and temperature, and the reasons the driver
# gave for holding the clocks down.  The kernels' times divided into cycles need the SM clock
# they ran at, which the benchmarks' timers do not give.
CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
CLOCK_REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # (newer, older drivers)


class ClockSampler:
    """nvidia-smi sampling GPU 0 every `period_ms` while the block runs; summary() gives
    {"samples", "<field>": {"min", "median", "max"}, "reasons": [...]} or {"error": ...} where
    nvidia-smi is missing or refuses the query.  Costs no GPU time."""

    def __init__(self, period_ms: int = 250):
        self.period_ms, self.proc, self.reasons_field, self.out = period_ms, None, None, ""

    def __enter__(self):
        for reasons in CLOCK_REASONS:
            query = ",".join(CLOCK_FIELDS + (reasons,))
            # (a field this nvidia-smi does not know is refused in words on stdout, not a sample)
            if clock_summary(_run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"]),
                             reasons)["samples"]:
                self.reasons_field = reasons
                try:
                    self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                                                  "-i", "0", "-lms", str(self.period_ms)],
                                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                except OSError:
                    self.proc = None
                break
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.out, _ = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.out, _ = self.proc.communicate()
        return False

    def summary(self) -> dict:
        return clock_summary(self.out, self.reasons_field) if self.reasons_field else {"error": "no nvidia-smi clocks"}


def clock_summary(text: str, reasons_field: str = CLOCK_REASONS[0]) -> dict:
    """ClockSampler's summary of nvidia-smi's CSV lines (CLOCK_FIELDS, then the reasons mask)."""
    cols: list = [[] for _ in CLOCK_FIELDS]
    masks = set()
    n = 0
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(CLOCK_FIELDS) + 1 or not parts[-1].lower().startswith("0x"):
            continue
        n += 1
        for c, p in zip(cols, parts[:-1]):
            try:
                c.append(float(p))
            except ValueError:  # ([N/A] where the card does not report the field)
                pass
        masks.add(parts[-1])
    out: dict = {"samples": n, "reasons_field": reasons_field}
    for f, c in zip(CLOCK_FIELDS, cols):
        if c:
            out[f] = {"min": min(c), "median": statistics.median(c), "max": max(c)}
    out["reasons"] = sorted(masks)
    return out


def short_commit():
    """HEAD's short hash, with '-dirty' when tracked files differ from it ('' outside git)."""
    commit = _run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    if not commit:
        return ""
    return commit + ("-dirty" if _run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]) else "")


SOURCE_GLOBS = ("setup.py", "pyproject.toml", "csrc", "unweight", "scripts", "tests/cuda", "evals")
SOURCE_EXT = (".py", ".h", ".cuh", ".cu", ".cpp", ".toml", ".yaml", ".sh")


def is_source(rel: str) -> bool:
    """Whether the file at `rel` (relative to the repository root, '/'-separated) is one whose
    content identifies the code measured: under SOURCE_GLOBS, with a SOURCE_EXT ending, outside
    __pycache__ and hidden folders."""
    if rel in SOURCE_GLOBS:
        return True
    parts = rel.split("/")
    return (any(rel.startswith(g + "/") for g in SOURCE_GLOBS) and rel.endswith(SOURCE_EXT)
            and not any(p == "__pycache__" or p.startswith(".") for p in parts[:-1]))


def source_files() -> list[str]:
    """Source files whose content identifies the code measured (relative, sorted)."""
    out = []
    for top in SOURCE_GLOBS:
        p = os.path.join(ROOT, top)
        if os.path.isfile(p):
            out.append(top)
            continue
        for d, dirs, files in os.walk(p):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            out += [r for r in (os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/") for f in files)
                    if is_source(r)]
    return sorted(out)


def _digest(files) -> str:
    """sha256 over (relative path, sha256 of the content) pairs, in path order."""
    h = hashlib.sha256()
    for rel, content_sha in sorted(files):
        h.update(rel.encode() + b"\0")
        h.update(content_sha)
    return h.hexdigest()


def source_digest() -> str:
    """sha256 over the paths and bytes of source_files(): names the code on a machine that has
    the files but no .git (the device copy of the working tree); render_gpu_results.py
    matches it against local commits (commit_for_digest)."""
    def content(rel):
        with open(os.path.join(ROOT, rel), "rb") as f:
            return hashlib.sha256(f.read()).digest()
    return _digest((rel, content(rel)) for rel in source_files())


def is_build_input(rel: str) -> bool:
    """Whether `rel` is read by the extensions' build (setup.py, pyproject.toml, csrc/)."""
    return rel in ("setup.py", "pyproject.toml") or rel.startswith("csrc/")


def build_digest() -> str:
    """source_digest() over the extensions' build inputs only (is_build_input): names a build
    of unweight._C / unweight._cuda, which no Python source changes."""
    def content(rel):
        with open(os.path.join(ROOT, rel), "rb") as f:
            return hashlib.sha256(f.read()).digest()
    return _digest((rel, content(rel)) for rel in source_files() if is_build_input(rel))


@functools.lru_cache(maxsize=None)
def commit_for_digest(digest: str, depth: int = 60) -> str:
    """The short hash of the oldest of HEAD's last `depth` commits whose tracked source files
    give `digest` (source_digest() of that commit's tree), or '' when none does.  Names the code
    a device run measured: its copy of the tree carries no trustworthy git state."""
    if not digest:
        return ""
    blob_sha = {}

    def content(oid):
        if oid not in blob_sha:
            data = subprocess.run(["git", "-C", ROOT, "cat-file", "blob", oid], capture_output=True,
                                  check=False).stdout
            blob_sha[oid] = hashlib.sha256(data).digest()
        return blob_sha[oid]

    found = ""
    for c in _run(["git", "-C", ROOT, "rev-list", f"--max-count={depth}", "HEAD"]).split():
        files = []
        for line in _run(["git", "-C", ROOT, "ls-tree", "-r", c], timeout=60).splitlines():
            meta, _, rel = line.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob" and is_source(rel):
                files.append((rel, content(parts[2])))
        if _digest(files) == digest:
            found = c  # keep going: the oldest of a run of commits with this code is where it was made
        elif found:
            break
    return _run(["git", "-C", ROOT, "rev-parse", "--short", found]) if found else ""


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


def environment(torch=None) -> dict:
    """Where and what was measured: GPU, driver, CUDA, torch, Python, code identity, date.
    Works without a GPU (the GPU fields are then None)."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "host_cpus": os.cpu_count(), "commit": short_commit() or None,
           "source_sha256": source_digest(), "gpu": None}
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"])
    if smi:
        env["nvidia_smi"] = smi.splitlines()[0]
        parts = [p.strip() for p in env["nvidia_smi"].split(",")]
        env["driver"] = parts[1] if len(parts) > 1 else None
    nvcc = _run(["nvcc", "--version"])
    env["nvcc"] = (re.findall(r"release [\d.]+, V[\d.]+", nvcc) or [None])[0]
    if torch is None:
        try:
            import torch
        except ImportError:
            return env
    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm=f"{p.major}{p.minor}", sm_count=p.multi_processor_count,
                   l2_bytes=int(getattr(p, "L2_cache_size", 0)), memory_bytes=int(p.total_memory),
                   bf16_reduced_precision_reduction=bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction))
    return env


def json_safe(obj):
    """obj with NaN / infinity floats as the strings "nan" / "inf" / "-inf" (strict JSON) and
    unknown objects as their str()."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else ("nan" if obj != obj else ("inf" if obj > 0 else "-inf"))
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # NumPy / torch scalars
        try:
            return json_safe(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)


def write_json(path: str, obj) -> str:
    """Write obj as indented strict JSON atomically (a killed run leaves the previous file whole)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(json_safe(obj), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def write_results(name, env, rows):
    commit = (env.get("commit") or env.get("git_commit") or "")[:7]
    path = result_path(name, machine_tag(env.get("gpu")), commit or None)
    return write_json(path, {"benchmark": name, "environment": env, "results": rows})


def print_table(rows, cols):
    if not rows:
        print("(no rows)")
        return
    widths = [max(len(c), *(len(f"{r.get(c, '')}") for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(f"{r.get(c, '')}".rjust(w) for c, w in zip(cols, widths)))


# --------------------------------------------------------------------------- budgets


class Budget:
    """Seconds left until a deadline; parts of a run ask before starting."""

    def __init__(self, seconds: float):
        self.t0 = time.monotonic()
        self.seconds = float(seconds)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def sub(self, seconds: float) -> "Budget":
        """A budget of min(seconds, what is left here)."""
        return Budget(max(0.0, min(seconds, self.left())))


class WorkEstimate:
    """Seconds the next part of a run (one shape) will take, from the parts already timed.

    Before two parts have been timed it is the prior, `fixed + per_unit * units` (units: the
    part's size, e.g. weights x batches).  From two on it is a least-squares line through the
    timed (units, seconds), intercept and slope kept non-negative, times `margin`: a prior
    written for the slowest machine would otherwise skip a large last shape that the run's own
    rate shows would fit (the H200 bench left the lm_head out asking 42 s, when the four shapes
    before it had taken 17 s together)."""

    def __init__(self, fixed: float, per_unit: float, margin: float = 1.3):
        self.fixed, self.per_unit, self.margin = float(fixed), float(per_unit), float(margin)
        self.timed: list[tuple[float, float]] = []

    def record(self, units: float, seconds: float) -> None:
        self.timed.append((float(units), float(seconds)))

    def need(self, units: float) -> float:
        if len(self.timed) < 2:
            return self.fixed + self.per_unit * units
        n = len(self.timed)
        mu = sum(u for u, _ in self.timed) / n
        ms = sum(t for _, t in self.timed) / n
        var = sum((u - mu) ** 2 for u, _ in self.timed)
        slope = max(0.0, sum((u - mu) * (t - ms) for u, t in self.timed) / var) if var > 0 else 0.0
        icept = ms - slope * mu
        if icept < 0:  # through the origin instead
            icept, slope = 0.0, sum(u * t for u, t in self.timed) / max(sum(u * u for u, _ in self.timed), 1e-30)
        if slope == 0.0:  # equal sizes, or no growth: the slowest part timed
            icept = max(t for _, t in self.timed)
        return self.margin * (icept + slope * units)


# --------------------------------------------------------------------------- GPU timing


def device(torch) -> str:
    """"cuda" when a GPU is visible, else "cpu" (the harnesses' CPU self-test: same code, wall
    clock instead of CUDA events and graphs)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(torch) -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def empty_cache(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rotation_copies(bytes_per_copy: int, l2_bytes: int, factor: int = ROTATE_L2_FACTOR, cap: int = 64) -> int:
    """Copies of a variant's inputs so that together they span >= factor x L2 (at least 1)."""
    if bytes_per_copy <= 0:
        return 1
    return max(1, min(cap, math.ceil(factor * max(l2_bytes, 1) / bytes_per_copy)))


def l2_bytes(torch) -> int:
    """The GPU's L2 size (50 MB on an H100 when torch does not report it; 1 MiB on CPU)."""
    if not torch.cuda.is_available():
        return 2 ** 20
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 * 2 ** 20)


def graph_time(torch, fns, target_ms: float = 3.0, runs: int = 25, max_launches: int = 4096,
               use_graph: bool = True) -> dict:
    """Per-launch milliseconds of the callables `fns` (one per rotation copy), by the method in
    the module docstring.  Returns median_ms, min_ms, runs_ms (every run), launches (L per run),
    copies (k), graph (captured or eager) and graph_error."""
    k = len(fns)
    if not torch.cuda.is_available():
        return _wall_time(fns, runs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first calls off the capture stream: cuBLAS handles, workspaces
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for f in fns:
        f()
    b.record()
    b.synchronize()
    est = max(a.elapsed_time(b) / k, 1e-4)
    per_copy = max(1, math.ceil(target_ms / est / k))
    L = k * min(per_copy, max(1, max_launches // k))

    def body():
        for i in range(L):
            fns[i % k]()

    run, graph, err, g = body, False, None, None
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                body()
            run, graph = g.replay, True
        except Exception as e:  # noqa: BLE001 - an op that cannot be captured: time it eagerly
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            g = None
            torch.cuda.synchronize()
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for s, e in evs:
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    per = [s.elapsed_time(e) / L for s, e in evs]
    del g
    return {"median_ms": statistics.median(per), "min_ms": min(per), "runs_ms": [round(t, 6) for t in per],
            "launches": L, "copies": k, "graph": graph, "graph_error": err, "eager_estimate_ms": est}


def _wall_time(fns, runs: int) -> dict:
    """The CPU self-test's stand-in for graph_time: each callable once per run, wall clock."""
    per = []
    for _ in range(max(2, runs // 5)):
        t0 = time.perf_counter()
        for f in fns:
            f()
        per.append((time.perf_counter() - t0) * 1e3 / len(fns))
    return {"median_ms": statistics.median(per), "min_ms": min(per), "runs_ms": per, "launches": len(fns),
            "copies": len(fns), "graph": False, "graph_error": "no CUDA (CPU self-test)", "eager_estimate_ms": per[0]}


def copy_bandwidth(torch, nbytes: int = 1 << 30, runs: int = 20) -> dict:
    """Device-to-device copy rate (bytes read + written per second): the memory ceiling the
    decode and GEMV numbers are compared with."""
    if not torch.cuda.is_available():
        nbytes = min(nbytes, 1 << 22)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device(torch)).random_()
    dst = torch.empty_like(src)
    t = graph_time(torch, [lambda s=src, d=dst: d.copy_(s)], target_ms=20.0, runs=runs)
    t["GBps_read_plus_write"] = 2 * nbytes / (t["median_ms"] * 1e-3) / 1e9
    empty_cache(torch)
    return t


def bf16_weights(torch, N, K, seed=0, std=0.02):
    """Trained-like BF16 weights made on the GPU (the CPU in a self-test): N(0, std), exponent
    statistics like real layers."""
    g = torch.Generator(device=device(torch)).manual_seed(seed)
    return (torch.randn((N, K), generator=g, device=device(torch)) * std).to(torch.bfloat16)


def as_gpu_loaders_hold(w):
    """An EncodedWeight as the GPU loaders hold it: a palette weight's palette in paired order
    with its index rewritten to match (runtime.weights.hold_paired, the decode's cheaper
    lookup; the same weights) and its verbatim list's row index (hold_row_index, the fused
    kernels' cursors), in place."""
    from unweight.runtime.weights import hold_paired, hold_row_index
    return hold_row_index(hold_paired(w))


def clone_encoded(w, tiled: bool = False):
    """A copy of an EncodedWeight with its own device planes (a rotation copy); tiled: a
    palette weight's sm and idx permuted tile-major (ops.tile_palette_planes)."""
    from unweight.ops.layout import tile_palette_planes
    from unweight.runtime.weights import EncodedWeight

    def c(t):
        return None if t is None else t.clone()
    sm, idx = tile_palette_planes(w.sm, w.idx) if tiled else (c(w.sm), c(w.idx))
    return EncodedWeight(w.encoding, w.rows, w.cols, w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi,
                         list(w.palette), sm, exp=c(w.exp), off=c(w.off), table=c(w.table), lut=c(w.lut),
                         idx=idx, vpos=c(w.vpos), vexp=c(w.vexp), name=w.name, chk=c(w.chk),
                         chk_interval=w.chk_interval, tiled=tiled or w.tiled, vrow=c(w.vrow))


def encoded_bytes(w) -> int:
    """Bytes of an EncodedWeight's planes (what a decode or fused launch reads)."""
    return sum(int(t.numel() * t.element_size())
               for t in (w.sm, w.exp, w.off, w.idx, w.vpos, w.vexp, w.chk, w.vrow) if t is not None)


def import_helpers():
    """tests/cuda/helpers.py (the device helpers the GPU tests use), importable from scripts/."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tests.cuda import helpers
    return helpers
