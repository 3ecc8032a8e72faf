#!/usr/bin/env python3
"""What routed-expert decoding buys on a mixture-of-experts model (CPU, transformers).

Usage: python scripts/bench_moe.py [--experts 64] [--top-k 4] [--layers 4] [--hidden 1024]
                                   [--moe-intermediate 512] [--steps 24] [--prompt 64] [--rounds 3]
                                   [--threads 1] [--keep DIR] [--device cpu|cuda] [--json-out PATH]

Builds a Qwen3-MoE model with transformers' own config (weights N(0, 0.02), BF16), compresses
it (huffman), then measures, each variant in a fresh process:

    bf16         the BF16 model as transformers loads it (default experts implementation)
    decode-all   the compressed model decoding every expert of a layer at each forward (what
                 a loader that rebuilds the dense 3-D experts tensors per forward does: here the
                 default "grouped_mm" implementation reading the whole ExpertStack)
    routed       unweight.load(mode="huffman"): only the experts the router picked are decoded
    routed-pal   the same in palette mode (transcoded at load)
    routed-pal-fused  (CUDA only) routed-pal with every routed expert projection the fused
                 kernels take run on the compressed planes (the tensor-core GEMV at batches
                 1..32, the GEMM past them; forced_expert_policy), none decoded: not the
                 measured choice but what it would be if the kernels won

For each: per-token decode time (median of --steps single-token forwards with a KV cache
after a --prompt-token prefill), the prefill time, bytes the model holds (parameters and
buffers, plus the decode scratch), peak RSS of the process, experts decoded per layer per
token (a count at the decode point; fused: the projections run on the compressed planes),
the largest logit difference from the BF16 model and whether its greedy tokens match, and
whether the logits equal the BF16 model's bit for bit (the routed variants against the BF16 model under transformers' "batched_mm" experts
forward, whose sums theirs repeat; on CUDA the default "grouped_mm" sums in another order).
--rounds runs every variant that many times, the order rotated each round (a shared
machine's load drifts); the table gives the median over rounds, the JSON every run.
--threads sets torch's (and so the codec's) threads; the default 1 because on a machine
shared with other jobs two spinning OpenMP threads on two cores ran 10-20x slower than one.  Prints a
table; writes benchmarks/results/moe-<date>-<machine>-<commit>.json (or --json-out).
--device cuda runs every variant on the GPU (the model built and compressed on the host as
above; step times between CUDA synchronizations, eager, no graphs: the routed path reads the
routing on the host), and peak memory is the device's (torch.cuda.max_memory_allocated).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import _bench_util as bu  # noqa: E402

VARIANTS = ("bf16", "decode-all", "routed", "routed-pal")
CUDA_VARIANTS = VARIANTS + ("routed-pal-fused",)


def variants(device: str, chosen=None) -> tuple:
    """The variants that run on `device` (the fused kernels run on CUDA only), in table order:
    those `chosen` (None: all), and bf16, which every other is compared with."""
    out = CUDA_VARIANTS if device.startswith("cuda") else VARIANTS
    return tuple(v for v in out if chosen is None or v == "bf16" or v in chosen)


def forced_expert_policy(model, device):
    """A dispatch policy whose table says the fused palette kernels won for every expert piece
    shape of the model's stacks at every batch bucket they take (the tensor-core GEMV where it
    takes the batch, else the GEMM), set on each stack (the dense layers keep theirs)."""
    from unweight.runtime import experts as ex
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.policy import GEMV_PATHS, PALETTE_GEMM, PALETTE_GEMV_MMA, DispatchPolicy
    from unweight.runtime.tuning_table import BUCKET_BATCH, TuningTable
    t = TuningTable(comment="forced fused experts (bench_moe)")
    pol = DispatchPolicy(t)
    name = pol.device_name(device)
    for *_, st in ex.expert_stacks(model):
        for p in st.pieces(0):
            for M in BUCKET_BATCH.values():
                if M <= kp.PMMA_MAX_M and not p.is_huffman and kp.pmma_supported(M, p.cols):
                    path = (PALETTE_GEMV_MMA if kp.pgemv_supported(M, p.cols, GEMV_PATHS[PALETTE_GEMV_MMA])
                            else PALETTE_GEMM)
                    t.record(name, p.rows, p.cols, "palette", M, {"decode_cublas": 1.0, path: 0.5})
        st.policy = pol
    return pol


def build(folder: str, a) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                               moe_intermediate_size=a.moe_intermediate, num_experts=a.experts,
                               num_experts_per_tok=a.top_k, num_hidden_layers=a.layers, num_attention_heads=8,
                               num_key_value_heads=4, head_dim=a.hidden // 8, vocab_size=a.vocab,
                               norm_topk_prob=True)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(0.02))
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    ne = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    return {"params": n, "expert_params": ne, "bf16_bytes": 2 * n}


def _rss() -> int:
    """Resident bytes of this process now (VmRSS)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_variant(variant: str, bf16: str, comp: str, a) -> dict:
    """One variant, in this process: load, prefill, decode steps; returns its measurements."""
    import torch
    from transformers import AutoModelForCausalLM

    import unweight
    from unweight.runtime import experts as ex
    from unweight.runtime import scratch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)
    rss0 = _rss()  # libraries imported, no model yet
    t0 = time.perf_counter()
    if variant == "bf16":
        model = AutoModelForCausalLM.from_pretrained(bf16, device_map=a.device).eval()
    else:
        model = unweight.load(comp, device=a.device, mode="palette" if variant.startswith("routed-pal") else "huffman")
        if variant == "decode-all":
            model.set_experts_implementation("grouped_mm")
        if variant == "routed-pal-fused":
            forced_expert_policy(model, dev)
    sync()
    load_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    decoded, fused = [0], [0]
    orig, orig_fused = ex.ExpertStack.decode_expert, ex.ExpertStack.fused_linear

    def counting(stack, e, out):
        decoded[0] += 1
        return orig(stack, e, out)

    def counting_fused(stack, e, x):
        y = orig_fused(stack, e, x)
        fused[0] += y is not None
        return y

    ex.ExpertStack.decode_expert = counting
    ex.ExpertStack.fused_linear = counting_fused
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=g).to(dev)

    def generate():
        """Prefill then --steps greedy single-token forwards: (prefill s, step s list, logits list)."""
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            out = model(prompt, use_cache=True)
            sync()
            prefill_s = time.perf_counter() - t0
            logits = [out.logits[0, -1].float()]
            cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            decoded[0] = fused[0] = 0
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                out = model(tok, past_key_values=cache, use_cache=True)
                sync()
                times.append(time.perf_counter() - t0)
                cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                logits.append(out.logits[0, -1].float())
        return prefill_s, times, logits

    prefill_s, times, logits = generate()
    device_peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    n_decoded, n_fused = decoded[0], fused[0]
    if a.logits_out:  # this run's logits, for the parent's comparison with the BF16 model's
        import numpy as np
        np.save(a.logits_out, torch.stack(logits).cpu().numpy())
    impl = getattr(model.config, "_experts_implementation", None)
    extra = {}
    if variant == "bf16" and impl != "batched_mm":
        # The routed forward computes what "batched_mm" computes (runtime/experts.py); the default
        # "grouped_mm" sums in another order where torch has a grouped GEMM (CUDA), so the routed
        # variants are compared with the BF16 model's logits under "batched_mm" (untimed run).
        model.set_experts_implementation("batched_mm")
        extra["logits_sha256_batched_mm"] = _sha(generate()[2])
        model.set_experts_implementation(impl)
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    stacks = ex.expert_stacks(model)
    n_stacks = len(stacks)
    return {
        "variant": variant, "load_s": round(load_s, 3), "prefill_ms": round(1e3 * prefill_s, 2),
        "ms_per_token": round(1e3 * statistics.median(times), 2), "ms_per_token_min": round(1e3 * min(times), 2),
        "step_ms": [round(1e3 * t, 3) for t in times],
        "held_bytes": held, "scratch_bytes": scratch.scratch_bytes(a.device),
        "device_peak_bytes": device_peak,
        "experts_held_bytes": sum(st.held_bytes() for *_, st in stacks),
        "experts_bf16_bytes": sum(st.decoded_bytes() for *_, st in stacks),
        # each expert of a layer is one decode per stack (gate_up, down): experts per layer per token
        "experts_decoded_per_layer_token": round(n_decoded / max(1, a.steps) / max(1, n_stacks), 2)
        if n_stacks else 0.0,
        "experts_fused_per_layer_token": round(n_fused / max(1, a.steps) / max(1, n_stacks), 2) if n_stacks else 0.0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        # what loading and running the model added to the process, measured after the steps
        # (the load-time verify pass and the checkpoint's mapped pages count in the peak only)
        "rss_added_bytes": _rss() - rss0,
        # exact bits of the last-position logits of every step, compared by the parent
        "logits_sha256": _sha(logits),
        "experts_implementation": impl,
        **extra,
    }


