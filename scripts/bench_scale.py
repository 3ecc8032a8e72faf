#!/usr/bin/env python3
"""Scale benchmark: compress, verify and decompress a Llama-3.1-8B-shaped checkpoint, file to file.

The checkpoint is synthetic: BF16 N(0, 0.02) tensors with Llama-3.1-8B's names and shapes
(vocab 128256, hidden 4096, 32 layers of q/k/v/o, gate/up/down 14336, norms), about 16 GB in 4
shards, written once and cached under out/ (git-ignored); --layers makes a smaller one.  Each
step runs the `unweight` command line in a child process; reported per step: seconds, GB/s of
BF16 (the source checkpoint's bytes for compress and verify, the written files' for
decompress) and the child's peak RSS, beside the largest tensor (the bound is largest tensor
+ 512 MB).  The decompressed tensors are checked against the source's, crc32 by crc32.  Free
disk is checked first (source, compressed and decompressed copies at once); the compressed
and decompressed copies are removed afterwards unless --keep.

Usage: python scripts/bench_scale.py [--layers 32] [--jobs N] [--out benchmarks/results/X.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import _bench_util as bu  # noqa: E402

VOCAB, HIDDEN, FFN, KV = 128256, 4096, 14336, 1024
LAYER = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", KV, HIDDEN), ("self_attn.v_proj", KV, HIDDEN),
         ("self_attn.o_proj", HIDDEN, HIDDEN), ("mlp.gate_proj", FFN, HIDDEN), ("mlp.up_proj", FFN, HIDDEN),
         ("mlp.down_proj", HIDDEN, FFN)]
SHARDS = 4


def tensors(layers: int) -> list:
    """[(name, shape)] in the order transformers writes a Llama."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        out.append((f"model.layers.{i}.input_layernorm.weight", (HIDDEN,)))
        out += [(f"model.layers.{i}.{n}.weight", (r, c)) for n, r, c in LAYER]
        out.append((f"model.layers.{i}.post_attention_layernorm.weight", (HIDDEN,)))
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def _bf16_gaussian(rng, n: int) -> np.ndarray:
    f = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def make_checkpoint(folder: str, layers: int) -> str:
    """Write the synthetic checkpoint (SHARDS safetensors files + index + config) once."""
    done = os.path.join(folder, "config.json")
    if os.path.exists(done):
        return folder
    tmp = folder + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    ts = tensors(layers)
    total = sum(2 * int(np.prod(s)) for _, s in ts)
    groups, size = [[]], 0
    for name, shape in ts:  # roll over at total / SHARDS
        if size >= total * len(groups) / SHARDS and len(groups) < SHARDS:
            groups.append([])
        groups[-1].append((name, shape))
        size += 2 * int(np.prod(shape))
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        head, pos = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            nb = 2 * int(np.prod(shape))
            head[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + nb]}
            pos += nb
            weight_map[name] = fname
        hb = json.dumps(head, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(tmp, fname), "wb") as f:
            f.write(len(hb).to_bytes(8, "little") + hb)
            for name, shape in group:
                rng = np.random.default_rng(zlib.crc32(name.encode()))
                n = int(np.prod(shape))
                if len(shape) == 1:  # norms: 1.0, as initialised
                    f.write(np.full(n, 0x3F80, np.uint16).tobytes())
                    continue
                for a in range(0, n, 1 << 24):
                    f.write(_bf16_gaussian(rng, min(1 << 24, n - a)).tobytes())
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN,
           "intermediate_size": FFN, "num_hidden_layers": layers, "num_attention_heads": 32,
           "num_key_value_heads": 8, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    os.rename(tmp, folder)
    return folder


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def run_measured(args: list) -> dict:
    """Run `python -m unweight ARGS` as a direct child and read its peak RSS with wait4."""
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child becomes the CLI; nothing of this process's memory is touched
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "unweight", *args])
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    dt = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"unweight {' '.join(args)} failed with exit code {code}")
    return {"seconds": dt, "peak_rss_bytes": ru.ru_maxrss * 1024}


