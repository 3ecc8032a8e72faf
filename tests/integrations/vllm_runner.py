"""Run one vLLM configuration in its own process and print one JSON line (tests, bench).

    python -m tests.integrations.vllm_runner '[{"model": DIR, "tp": 2, "eager": true}, ...]'

Configurations run one after another in this process (one vLLM import for all of them);
TP=1 uses the in-process "uni" executor.  Set VLLM_ENABLE_V1_MULTIPROCESSING=0 to keep the
engine core in this process too.  The caller sets
the environment (HF_HUB_OFFLINE, VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .vllm_model import make_llama, PROMPTS  # noqa: F401  (re-exported for callers)


def run_one(cfg: dict) -> dict:
    """Build an LLM for one configuration, generate greedily, time it if asked, tear it down.

    cfg: model, tp (1), eager (True), load_format ("auto"), prompts, max_tokens (12), timing.
    """
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = cfg.get("prompts") or PROMPTS
    t0 = time.perf_counter()
    kw = {}
    if cfg.get("tp", 1) == 1:
        kw["distributed_executor_backend"] = "uni"  # no worker process to spawn: faster CI
    try:
        llm = LLM(model=cfg["model"], dtype="bfloat16", tensor_parallel_size=cfg.get("tp", 1),
                  enforce_eager=cfg.get("eager", True), max_model_len=256, skip_tokenizer_init=True,
                  load_format=cfg.get("load_format", "auto"), seed=0, max_num_seqs=8, **kw)
    except Exception as e:  # one line for the caller to assert on
        # vLLM wraps config-time errors (pydantic); keep every line, joined, for asserting
        return {"error": " | ".join(f"{type(e).__name__}: {e}".splitlines())}
    res = {"load_s": time.perf_counter() - t0}
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=cfg.get("max_tokens", 12), ignore_eos=True, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        res["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        if cfg.get("timing"):
            one = [TokensPrompt(prompt_token_ids=prompts[0])]
            ttft = []
            for _ in range(3):
                t = time.perf_counter()
                llm.generate(one, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False),
                             use_tqdm=False)
                ttft.append(time.perf_counter() - t)
            res["ttft_s"] = sorted(ttft)[1]
            n = cfg.get("decode_tokens", 64)
            t = time.perf_counter()
            llm.generate(one, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False),
                         use_tqdm=False)
            dt = time.perf_counter() - t
            res["decode_tok_s"] = (n - 1) / max(1e-9, dt - res["ttft_s"])
            res["e2e_s"] = dt
    finally:
        del llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()
        except Exception:  # noqa: BLE001 - best effort between configurations
            pass
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", help="JSON list of run_one configurations")
    ap.add_argument("--report-dir", default=None)
    a = ap.parse_args(argv)
    if a.report_dir:
        os.environ["UNWEIGHT_VLLM_REPORT_DIR"] = a.report_dir
    for cfg in json.loads(a.configs):
        if cfg.get("report_dir"):
            os.environ["UNWEIGHT_VLLM_REPORT_DIR"] = cfg["report_dir"]
        elif not a.report_dir:
            os.environ.pop("UNWEIGHT_VLLM_REPORT_DIR", None)
        res = run_one(cfg)
        res["config"] = cfg
        print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