def _sha(logits) -> str:
    """SHA-256 of the exact bits of a list of [vocab] FP32 logits tensors (any device)."""
    import torch
    return hashlib.sha256(torch.stack(logits).cpu().contiguous().view(torch.int32).numpy().tobytes()).hexdigest()


# The settings that shape the model --keep holds, recorded beside it (KEPT) so a later run
# with other settings does not time the old model under the new settings' name.
BUILD_ARGS = ("experts", "top_k", "layers", "hidden", "moe_intermediate", "vocab")
KEPT = "bench_moe_model.json"


def build_args(a) -> dict:
    return {k: getattr(a, k) for k in BUILD_ARGS}


def kept_model(work: str, a):
    """The model info of the checkpoints already in `work` (--keep), None when there are none;
    exits with one line when they were built with other settings."""
    stamp = os.path.join(work, KEPT)
    if not os.path.exists(stamp):
        return None
    with open(stamp) as f:
        kept = json.load(f)
    if kept.get("build") != build_args(a):
        diff = ", ".join(f"--{k.replace('_', '-')} {kept.get('build', {}).get(k)}" for k in BUILD_ARGS
                         if kept.get("build", {}).get(k) != getattr(a, k))
        bu.fail(f"bench_moe: {work} holds a model built with {diff}; give another --keep folder")
    return kept["model"]


