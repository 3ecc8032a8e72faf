"""Comparing two lm-eval runs: per-sample responses bit for bit, metrics side by side, and the
verdict (bitwise, or within tolerances)."""
from __future__ import annotations

import hashlib
import math
import struct

LL_TOLERANCE = 0.05       # nats per request, fused-kernel modes only

METRIC_TOLERANCE = 0.02   # absolute, per metric, fused-kernel modes only


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
           "first_difference": None, "sha256": {}, "samples_per_task": {}}
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
        res["samples_per_task"][task] = len(a)
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


def unrun_tasks(sample_cmp: dict, expected_tasks=None) -> list[str]:
    """Tasks (lm-eval's leaf task names) of which no sample was compared.  Without
    expected_tasks, only a comparison of nothing at all (no sample, or no value) counts."""
    per_task = sample_cmp.get("samples_per_task") or {}
    if expected_tasks is not None:
        return [t for t in expected_tasks if not per_task.get(t)]
    return ["(every task)"] if not sample_cmp["samples"] or not sample_cmp["values"] else []


def judge(sample_cmp: dict, metric_rows: list[dict], bitwise: bool, ll_tolerance: float = LL_TOLERANCE,
          metric_tolerance: float = METRIC_TOLERANCE, expected_tasks=None) -> dict:
    """The verdict: {"kind", "passed", "message", tolerances}; a passing tolerance check whose
    samples all came out bitwise identical also carries "identical": True ("kind" stays the
    check that was applied).

    expected_tasks: the leaf tasks that must each have compared at least one sample; with or
    without it, a comparison of no sample at all fails: identical-because-empty proves nothing."""
    out = {"kind": "bitwise" if bitwise else "tolerance", "ll_tolerance": None if bitwise else ll_tolerance,
           "metric_tolerance": None if bitwise else metric_tolerance}
    empty = unrun_tasks(sample_cmp, expected_tasks) or unrun_tasks(sample_cmp)
    presence = bool(sample_cmp["first_difference"] and sample_cmp["first_difference"].get("why"))
    if empty and not presence:  # a sample in one run only fails below, naming it
        what = "nothing was compared" if empty == ["(every task)"] else \
            f"no sample of {', '.join(empty)} was compared"
        return {**out, "passed": False, "message": f"{what} ({sample_cmp['samples']} samples, "
                                                   f"{sample_cmp['values']} values): nothing was checked"}
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
    if problems:
        return {**out, "passed": False, "message": "; ".join(problems) + " -- " + stats}
    if sample_cmp["identical"]:  # the tolerance check was chosen beforehand, yet nothing differed: say so
        return {**out, "passed": True, "identical": True,
                "message": (f"per-sample log-likelihoods bitwise identical ({sample_cmp['samples']} samples, "
                            f"{sample_cmp['values']} values) under a tolerance check: {stats}")}
    return {**out, "passed": True, "message": stats}

