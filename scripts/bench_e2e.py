#!/usr/bin/env python
"""End-to-end decode throughput: BF16 vs huffman vs palette modes on a Llama-3.1-8B-shaped model.

The model is built on the GPU from its config with N(0, 0.02) weights (random, so no download;
exponent statistics close to trained weights), timed in BF16, then every nn.Linear /
nn.Embedding is encoded with the CPU codec (tensor_codec, one layer at a time, dense weight
freed as it goes) and timed in huffman mode, then transcoded in place to palette mode (on
the GPU when unweight._cuda is built) and timed again.

Decode tokens/s = batch / median per-step latency of single-token forwards with a KV cache
after a short prefill, timed with CUDA events.  Results go to
benchmarks/results/bench_e2e-<UTC date>.json with GPU name, driver, CUDA, torch, commit.

    python scripts/bench_e2e.py                  # full 32-layer model, batch 1 and 16
    python scripts/bench_e2e.py --layers 4       # quick run

Exits with status 2 and a one-line message when no CUDA device is present.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time

import numpy as np


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def llama8b_config(layers: int):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16")


def build_model(layers: int, device: str):
    import torch
    from transformers import LlamaForCausalLM
    cfg = llama8b_config(layers)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02, generator=g)
    return model.eval()


def compress_in_place(model, encoding: str = "huffman") -> dict:
    """Replace every nn.Linear / nn.Embedding by its compressed form (CPU codec)."""
    import torch
    import torch.nn as nn
    from unweight.runtime import loader
    from unweight.runtime.modules import CompressedEmbedding, CompressedLinear
    t0 = time.perf_counter()
    names = [(n, m) for n, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)]
    for n, m in names:
        new = (CompressedLinear.from_linear(m, encoding) if isinstance(m, nn.Linear)
               else CompressedEmbedding.from_embedding(m, encoding))
        loader._set_module(model, n, new)
        del m
        torch.cuda.empty_cache()
    model._unweight_plan = {}
    info = loader.prepare(model, encoding)
    info["encode_seconds"] = time.perf_counter() - t0
    return info


def time_decode(model, batch: int, prompt: int, steps: int, warmup: int = 3) -> dict:
    import torch
    from transformers import DynamicCache
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=dev, generator=g)
    times = []
    with torch.no_grad():
        cache = DynamicCache()
        out = model(ids, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        for i in range(warmup + steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = model(tok, past_key_values=cache, use_cache=True)
            b.record()
            tok = out.logits[:, -1:].argmax(-1)
            b.synchronize()
            if i >= warmup:
                times.append(a.elapsed_time(b))
    med = float(np.median(times))
    return {"batch": batch, "median_step_ms": med, "tokens_per_s": batch * 1000.0 / med,
            "p10_ms": float(np.percentile(times, 10)), "p90_ms": float(np.percentile(times, 90)), "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  "benchmarks", "results"))
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_e2e: no CUDA device; this benchmark needs a GPU", file=sys.stderr)
        return 2
    from unweight.runtime import loader
    batches = [int(b) for b in args.batches.split(",")]
    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    result = {"benchmark": "bench_e2e", "model": f"Llama-3.1-8B-shaped, {args.layers} layers, N(0,0.02) weights",
              "gpu": props.name, "driver": _driver(), "cuda": torch.version.cuda, "torch": torch.__version__,
              "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": _git_commit(),
              "cuda_kernels": loader.cuda_kernels_available(), "prompt": args.prompt, "modes": {}}
    model = build_model(args.layers, dev)
    bf16_bytes = sum(p.numel() * 2 for p in model.parameters() if p.dim() == 2)
    result["modes"]["bf16"] = {"weight_bytes": bf16_bytes,
                               "runs": [time_decode(model, b, args.prompt, args.steps) for b in batches]}
    info = compress_in_place(model, "huffman")
    result["modes"]["huffman"] = {"info": info, "runs": [time_decode(model, b, args.prompt, args.steps) for b in batches]}
    info = loader.prepare(model, "palette")  # transcodes in place
    result["modes"]["palette"] = {"info": info, "runs": [time_decode(model, b, args.prompt, args.steps) for b in batches]}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_e2e-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%SZ}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    for mode, r in result["modes"].items():
        print(mode, " ".join(f"b{x['batch']}={x['tokens_per_s']:.1f} tok/s" for x in r["runs"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