def reference(bf16_run: dict, impl: str | None) -> tuple[str | None, str]:
    """The BF16 experts implementation a variant running `impl` computes the same sums as, and
    that run's logits hash: the routed forward (experts.ROUTED) mirrors "batched_mm"; every
    other implementation is compared with the BF16 model's default one."""
    from unweight.runtime import experts as ex
    if impl == ex.ROUTED and "logits_sha256_batched_mm" in bf16_run:
        return "batched_mm", bf16_run["logits_sha256_batched_mm"]
    return bf16_run.get("experts_implementation"), bf16_run["logits_sha256"]


def run_child(argv, variant: str) -> None:
    """Run one variant's child process; when it fails, end the run with the last line of its
    error (the variant's other runs and the table would be missing a row)."""
    p = subprocess.run(argv, stderr=subprocess.PIPE, text=True, check=False)
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        bu.fail(f"bench_moe: variant {variant} failed (exit {p.returncode}): {lines[-1] if lines else 'no message'}",
                1)


def check_args(a, ap) -> None:
    """Settings the model cannot be built from, or under which nothing routed would be measured,
    refused before anything is built."""
    from unweight.format import constants as C
    if a.top_k > a.experts:
        ap.error(f"--top-k {a.top_k} is more than --experts {a.experts}")
    if a.hidden % 8:
        ap.error(f"--hidden {a.hidden} is not a multiple of 8 (the model has 8 attention heads)")
    if a.hidden * a.moe_intermediate < C.MIN_ENCODED_WEIGHTS:
        ap.error(f"--hidden x --moe-intermediate = {a.hidden * a.moe_intermediate} weights per expert matrix, under "
                 f"the {C.MIN_ENCODED_WEIGHTS} unweight encodes: the experts would stay BF16 and nothing routed "
                 "would be measured")
    if not (a.device == "cpu" or a.device == "cuda" or a.device.startswith("cuda:") and a.device[5:].isdigit()):
        ap.error(f"--device {a.device!r}: choose cpu or cuda (or cuda:N)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=bu.positive_int, default=64)
    ap.add_argument("--top-k", type=bu.positive_int, default=4)
    ap.add_argument("--layers", type=bu.positive_int, default=4)
    ap.add_argument("--hidden", type=bu.positive_int, default=1024, help="a multiple of 8 (8 attention heads)")
    ap.add_argument("--moe-intermediate", type=bu.positive_int, default=512)
    ap.add_argument("--vocab", type=bu.positive_int, default=4096)
    ap.add_argument("--steps", type=bu.positive_int, default=24)
    ap.add_argument("--prompt", type=bu.positive_int, default=64)
    ap.add_argument("--rounds", type=bu.positive_int, default=3)
    ap.add_argument("--threads", type=bu.positive_int, default=1)
    ap.add_argument("--keep", help="folder to build the checkpoints in and keep (default: a temporary one)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where every variant runs")
    ap.add_argument("--json-out", help="write the result JSON here instead of benchmarks/results/")
    ap.add_argument("--variants", nargs="+", choices=CUDA_VARIANTS, metavar="VARIANT",
                    help="run only these (bf16 always runs: the others are compared with it; default: all that "
                         "run on --device)")
    ap.add_argument("--variant", choices=CUDA_VARIANTS, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--logits-out", help=argparse.SUPPRESS)
    ap.add_argument("--dirs", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant:
        res = run_variant(a.variant, a.dirs[0], a.dirs[1], a)
        with open(a.out, "w") as f:
            json.dump(res, f)
        return 0
    check_args(a, ap)
    if a.variants and not a.device.startswith("cuda") and "routed-pal-fused" in a.variants:
        ap.error("--variants routed-pal-fused runs on CUDA only (--device cuda)")
    json_out = bu.writable_path(a.json_out, "bench_moe") if a.json_out else None

    import torch

    from unweight import api
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        bu.fail("bench_moe: --device cuda, but no CUDA GPU is visible (torch.cuda.is_available() is False)")
    work = a.keep or tempfile.mkdtemp(prefix="bench_moe_")
    bf16, comp = os.path.join(work, "bf16"), os.path.join(work, "huffman")
    try:
        model_info = kept_model(work, a)
        if model_info is None:
            for d in (bf16, comp):  # left by a run that did not finish: built again from the seed
                shutil.rmtree(d, ignore_errors=True)
            model_info = build(bf16, a)
            rep = api.compress(bf16, comp, encoding="huffman", progress=False)
            model_info["compressed_file_bytes"] = rep["output_bytes"]
            model_info["bf16_file_bytes"] = rep["input_bytes"]
            with open(os.path.join(work, KEPT), "w") as f:
                json.dump({"build": build_args(a), "model": model_info}, f)
        vs = variants(a.device, a.variants)
        runs = {v: [] for v in vs}
        for rnd in range(a.rounds):
            for v in vs[rnd % len(vs):] + vs[:rnd % len(vs)]:
                out = os.path.join(work, f"{v}.json")
                argv = [sys.executable, os.path.abspath(__file__), "--variant", v, "--dirs", bf16, comp, "--out", out,
                        "--logits-out", os.path.join(work, f"{v}-logits.npy")]
                argv += [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in
                         ("experts", "top_k", "layers", "hidden", "moe_intermediate", "vocab", "steps", "prompt",
                          "threads", "device")]
                run_child(argv, v)
                with open(out) as f:
                    runs[v].append(json.load(f))
        if not any(x["experts_held_bytes"] for v in vs if v != "bf16" for x in runs[v]):
            # The loader kept every expert BF16: "routed" would be a BF16 timing under another name.
            bu.fail("bench_moe: the compressed model holds no routed expert stacks (its experts were stored "
                    "uncompressed); nothing routed was measured", 1)
        rows = []
        import numpy as np
        ref_logits = np.load(os.path.join(work, "bf16-logits.npy"))
        for v in vs:
            r = dict(runs[v][0])
            ref_impl, ref = reference(runs["bf16"][0], r.get("experts_implementation"))
            r["logits_equal_bf16"] = all(x["logits_sha256"] == ref for x in runs[v])
            # Against the BF16 model's default run (the last round of each): what a variant that is
            # not bitwise (the fused kernels: the GEMM's error bound) changes.
            got = np.load(os.path.join(work, f"{v}-logits.npy"))
            r["max_abs_logit_diff_vs_bf16"] = float(np.abs(got - ref_logits).max())
            r["greedy_tokens_equal_bf16"] = bool((got.argmax(-1) == ref_logits.argmax(-1)).all())
            r["reference_experts_implementation"] = ref_impl
            for k in ("ms_per_token", "prefill_ms", "load_s", "peak_rss_bytes", "rss_added_bytes"):
                r[k] = statistics.median(x[k] for x in runs[v])
            r["ms_per_token_rounds"] = [x["ms_per_token"] for x in runs[v]]
            r["runs"] = runs[v]
            rows.append(r)
        base = rows[0]["ms_per_token"]
        for r in rows:
            r["vs_bf16"] = round(r["ms_per_token"] / base, 2)
            r["held_MB"] = round((r["held_bytes"] + r["scratch_bytes"]) / 1e6, 1)
            r["peak_rss_MB"] = round(r["peak_rss_bytes"] / 1e6, 1)
            r["rss_added_MB"] = round(r["rss_added_bytes"] / 1e6, 1)
            r["ms_per_token_spread"] = f"{min(r['ms_per_token_rounds'])}-{max(r['ms_per_token_rounds'])}"
        config = {k: getattr(a, k) for k in ("experts", "top_k", "layers", "hidden", "moe_intermediate", "vocab",
                                              "steps", "prompt", "rounds", "threads", "device")}
        env = bu.environment(torch)
        env["torch_threads"] = a.threads
        env["load_average"] = os.getloadavg()
        gpu = torch.cuda.get_device_name() if a.device.startswith("cuda") else None
        path = json_out or bu.result_path("moe", bu.machine_tag(gpu), bu.short_commit())
        bu.write_json(path, {"benchmark": "moe", "environment": env, "config": config, "model": model_info,
                             "results": rows})
        print(f"Qwen3-MoE, {a.layers} layers, {a.experts} experts top-{a.top_k}, hidden {a.hidden}, "
              f"expert intermediate {a.moe_intermediate}; on {gpu or 'CPU'}; {a.threads} CPU thread(s), load "
              f"average {os.getloadavg()[0]:.1f}")
        bu.print_table(rows, ["variant", "ms_per_token", "ms_per_token_spread", "vs_bf16", "prefill_ms", "held_MB",
                              "rss_added_MB", "peak_rss_MB",
                              "experts_decoded_per_layer_token", "experts_fused_per_layer_token",
                              "logits_equal_bf16", "max_abs_logit_diff_vs_bf16", "greedy_tokens_equal_bf16",
                              "experts_implementation",
                              "reference_experts_implementation"])
        print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
