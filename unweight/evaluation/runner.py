"""``unweight eval``'s run: both models through lm-eval with identical settings, then the
comparison (see the package docstring)."""
from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.util
import logging
import numbers
import os
import time

from ..format.errors import InputError
from ..sources import as_path
from .bitwise import bitwise_by_construction, fused_kernels
from .compare import LL_TOLERANCE, METRIC_TOLERANCE, compare_metrics, compare_samples, judge, sample_table
from .models import (_config_dict, _load_compressed, _load_original, _load_tokenizer, _resolve_original,
                     check_causal_lm, check_compatible, check_weights, looks_compressed)
from .report import _git_commit, _versions
from .tasks import evals_dir, resolve_tasks, tasks_module
from ..runtime.modes import MODES, check_mode  # noqa: F401  (MODES re-exported)

log = logging.getLogger(__name__)


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
_INSTALL_LM_EVAL = 'pip install "unweight[eval]"'


def _require_lm_eval():
    if importlib.util.find_spec("lm_eval") is None:
        raise InputError(f"lm-eval is not installed: {_INSTALL_LM_EVAL}")
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError as e:
        raise InputError(f"lm-eval cannot be imported ({e}): {_INSTALL_LM_EVAL}") from None


@contextlib.contextmanager
def _quiet_git_hash():
    """lm-eval runs `git describe` in the working directory and lets git print "fatal: not a
    git repository" to stderr outside one; the hash it records (of wherever the command was
    started) is not used here: the result records unweight's own commit."""
    import lm_eval.evaluator as evaluator
    saved = getattr(evaluator, "get_git_commit_hash", None)
    if saved is None:
        yield
        return
    evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = saved


def _evaluate(model, tokenizer, tasks: list[str], limit, batch_size: int, task_manager, seed: int = 1234,
              samples: dict | None = None):
    """lm-eval on `model`; samples: {task: [document indices]} to run instead of the first
    `limit` documents (lm-eval's own selection; None: limit)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, softmax_dtype="float32")
    t0, c0 = time.perf_counter(), time.process_time()
    pick = {"samples": samples} if samples is not None else {"limit": limit}
    with _quiet_git_hash():
        out = simple_evaluate(model=lm, tasks=list(tasks), log_samples=True, task_manager=task_manager,
                              bootstrap_iters=0, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                              fewshot_random_seed=seed, **pick)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    if out is None:  # pragma: no cover - only on non-zero ranks
        raise InputError("lm-eval returned no results")
    return {"results": out["results"], "samples": out.get("samples", {}), "n-samples": out.get("n-samples", {}),
            "seconds": secs, "cpu_seconds": cpu}


def _count(value, flag: str) -> int:
    """An int >= 1 (not a bool) or InputError naming the option."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{flag} must be a positive integer, got {value!r}")
    return int(value)


