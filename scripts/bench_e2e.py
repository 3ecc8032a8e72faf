#!/usr/bin/env python3
"""End-to-end decode throughput of a Llama-3.1-8B-shaped model: BF16 against the compressed
modes (huffman, palette, dense; optionally with the fused kernels forced on, or with another
decoder variant).

The model is built on the GPU from its config (transformers LlamaForCausalLM, sdpa attention)
with N(0, 0.02) BF16 weights drawn on the device (no download), timed in BF16, then every
nn.Linear / nn.Embedding is encoded by the host codec (a layer at a time) and the model is
prepared (unweight.runtime.prepare.prepare) in each mode in turn: huffman, palette (an on-GPU
transcode), then the forced-fused variants, then dense.

Decode step: one token per sequence against a static KV cache (transformers StaticCache) after
a prefill of --prompt tokens; the step is captured in a CUDA graph and replayed --steps times
between two CUDA events (no host sync inside), >= 20 such runs, median and min; the same
step also runs eagerly (host overhead included) for comparison.  Each replay writes the same
cache position, so every step does the same work.  tokens/s = batch / step time.  The prefill
logits of every compressed mode are compared with the BF16 model's (decode + cuBLAS must be
bitwise equal).  The lm_head is timed alone as well (a graph of its own, `lm_head_ms`), and
`layers_ms` is the graph step less it: the part of the step a deeper model multiplies (in
this model of few layers the lm_head holds a large share of the weights).  Needs a CUDA GPU;
exits with status 2 and one line otherwise.

    python scripts/bench_e2e.py [--layers 4] [--batches 1,16] [--modes huffman,palette,dense]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_util as bu  # noqa: E402

# <mode>[+fused | +fused-wide | +fused-xs | +gemv | +<decoder variant>]: the fused palette GEMM
# forced on (one-tile copy stages, two-tile stages, or x shared per CTA), the palette GEMV at
# batch 1..4 (its tensor-core variant 1..32; the one-tile GEMM above), or the decode + cuBLAS path with another decoder
# (dispatch.use_decoders).  A trailing "+tiled" (palette) holds the matmul weights' planes
# tile-major (prepare's plane_order="tiled"); "palette+tiled" alone decodes them + cuBLAS.
# Every other mode holds file order.  (gemv-mma-bulk, the bulk-copy GEMV, runs tile-major only.)
# A trailing "+merged" (last) stacks each layer's q/k/v and gate/up into one palette matrix that
# one matmul multiplies (prepare's merge_siblings, runtime/siblings.py).  The members stay
# re-encoded under the stack's palette after such a mode: the same weights, and on this model,
# whose matrices share one distribution, the same palette, so later modes read the same bytes.
# A trailing "+l2" (after all others) prefetches each matmul's weight into L2 on a side stream
# while the kernels before it run (prepare's l2_prefetch, runtime/prefetch.py).
# "bf16+l2" times the BF16 model with the same L2 prefetch (its nn.Linear weights that fit), also
# before any compressed mode (on a GPU only).
# "bf16+merged" times the BF16 model with the same sets stacked (stack_dense_siblings), before
# any compressed mode, wherever it is listed: the reference a serving engine's merged layers give.
# A trailing "+compile" (the very last) runs the decode step through torch.compile (inductor on a
# GPU; the harness' CPU self-test traces with the eager backend) before the CUDA-graph capture, as a
# serving engine compiles its model: inductor fuses the norms, rotary embedding, activation and
# residual adds into few kernels, so the matmuls are a larger share of the step.  Its BF16
# reference is "bf16+compile" (the BF16 model compiled the same way, before any compressed mode);
# the compile's seconds, graph count and graph breaks are recorded.  A compiled mode times the
# first batch listed only (each batch would compile anew).  Stacked siblings and the L2
# prefetch keep no Python state inside a compiled graph, so under "+compile" they stand aside
# (each member runs alone; nothing is prefetched).
# A trailing "+pdl" (after "+tiled") runs the mode with programmatic dependent launch of the
# tensor-core GEMV kernels on (ops.programmatic_launch; sm_90+): a launch may start streaming
# its planes while the kernel ahead of it ends.
MODES = ("huffman", "palette", "palette+tiled", "huffman+fused", "palette+fused", "palette+fused-wide",
         "palette+fused-xs", "palette+gemv", "palette+gemv-mma", "palette+gemv-mma+tiled", "palette+fused-wide+tiled",
         "palette+gemv-mma-staged", "palette+gemv-mma-prefetch", "palette+gemv-mma-bulk+tiled",
         "palette+gemv-mma-queue+tiled", "palette+gemv-mma+tiled+pdl", "palette+gemv-mma-queue+tiled+pdl",
         "palette+gemv-mma+tiled+merged", "palette+gemv-mma+tiled+pdl+merged", "palette+merged", "bf16+merged",
         "palette+gemv-mma+tiled+merged+l2", "palette+gemv-mma+tiled+l2", "palette+l2", "bf16+l2",
         "bf16+compile", "palette+compile", "palette+gemv-mma+tiled+compile",
         "palette+gemv-deep", "palette+gemv-staged",
         "huffman+chain", "huffman+ahead", "huffman+ahead2", "huffman+ring", "palette+vec8", "palette+wide", "dense")
FUSED_PATHS = {"fused": "palette_gemm", "fused-wide": "palette_gemm_wide", "fused-xs": "palette_gemm_xs",
               "gemv": "palette_gemv", "gemv-deep": "palette_gemv_deep", "gemv-staged": "palette_gemv_staged",
               "gemv-mma": "palette_gemv_mma", "gemv-mma-staged": "palette_gemv_mma_staged",
               "gemv-mma-prefetch": "palette_gemv_mma_prefetch", "gemv-mma-bulk": "palette_gemv_mma_bulk",
               "gemv-mma-queue": "palette_gemv_mma_queue"}


# The BF16 model's modes that run before any compressed one (they time the model as built).
BF16_VARIANTS = ("bf16+merged", "bf16+l2", "bf16+compile")
# Seconds a compiled mode is given room for before the first one ran (then that one's own
# seconds): inductor's compile of the 4-layer step (its four layers share generated kernels)
# and its timing.  An estimate, not a reading.
COMPILE_SECONDS = 45.0


def _take_suffix(extra: str, name: str) -> tuple:
    """(whether the mode's extras end in `name`, the extras without it): "gemv-mma+tiled+l2"
    with "l2" -> (True, "gemv-mma+tiled")."""
    if extra == name or extra.endswith("+" + name):
        return True, extra[: -len(name)].rstrip("+")
    return False, extra


def reference_mode(mode: str) -> str:
    """The BF16 mode a mode's speed is read against: "bf16+compile" for a compiled mode, else
    "bf16" (the BF16 variants themselves included)."""
    return "bf16+compile" if mode.endswith("+compile") and mode != "bf16+compile" else "bf16"


def llama8b_config(layers: int, **over):
    from transformers import LlamaConfig
    kw = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
              tie_word_embeddings=False)
    kw.update(over)
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(cfg, device: str):
    """LlamaForCausalLM in bf16 on `device`, 2-D weights N(0, 0.02) drawn there."""
    import torch
    from transformers import LlamaForCausalLM
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02, generator=g)
    return model.eval()


def compress_in_place(model, encoding: str = "huffman") -> float:
    """Swap every nn.Linear / nn.Embedding for its compressed form (host codec, planes on the
    module's device); returns the seconds it took.  prepare() is left to the caller."""
    import torch
    import torch.nn as nn

    from unweight.runtime.convert import set_module
    from unweight.runtime.modules import CompressedEmbedding, CompressedLinear
    t0 = time.perf_counter()
    for n, m in [(n, m) for n, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)]:
        new = (CompressedLinear.from_linear(m, encoding) if isinstance(m, nn.Linear)
               else CompressedEmbedding.from_embedding(m, encoding))
        set_module(model, n, new)
        del m
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return time.perf_counter() - t0


def forced_fused_policy(model, device, path: str = "palette_gemm"):
    """A dispatch policy whose table says the fused kernel (`path` for palette layers) won for
    every compressed layer at every batch bucket it takes (to measure the fused path end to
    end, not a measured choice).  A GEMV path takes the batches it supports (1..4 on CUDA cores,
    1..32 on the tensor cores); past them the one-tile GEMM."""
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.modules import CompressedLinear, compressed_modules
    from unweight.runtime.policy import GEMV_PATHS, DispatchPolicy
    from unweight.runtime.tuning_table import TuningTable, table_encoding
    t = TuningTable(comment="forced fused (bench_e2e)")
    pol = DispatchPolicy(t)
    name = pol.device_name(device) if device.type == "cuda" else "cpu"
    shapes = {}
    for _, m in compressed_modules(model):
        if isinstance(m, CompressedLinear) and not m.is_tied:
            shapes[(m.n_rows, m.n_cols)] = m
            g = m.__dict__.get("_uw_group")  # a stacked sibling group's shape (prepare's merge_siblings)
            if g is not None:
                shapes[(g.w.rows, g.w.cols)] = m
    for (N, K), m in shapes.items():
        for M in (1, 4, 16):
            fused = ("huffman_gemm" if m.encoding_name == "huffman"
                     else "palette_gemm" if path in GEMV_PATHS
                     and not kp.pgemv_supported(M, K, GEMV_PATHS[path]) else path)
            for tiled in (False, True):  # the same choice whichever plane order the layer is held in
                t.record(name, N, K, table_encoding(m.encoding_name, tiled), M, {"decode_cublas": 1.0, fused: 0.5})
    return pol


def stack_dense_siblings(model):
    """Run each set of BF16 sibling projections (runtime.siblings.SIBLINGS: q/k/v, gate/up) as
    one GEMM over a stacked copy of their weights, as vLLM's merged layers hold them: the first
    member called computes the set and hands the others their column views for the same input
    tensor.  The BF16 reference for the compressed "+merged" modes.  Returns an undo callable
    (restores each module's own forward and frees the copies) with `.sets`, the sets stacked."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from unweight.runtime.siblings import SIBLINGS
    patched = []
    sets = 0
    for _, parent in model.named_modules():
        for names in SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if not all(isinstance(m, nn.Linear) for m in mods) or any(m.bias is not None for m in mods):
                continue
            w = torch.cat([m.weight.detach() for m in mods])
            rows = [m.out_features for m in mods]
            stash = {}

            def forward(x, i, w=w, rows=rows, stash=stash):
                held = stash.get("outs")
                if held is not None and stash.get("x") is x and i in held:
                    return held.pop(i)
                outs = torch.split(F.linear(x, w), rows, dim=-1)
                stash.update(x=x, outs={j: o for j, o in enumerate(outs) if j != i})
                return outs[i]
            for i, m in enumerate(mods):
                m.forward = (lambda i, f=forward: lambda x: f(x, i))(i)
                patched.append(m)
            sets += 1

    def undo():
        for m in patched:
            m.__dict__.pop("forward", None)
    undo.sets = sets
    return undo


def decoders_used(model) -> dict:
    """{"<encoding> <N>x<K> S=<S>": decoder variant name} the prepared model's compressed layers
    decode with on their device (dispatch.decoder_variant: a variant fixed by use_decoders, else
    the policy's measured choice, else the extension's default)."""
    from unweight.runtime import dispatch
    from unweight.runtime.modules import compressed_modules
    from unweight.runtime.tuning_table import decoder_names, default_decoder
    out = {}
    for _, m in compressed_modules(model):
        w = m.encoded()
        names = {v: n for n, v in decoder_names(w.encoding_name).items()}
        v = dispatch.decoder_variant(w, w.device, m.policy)
        out[f"{w.encoding_name} {w.rows}x{w.cols} S={w.chk_interval}"] = names.get(v) or default_decoder(w.encoding_name)
    return dict(sorted(out.items()))


def _static_cache(model, batch, max_len):
    from transformers import StaticCache
    try:
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # transformers before 5: batch size, device and dtype up front
        p = next(model.parameters())
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_len, device=p.device,
                           dtype=p.dtype)


def _rewind(cache, length: int) -> None:
    """Put the static cache's write position back to `length`.  transformers 5 StaticCache
    layers ignore cache_position and append at a running count (a device tensor, advanced inside
    a captured graph too), so every repeated step would write one slot further; rewinding before
    each group of steps keeps the repeats on the same slots, as older releases did by position."""
    import torch
    for layer in getattr(cache, "layers", None) or ():
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.fill_(length)
        elif isinstance(n, int):
            layer.cumulative_length = length


def _compare(out: dict, what: str, got, ref) -> None:
    """out[<what>_bitwise] / out[<what>_max_abs_diff]: got against ref (bf16 tensors)."""
    import torch
    out[f"{what}_bitwise"] = bool(torch.equal(got.view(torch.int16), ref.view(torch.int16)))
    out[f"{what}_max_abs_diff"] = float((got.float() - ref.float()).abs().max())


def _dynamo_counts() -> dict:
    """Graphs dynamo made and the graph breaks it took since its counters were last cleared."""
    from torch._dynamo.utils import counters
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "break_reasons": sorted(counters["graph_break"])[:5]}


def _compile_config(backend: str | None, out: dict):
    """inductor with its bf16 rounding emulated (recorded in `out`): a fused kernel then rounds
    every bf16 intermediate as eager does, so a compiled model whose matmuls give BF16's bits
    gives the compiled BF16 model's logits (without it, where a fusion ends decides which
    intermediates stay fp32).  The rounding is arithmetic inside memory-bound kernels."""
    if backend != "inductor":
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config
    out["emulate_precision_casts"] = hasattr(inductor_config, "emulate_precision_casts")
    return inductor_config.patch(emulate_precision_casts=True) if out["emulate_precision_casts"] \
        else contextlib.nullcontext()


def time_decode(model, batch: int, prompt: int, steps: int, runs: int, graphs: bool = True, ref_logits=None,
                ref_step=None, compile_backend: str | None = None):
    """Decode-step timing of `model` (see module docstring).  Returns a dict, with the prefill's
    last logits ("last_logits") and the first step's ("step_logits") for the caller to keep or
    drop.  ref_logits / ref_step: the reference model's (None for the reference itself).
    compile_backend: run the step through torch.compile with that backend (the first step
    compiles; its seconds are recorded), eager and captured alike; the prefill stays eager.
    Every mode decodes the same token, the prompt's last, so the steps' logits compare."""
    import torch
    dev = next(model.parameters()).device  # the norms stay parameters in every mode
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device=dev, generator=g)
    cache = _static_cache(model, batch, prompt + max(steps, 8) + 8)
    out = {"batch": batch, "prompt": prompt, "steps_per_run": steps}
    with torch.no_grad(), _compile_config(compile_backend, out):
        pre = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=dev),
                    use_cache=True).logits[:, -1]
        if ref_logits is not None:
            _compare(out, "prefill_logits", pre, ref_logits)
        tok = ids[:, -1:].clone()
        pos = torch.tensor([prompt], device=dev)
        fwd = model
        if compile_backend:
            from torch._dynamo.utils import counters
            counters.clear()
            fwd = torch.compile(model, backend=compile_backend, dynamic=False)

        def step():
            return fwd(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

        _rewind(cache, prompt)
        t0 = time.perf_counter()
        first = step()[:, -1].clone()  # compiles, under compile_backend
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if compile_backend:
            out.update(compile_backend=compile_backend, compile_seconds=time.perf_counter() - t0, **_dynamo_counts())
        if ref_step is not None:
            _compare(out, "step_logits", first, ref_step)
        out["step_logits"] = first

        if dev.type != "cuda":  # CPU self-test of the harness: wall clock, no graphs
            _rewind(cache, prompt)
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            ms = (time.perf_counter() - t0) * 1e3 / steps
            out.update(eager_ms=ms, eager_tokens_per_s=batch * 1e3 / ms, last_logits=pre)
            return out
        _rewind(cache, prompt)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        eager = []
        for _ in range(max(3, runs // 4)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            _rewind(cache, prompt)
            a.record()
            for _ in range(steps):
                step()
            b.record()
            b.synchronize()
            eager.append(a.elapsed_time(b) / steps)
        out.update(eager_ms=statistics.median(eager), eager_min_ms=min(eager),
                   eager_tokens_per_s=batch * 1e3 / statistics.median(eager))
        if graphs:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    _rewind(cache, prompt)
                    for _ in range(2):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                _rewind(cache, prompt)
                for _ in range(3):
                    graph.replay()
                torch.cuda.synchronize()
                ts = []
                evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(runs)]
                for a, b in evs:
                    _rewind(cache, prompt)
                    a.record()
                    for _ in range(steps):
                        graph.replay()
                    b.record()
                torch.cuda.synchronize()
                ts = [a.elapsed_time(b) / steps for a, b in evs]
                out.update(graph_ms=statistics.median(ts), graph_min_ms=min(ts), graph_runs_ms=ts,
                           graph_tokens_per_s=batch * 1e3 / statistics.median(ts))
                del graph
                # The step less its lm_head (timed alone, in a graph of its own): the layers' time,
                # which is what a model with more layers multiplies (this one's head is a large
                # share of its weights).
                head = _head_ms(model, batch, runs)
                out.update(lm_head_ms=head, layers_ms=out["graph_ms"] - head)
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured is a finding
                out["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                torch.cuda.synchronize()
    out["last_logits"] = pre
    return out


def _head_ms(model, batch: int, runs: int) -> float:
    """Median ms of model.lm_head on a [batch, 1, hidden] bf16 input (bu.graph_time: replayed in
    a CUDA graph; the head's weights are many times L2, so one copy)."""
    import torch
    head = model.get_output_embeddings()
    h = torch.randn(batch, 1, model.config.hidden_size, device=next(model.parameters()).device).to(torch.bfloat16)
    return bu.graph_time(torch, [lambda: head(h)], runs=runs)["median_ms"]


def time_load_check(model, mode: str) -> dict:
    """The load check (runtime/verify.py) of the model's compressed weights as `mode` holds
    them: each decoded where it is held and hashed there (the host codec on a CPU), timed with
    the syncs it makes.  ms_per_GB: per GB of BF16 weights checked."""
    from unweight.runtime.modules import compressed_modules
    from unweight.runtime.verify import HeldCheck
    t0 = time.perf_counter()
    check, nbytes = HeldCheck(), 0
    for n, m in compressed_modules(model):
        if not m.is_tied:
            check.module(f"{n}.weight", m)
            nbytes += m.n_rows * m.n_cols * 2
    k = check.finish()
    s = time.perf_counter() - t0
    return {"mode": mode, "tensors": k, "bf16_bytes": nbytes, "seconds": s,
            "ms_per_GB": s * 1e3 / max(nbytes / 1e9, 1e-12)}


def _device_errors(dev):
    from unweight.runtime import scratch
    return scratch.device_errors(dev) if dev.type == "cuda" else 0


def run(torch, layers: int, batches, modes, budget: "bu.Budget", prompt: int = 128, steps: int = 16, runs: int = 20,
        device: str = "cuda", cfg_over: dict | None = None, out_path: str | None = None, log=print) -> dict:
    """The end-to-end benchmark within `budget` (modes that would not fit are skipped and
    recorded).  device="cpu" with a tiny cfg_over is the harness' self-test."""
    from unweight.runtime import dispatch
    from unweight.runtime import prepare as prep
    dev = torch.device(device)
    cfg = llama8b_config(layers, **(cfg_over or {}))
    res = {"benchmark": "e2e", "environment": bu.environment(torch),
           "model": f"Llama-3.1-8B-shaped, {layers} layers, N(0, 0.02) BF16 weights made on the device",
           "config": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                   "num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads")},
           "prompt": prompt, "steps_per_run": steps, "runs": runs, "modes": {}, "skipped": []}

    def save():
        if out_path:
            bu.write_json(out_path, {k: v for k, v in res.items()})

    t0 = time.perf_counter()
    model = build_model(cfg, device)
    res["build_seconds"] = time.perf_counter() - t0
    weights = sum(p.numel() * 2 for p in model.parameters() if p.dim() == 2)
    # The backend "+compile" modes compile with: inductor on a GPU; the CPU self-test only traces
    # (dynamo with the eager backend), which keeps it quick.
    backend = "inductor" if dev.type == "cuda" else "eager"
    refs, steps_ref, compiled_ref = {}, {}, {}
    entry = {"weight_bytes": weights, "runs": []}
    t_bf16 = time.perf_counter()
    for b in batches:
        r = time_decode(model, b, prompt, steps, runs)
        refs[b], steps_ref[b] = r.pop("last_logits"), r.pop("step_logits")
        entry["runs"].append(r)
    res["modes"]["bf16"] = entry
    # The first compressed mode's time, until one is measured: its timing is the BF16 model's,
    # and its prepare (the palette transcode on the GPU, the planes' reorder) a few seconds.
    # (A fixed guess sized for 4 layers would leave the 32-layer model no time for a mode after
    # its encode.)
    first_mode = 1.5 * (time.perf_counter() - t_bf16) + 5.0
    log("e2e bf16: " + _summary(entry))
    save()
    # A compiled mode times the first batch only (the decode step at batch 1 where it is listed
    # first): the step compiles for static shapes, so every batch would be a compile of its own.
    compiled_batches = list(batches[:1])
    compile_s = COMPILE_SECONDS

    def bf16_variant(net, name: str, entry: dict, compiled: bool = False) -> None:
        """Time the BF16 model `net` as it is now (a BF16 reference variant), recorded as `name`."""
        for b in compiled_batches if compiled else batches:
            r = time_decode(net, b, prompt, steps, runs, ref_logits=refs[b], ref_step=steps_ref[b],
                            compile_backend=backend if compiled else None)
            r.pop("last_logits", None)
            step = r.pop("step_logits", None)
            if compiled:
                compiled_ref[b] = step
            entry["runs"].append(r)
        res["modes"][name] = entry
        log(f"e2e {name}: " + _summary(entry))
        save()

    # each as long as a compressed mode (~20 s on an H200); the compiled one compiles first
    for name, need in (("bf16+merged", 40.0), ("bf16+l2", 40.0), ("bf16+compile", COMPILE_SECONDS)):
        if name in modes and budget.left() < need:
            res["skipped"].append({"mode": name, "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
            modes = [m for m in modes if m != name]
    if "bf16+merged" in modes:  # the BF16 model with its siblings stacked, as a serving engine holds them
        undo = stack_dense_siblings(model)
        try:
            bf16_variant(model, "bf16+merged", {"stacked_sets": undo.sets, "runs": []})
        finally:
            undo()
    if "bf16+l2" in modes and dev.type == "cuda":  # the BF16 model with the same L2 prefetch
        from unweight.runtime import prefetch as l2
        pf = l2.attach(model, [], dev)
        hooks = [m.register_forward_hook(lambda mod, args, out: pf.after(mod))
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        try:
            entry = {"l2_prefetch_bytes": pf.budget, "runs": []}
            bf16_variant(model, "bf16+l2", entry)
            entry["prefetches"] = pf.issued
            save()
        finally:
            for h in hooks:
                h.remove()
            l2.detach(model)
    elif "bf16+l2" in modes:
        res["skipped"].append({"mode": "bf16+l2", "why": "the L2 prefetch runs on CUDA only"})
    if "bf16+compile" in modes:  # the BF16 model compiled: the reference of every "+compile" mode
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            bf16_variant(model, "bf16+compile", {"runs": []}, compiled=True)
            compile_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - a model that cannot compile is a finding
            res["modes"]["bf16+compile"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"e2e bf16+compile: {type(e).__name__}: {e}")
            save()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        finally:
            torch._dynamo.reset()
    modes = [m for m in modes if m not in BF16_VARIANTS]
    sec = compress_in_place(model, "huffman")
    res["encode_seconds"] = sec
    per_mode = None
    helpers = bu.import_helpers()
    fused_paths = helpers.fused_paths()
    for mode in modes:
        if "+fused" in mode and mode.split("+")[0] not in fused_paths:
            res["skipped"].append({"mode": mode, "why": "this build has no fused kernel for that encoding"})
            continue
        need = 2 * (per_mode or first_mode)
        if budget.left() < need:
            res["skipped"].append({"mode": mode, "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
            continue
        t0 = time.perf_counter()
        base, _, extra = mode.partition("+")
        compiled, extra = _take_suffix(extra, "compile")
        if compiled:
            need = (per_mode or first_mode) + compile_s
            if budget.left() < need:
                res["skipped"].append({"mode": mode, "why": f"{budget.left():.0f} s left, about {need:.0f} s needed"})
                continue
            torch._dynamo.reset()  # each mode's modules are new to dynamo; nothing of the last mode's kept
        l2, extra = _take_suffix(extra, "l2")
        merged, extra = _take_suffix(extra, "merged")
        pdl, extra = _take_suffix(extra, "pdl")
        tiled, extra = _take_suffix(extra, "tiled")
        order = "tiled" if tiled else "file"  # explicit: "auto" would follow whatever tuning table this machine has
        # "+<decoder variant>" (chain, ahead, ahead2, ring; vec8, wide): the decode runs that variant for this mode
        decoder = extra if extra and extra not in FUSED_PATHS else None
        previous = dispatch.use_decoders(**{base: decoder}) if decoder else None
        # ("+pdl": programmatic launch on for this mode only)
        with helpers.programmatic(True) if pdl else contextlib.nullcontext(False) as pdl_on:
            try:
                # Stacked siblings: "+merged" always; a forced fused path never (its policy would
                # record the stack as measured); otherwise the runtime's default ("auto").
                merge = True if merged else False if extra in FUSED_PATHS else "auto"
                info = prep.prepare(model, base, policy=None, plane_order=order, merge_siblings=merge, l2_prefetch=l2)
                if extra in FUSED_PATHS:
                    pol = forced_fused_policy(model, dev, FUSED_PATHS[extra])
                    info = prep.prepare(model, base, policy=pol, plane_order=order, merge_siblings=merge,
                                        l2_prefetch=l2)
                entry = {"info": {k: info.get(k) for k in ("mode", "modules", "held_bytes", "bf16_bytes", "ratio",
                                                           "tiled_modules", "paired_palette_modules",
                                                           "sibling_groups", "l2_prefetch_bytes")},
                         **({"programmatic_launch": pdl_on} if pdl else {}),
                         "decoders": decoders_used(model), "prepare_seconds": time.perf_counter() - t0, "runs": []}
                if base in ("palette", "huffman") and f"load_check_{base}" not in res:
                    try:  # once per encoding: the check a load runs, on the weights as this mode holds them
                        res[f"load_check_{base}"] = time_load_check(model, mode)
                    except Exception as e:  # noqa: BLE001 - a finding; the mode's timing still runs
                        res[f"load_check_{base}"] = {"mode": mode, "error": f"{type(e).__name__}: {e}"}
                for b in compiled_batches if compiled else batches:
                    # a compiled mode's steps compare with the compiled BF16 model's where it ran
                    r = time_decode(model, b, prompt, steps, runs, ref_logits=refs[b],
                                    ref_step=compiled_ref.get(b, steps_ref[b]) if compiled else steps_ref[b],
                                    compile_backend=backend if compiled else None)
                    r.pop("last_logits", None)
                    r.pop("step_logits", None)
                    if compiled:
                        r["step_reference"] = "bf16+compile" if b in compiled_ref else "bf16"
                    entry["runs"].append(r)
                entry["device_errors"] = _device_errors(dev)
            except Exception as e:  # noqa: BLE001 - a failing mode is a finding; the next one still runs
                entry = {"error": f"{type(e).__name__}: {e}"}
                if dev.type == "cuda":
                    torch.cuda.synchronize()
            finally:
                if previous is not None:
                    dispatch.use_decoders(**previous)
                if compiled:
                    torch._dynamo.reset()
        if not compiled:  # the estimate for the next mode: a compiled one adds its compile
            per_mode = time.perf_counter() - t0
        res["modes"][mode] = entry
        log(f"e2e {mode}: " + (_summary(entry) if "runs" in entry else entry["error"]))
        save()
        if mode == "dense":
            break  # the modules are plain nn.Linear now: nothing compressed is left to prepare
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _summary(entry) -> str:
    parts = []
    for r in entry["runs"]:
        g = f"{r['graph_tokens_per_s']:.1f}" if "graph_tokens_per_s" in r else "no graph"
        parts.append(f"batch {r['batch']}: {g} tok/s graph, {r['eager_tokens_per_s']:.1f} eager"
                     + (f" (layers {r['layers_ms']:.3f} ms, lm_head {r['lm_head_ms']:.3f} ms)"
                        if "layers_ms" in r else "")
                     + (f" (compiled in {r['compile_seconds']:.1f} s, {r['graph_breaks']} graph breaks)"
                        if "compile_seconds" in r else "")
                     + ("" if r.get("prefill_logits_bitwise", True) else " (prefill logits differ)"))
    return "; ".join(parts)


def summary_rows(res) -> list:
    """One table row per (mode, batch) that was timed: tokens/s with the step in a CUDA graph
    and eagerly, and whether the prefill logits equal BF16's.  Failed or skipped modes have no row."""
    rows = []
    for mode, entry in res.get("modes", {}).items():
        for r in entry.get("runs", ()):
            rows.append({"mode": mode, "batch": r["batch"],
                         "graph_tok_s": round(r["graph_tokens_per_s"], 1) if "graph_tokens_per_s" in r else "-",
                         "eager_tok_s": round(r["eager_tokens_per_s"], 1),
                         "prefill_bitwise": r.get("prefill_logits_bitwise", "ref")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=bu.positive_int, default=4)
    ap.add_argument("--batches", type=bu.positive_int_list, default=[1, 16], help="comma list, e.g. 1,16")
    ap.add_argument("--modes", default="huffman,palette,dense", help="comma list of " + ", ".join(MODES))
    ap.add_argument("--prompt", type=bu.positive_int, default=128)
    ap.add_argument("--steps", type=bu.positive_int, default=16, help="graph replays per timed run")
    ap.add_argument("--runs", type=bu.positive_int, default=20)
    ap.add_argument("--budget", type=bu.positive_float, default=900.0)
    ap.add_argument("--out", help="result JSON (default: benchmarks/results/e2e-<date>-<gpu>-<commit>.json)")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"bench_e2e: unknown mode {bad[0]!r}: choose from {', '.join(MODES)}" if bad
              else f"bench_e2e: no mode named: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    out = bu.writable_path(args.out, "bench_e2e") if args.out else None
    torch = bu.require_gpu()
    out = out or bu.result_path("e2e", bu.machine_tag(torch.cuda.get_device_name(0)))
    res = run(torch, args.layers, args.batches, modes, bu.Budget(args.budget), args.prompt,
              args.steps, args.runs, out_path=out)
    rows = summary_rows(res)
    bu.print_table(rows, ["mode", "batch", "graph_tok_s", "eager_tok_s", "prefill_bitwise"])
    print("wrote", out)
    if not any(m != "bf16" for m in {r["mode"] for r in rows}):
        print("bench_e2e: no compressed mode was measured (each failed or was skipped); " + out
              + " records the errors and skips", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
