"""Task resolution: where the lm-eval task files are and which task names they define.

The files (``lm_eval_tasks/``: one YAML per task, the MMLU subjects, and ``tasks.py``, the
data loaders lm-eval calls through ``!function``) ship inside the package, so ``unweight
eval`` works from a wheel; UNWEIGHT_EVALS_DIR points at another folder of the same shape.
"""
from __future__ import annotations

import importlib.util
import logging
import os

from ..format.errors import InputError

log = logging.getLogger(__name__)

DEFAULT_TASKS = ("arc_easy", "piqa", "hellaswag")
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_eval_tasks")


def evals_dir() -> str:
    """The folder of task YAMLs: $UNWEIGHT_EVALS_DIR, else the package's lm_eval_tasks/."""
    d = os.environ.get("UNWEIGHT_EVALS_DIR") or TASKS_DIR
    if not os.path.isfile(os.path.join(d, "tasks.py")):
        raise InputError(f"task files not found in {d} (no tasks.py): reinstall unweight, or point "
                         "UNWEIGHT_EVALS_DIR at a folder of lm-eval task files")
    return d


def tasks_module():
    """lm_eval_tasks/tasks.py, loaded by path as lm-eval does (it is the YAMLs' ``!function`` module)."""
    path = os.path.join(evals_dir(), "tasks.py")
    spec = importlib.util.spec_from_file_location("_unweight_evals_tasks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def available_tasks() -> list[str]:
    t = tasks_module()
    return sorted(t.TASK_DATA) + sorted(t.GROUPS)


def resolve_tasks(spec) -> list[str]:
    """'arc_easy,piqa' or a list -> task names; unknown names and missing data raise InputError.

    A task that is part of a group also given (mmlu_anatomy with mmlu) is left to the group,
    whose results hold its row: lm-eval refuses a task twice."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or DEFAULT_TASKS)
    bad = [s for s in items if not isinstance(s, str)]
    if bad:
        raise InputError(f"task names must be str, got {type(bad[0]).__name__} ({bad[0]!r})")
    names = [s.strip() for s in items if s.strip()]
    if not names:
        raise InputError("no tasks given: choose from " + _task_choices())
    t = tasks_module()
    out = []
    for n in names:
        if n not in t.TASK_DATA and n not in t.GROUPS:
            raise InputError(f"unknown task {n!r}: choose from {_task_choices()}")
        if n not in out:
            out.append(n)
    in_group = {sub: g for g in out if g in t.GROUPS for sub in t.GROUPS[g]}
    for n in [n for n in out if n in in_group]:
        log.info("task %s is part of %s: run once, within the group", n, in_group[n])
        out.remove(n)
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