def run(original, compressed, tasks=None, limit: int | None = None, device: str = "cpu",
        mode: str = "dense", batch_size: int = 16, ll_tolerance: float = LL_TOLERANCE,
        metric_tolerance: float = METRIC_TOLERANCE, threads: int | None = None, check: str = "auto",
        quiet: bool = True, progress=None) -> dict:
    """Evaluate ORIGINAL and COMPRESSED with lm-eval and compare them (see module docstring).

    check: "auto" (bitwise where the compressed path is bitwise by construction, else
    tolerance), "bitwise" or "tolerance" to force one.  Returns a JSON-able dict;
    result["check"]["passed"] is the verdict.  Bad input raises InputError (one line).
    progress: optional callable(str) for status lines."""
    say = progress or (lambda s: None)
    original, compressed = as_path(original, "ORIGINAL"), as_path(compressed, "COMPRESSED")
    check_mode(mode)
    limit = None if limit is None else _count(limit, "--limit")
    if check not in ("auto", "bitwise", "tolerance"):
        raise InputError(f"unknown check {check!r}: choose auto, bitwise, tolerance")
    batch_size = _count(batch_size, "--batch-size")
    threads = None if threads is None else _count(threads, "--threads")
    if not isinstance(device, str):
        raise InputError(f"device must be a str (cpu, cuda or cuda:N), got {type(device).__name__}")
    _require_lm_eval()
    task_names = resolve_tasks(tasks)
    if not os.path.isdir(compressed):
        hint = (f"; ORIGINAL {original} is one: the arguments are swapped? (unweight eval ORIGINAL COMPRESSED)"
                if os.path.isdir(original) and looks_compressed(original) else "")
        raise InputError(f"{compressed}: no such folder (COMPRESSED is a folder written by `unweight compress`)"
                         + hint)
    orig_path = _resolve_original(original)
    orig_cfg, comp_cfg = _config_dict(orig_path, "original"), _config_dict(compressed, "compressed")
    check_causal_lm(orig_cfg, original)  # check_compatible holds COMPRESSED to the same config
    orig_tok, comp_tok = _load_tokenizer(orig_path, "original"), _load_tokenizer(compressed, "compressed")
    check_compatible(orig_cfg, comp_cfg, orig_tok, comp_tok)
    check_weights(orig_path, "original")
    check_weights(compressed, "compressed")

    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device is visible to torch (use --device cpu)")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise InputError(f"unknown device {device!r}: choose cpu or cuda[:N]")
    os.environ.update(OFFLINE_ENV)
    if threads:
        torch.set_num_threads(threads)
    if quiet:  # lm-eval warns about every pre-built model and custom dataset; transformers about device maps
        for name in ("lm_eval", "lm-eval", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)

    from lm_eval.tasks import TaskManager
    tm = TaskManager(include_path=evals_dir(), include_defaults=False)
    t_start = time.perf_counter()

    say(f"original: loading {orig_path}")
    t0 = time.perf_counter()
    model = _load_original(orig_path, device)
    load_o = time.perf_counter() - t0
    say(f"original: evaluating {', '.join(task_names)} (limit {limit}, batch {batch_size}, {device})")
    ro = _evaluate(model, orig_tok, task_names, limit, batch_size, tm)
    del model
    gc.collect()

    say(f"compressed: loading {compressed} (mode {mode})")
    t0 = time.perf_counter()
    model = _load_compressed(compressed, device, mode)
    load_c = time.perf_counter() - t0
    bitwise = bitwise_by_construction(model, mode, device) if check == "auto" else check == "bitwise"
    info = dict(getattr(model, "unweight_info", None) or {})
    fused = fused_kernels(model)
    say(f"compressed: evaluating ({'bitwise' if bitwise else 'tolerance'} check)")
    rc = _evaluate(model, comp_tok, task_names, limit, batch_size, tm)
    del model
    gc.collect()

    s_cmp = compare_samples(sample_table(ro["samples"]), sample_table(rc["samples"]))
    rows = compare_metrics(ro["results"], rc["results"])
    groups = tasks_module().GROUPS
    leaves = [sub for t in task_names for sub in groups.get(t, (t,))]  # lm-eval logs a group's samples per member
    verdict = judge(s_cmp, rows, bitwise, ll_tolerance, metric_tolerance, expected_tasks=leaves)
    n_docs = {t: len(v) for t, v in sample_table(ro["samples"]).items()}
    return {
        "model": {"original": original, "original_path": orig_path, "compressed": compressed,
                  "architecture": (orig_cfg.get("architectures") or [orig_cfg.get("model_type")])[0],
                  "encoding": (comp_cfg.get("quantization_config") or {}).get("encoding")},
        "tasks": task_names, "limit": limit, "docs_per_task": n_docs, "device": device, "mode": mode,
        "batch_size": batch_size, "threads": torch.get_num_threads(), **_git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "versions": _versions(),
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "lm_eval_settings": {"model": "HFLM(pretrained=<model>, tokenizer=<tokenizer>)", "softmax_dtype": "float32",
                             "num_fewshot": None, "bootstrap_iters": 0, "log_samples": True, "seed": 1234},
        "seconds": {"load_original": round(load_o, 2), "eval_original": round(ro["seconds"], 2),
                    "load_compressed": round(load_c, 2), "eval_compressed": round(rc["seconds"], 2),
                    "total": round(time.perf_counter() - t_start, 2),
                    # CPU time of this process (all threads): what the run costs on an idle machine
                    "cpu_eval_original": round(ro["cpu_seconds"], 2),
                    "cpu_eval_compressed": round(rc["cpu_seconds"], 2)},
        "compressed_runtime": {"unweight_info": {k: v for k, v in info.items() if k in ("mode", "modules", "held_bytes",
                                                                                          "bf16_bytes", "ratio")},
                               "fused_kernels": fused},
        "metrics": rows,
        "samples": s_cmp,
        "check": verdict,
    }