def tensor_crcs(folder: str) -> dict:
    from unweight.format.checkpoint import Checkpoint
    ck = Checkpoint(folder)
    try:
        out = {}
        for n in ck.names():
            out[n] = zlib.crc32(np.ascontiguousarray(ck.array(n)).reshape(-1).view(np.uint8))
            ck.release(n)
        return out
    finally:
        ck.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=bu.positive_int, default=32, help="decoder layers (32: Llama-3.1-8B, ~16 GB)")
    ap.add_argument("--jobs", type=bu.nonnegative_int, default=0, help="threads (default: all)")
    ap.add_argument("--cache", default=os.path.join(ROOT, "out", "bench-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the compressed and decompressed copies")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    # A bad --out is found now, not after the run's minutes of work.
    out = bu.writable_path(a.out, "bench_scale") if a.out else None

    src = os.path.join(a.cache, f"llama8b-shapes-{a.layers}l")
    ts = tensors(a.layers)
    src_bytes = sum(2 * int(np.prod(s)) for _, s in ts)
    largest = max(2 * int(np.prod(s)) for _, s in ts)
    try:
        os.makedirs(a.cache, exist_ok=True)
    except OSError as e:
        bu.fail(f"bench_scale: cannot create --cache {a.cache}: {e.strerror or e}")
    need = (0 if os.path.exists(os.path.join(src, "config.json")) else src_bytes) + 0.7 * src_bytes + src_bytes
    free = shutil.disk_usage(a.cache).free
    if free < need + (4 << 30):
        fit = max(1, int(a.layers * (free - (4 << 30)) / max(1, need)))
        raise SystemExit(f"error: {free / 1e9:.1f} GB free on {a.cache}, this run needs about {need / 1e9:.1f} GB "
                         f"(+4 GB margin); try --layers {fit}")
    t = time.perf_counter()
    make_checkpoint(src, a.layers)
    made_s = time.perf_counter() - t
    comp, back = os.path.join(a.cache, "compressed"), os.path.join(a.cache, "decompressed")
    for d in (comp, back):
        shutil.rmtree(d, ignore_errors=True)
    jobs = ["-j", str(a.jobs)] if a.jobs else []
    steps = {}
    try:
        steps["compress"] = run_measured(["compress", src, comp, "--encoding", "huffman", *jobs])
        comp_bytes = folder_bytes(comp)
        steps["compress"]["gb_per_s"] = src_bytes / steps["compress"]["seconds"] / 1e9
        steps["verify"] = run_measured(["verify", comp])
        steps["verify"]["gb_per_s"] = src_bytes / steps["verify"]["seconds"] / 1e9
        steps["decompress"] = run_measured(["decompress", comp, back])
        steps["decompress"]["gb_per_s"] = folder_bytes(back) / steps["decompress"]["seconds"] / 1e9
        exact = tensor_crcs(back) == tensor_crcs(src)
    finally:
        if not a.keep:
            for d in (comp, back):
                shutil.rmtree(d, ignore_errors=True)
    bound = largest + (512 << 20)
    for s in steps.values():
        s["peak_rss_within_bound"] = s["peak_rss_bytes"] <= bound
    # After the steps: importing torch here first would raise the children's peak RSS (a
    # child inherits its parent's high-water mark across exec).
    env = bu.environment()
    res = {"date": datetime.date.today().isoformat(), "commit": bu.short_commit(),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "environment": env,
           "checkpoint": {"layers": a.layers, "tensors": len(ts), "bf16_bytes": src_bytes, "shards": SHARDS,
                          "largest_tensor_bytes": largest, "made_seconds": made_s},
           "compressed_bytes": comp_bytes, "ratio": comp_bytes / folder_bytes(src), "rss_bound_bytes": bound,
           "decompressed_tensors_identical": exact, "steps": steps,
           "note": "synthetic N(0, 0.02) BF16 with Llama-3.1-8B shapes; source read from a warm page cache; "
                   "outputs fsynced"}
    print(f"checkpoint {src_bytes / 1e9:.2f} GB BF16, {len(ts)} tensors, largest {largest / 1e9:.3f} GB; "
          f"ratio {res['ratio']:.4f}; decompressed tensors identical: {exact}")
    print(f"{'step':<12}{'seconds':>9}{'GB/s':>7}{'peak RSS GB':>13}  (bound {bound / 1e9:.2f} GB)")
    for k, s in steps.items():
        print(f"{k:<12}{s['seconds']:>9.1f}{s['gb_per_s']:>7.2f}{s['peak_rss_bytes'] / 1e9:>13.2f}")
    out = out or bu.result_path("scale", bu.machine_tag(), res["commit"])
    bu.write_json(out, res)
    print(f"wrote {out}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
