"""Run one vLLM configuration in its own process and print one JSON line (tests, bench).

    python -m tests.integrations.vllm_runner MODEL_DIR --tp 2 [--eager] [--load-format unweight]
        [--prompts JSON] [--max-tokens 16] [--report-dir DIR] [--timing]

A fresh process per configuration because vLLM's engine, its worker processes and the
torch.distributed state do not come apart cleanly inside one interpreter.  The caller sets
the environment (HF_HUB_OFFLINE, VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .vllm_model import make_llama, PROMPTS  # noqa: F401  (re-exported for callers)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--report-dir", default=None)
    ap.add_argument("--timing", action="store_true", help="also measure TTFT and decode tokens/s")
    a = ap.parse_args(argv)
    if a.report_dir:
        os.environ["UNWEIGHT_VLLM_REPORT_DIR"] = a.report_dir
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(a.prompts) if a.prompts else PROMPTS
    t0 = time.perf_counter()
    try:
        llm = LLM(model=a.model, dtype="bfloat16", tensor_parallel_size=a.tp, enforce_eager=a.eager,
                  max_model_len=256, skip_tokenizer_init=True, load_format=a.load_format, seed=0,
                  max_num_seqs=8, compilation_config=None if a.eager else {"cudagraph_capture_sizes": [1, 2, 4]})
    except Exception as e:  # one line for the caller to assert on
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 3
    load_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    res = {"tokens": [list(o.outputs[0].token_ids) for o in outs], "load_s": load_s}
    if a.timing:
        one = [TokensPrompt(prompt_token_ids=prompts[0])]
        t = time.perf_counter()
        llm.generate(one, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False),
                     use_tqdm=False)
        res["ttft_s"] = time.perf_counter() - t
        n = 64
        t = time.perf_counter()
        llm.generate(one, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False),
                     use_tqdm=False)
        dt = time.perf_counter() - t
        res["decode_tok_s"] = (n - 1) / max(1e-9, dt - res["ttft_s"])
        res["e2e_s_64"] = dt
    print("RESULT " + json.dumps(res))
    sys.stdout.flush()
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
