"""Mode selection: finish a model whose compressed modules hold loaded planes.

``prepare(model, mode, policy)`` runs after the weights are in (``unweight.load`` and
``from_pretrained`` through the quantizer both call it): it decodes the dense fallbacks,
validates every loaded header, applies the mode per module, builds the CUDA decode tables,
hands each compressed module its dispatch policy and reserves the per-device scratch.

Modes (runtime/modes.py):
    "huffman" / "palette": weights stay compressed on the device; a checkpoint in the other
        encoding is transcoded at load (on the GPU when the CUDA kernels are built, else with
        the CPU codec).
    "dense": decode once at load into ordinary nn.Linear / nn.Embedding (ties preserved).
    "auto": CPU: dense when the decoded encoded weights take <= 50 % of MemAvailable, else
        the checkpoint's encoding (decode-per-forward is only worth it when memory is short).
        CUDA: dense when everything fits in 80 % of free device memory; otherwise every
        compressed layer shape is timed (compressed forward, huffman with the checkpoint index
        it keeps, vs dense F.linear, CUDA events, batch 1) and layers are densified greedily
        by slowdown-per-saved-byte while the budget lasts.  Layers kept compressed get what
        the explicit modes give them: the index (huffman) and the decode tables.
    A CUDA device without the compiled ``unweight._cuda`` module runs dense (one warning).

Mixture-of-experts parameters (runtime/experts.py ExpertStack) follow the same modes: dense
decodes them into ordinary 3-D parameters; huffman / palette keep them compressed, decode
only the experts a forward routes to, each into its own slot of the scratch, and switch the
model's experts implementation to one that takes one routed expert at a time
(experts.routed_experts_forward, bitwise the default implementation's result).  "auto"
counts their decoded bytes with everything else; on CUDA, when not everything fits, the
experts stay compressed (they are the bulk of such a model) and the remaining budget goes to
the other layers as above.
"""
from __future__ import annotations

import json
import logging
import types
import warnings

import numpy as np
import torch
import torch.nn as nn

from .. import ops
from ..codec import tensor_codec as tc
from ..format import constants as C
from . import dispatch, experts, scratch, selftest, siblings
from . import prefetch as l2
from . import policy as policies
from .convert import decode_fallbacks, set_module
from .modes import check_mode, check_plane_order
from .modules import CompressedEmbedding, CompressedLinear, CompressedWeightMixin, compressed_modules
from .verify import HeldCheck

log = logging.getLogger(__name__)

_WARNED = set()


def _warn_once(key: str, msg: str):
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, stacklevel=3)
        log.warning(msg)


def _report_unmeasured(lins: list, policy: policies.DispatchPolicy | None) -> None:
    """The palette matmul shapes on a GPU that the tuning table has no measurement for, named
    in one warning per GPU (DispatchPolicy.report_unmeasured): they run decode + cuBLAS."""
    if policy is None:
        return
    ws = []
    for m in lins:
        if not m.is_tied and m.encoding == C.ENC_PALETTE and m.device.type == "cuda":
            group = m.__dict__.get("_uw_group")  # a stacked sibling runs its stack's matmul
            ws.append((group.w if group is not None else m.encoded(), m.device))
    policy.report_unmeasured(ws)


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _dense_weight(m: CompressedWeightMixin) -> torch.Tensor:
    """Decoded bf16 [rows, cols] weight on m's device (device kernels when usable)."""
    dev = m.device
    if dev.type == "cpu" or (dev.type == "cuda" and ops.cuda_kernels_built()):
        return m.decode_weight()
    o = m.owner()
    return torch.from_numpy(tc.decode(o.header, o.host_planes(), verify=False)).view(torch.bfloat16).to(dev)


def _to_dense(model: nn.Module, name: str, m: CompressedWeightMixin, dense_of: dict):
    if isinstance(m, CompressedEmbedding):
        new = nn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx, device="meta")
    else:
        new = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        if m.bias is not None:
            new.bias = m.bias
    src = m.owner()
    if m.is_tied and id(src) in dense_of:
        new.weight = dense_of[id(src)]  # keep the tie: one Parameter, two modules
    else:
        new.weight = nn.Parameter(_dense_weight(m), requires_grad=False)
        dense_of[id(src)] = new.weight
    set_module(model, name, new)
    return new


def _transcode(m: CompressedWeightMixin, target: str, policy: policies.DispatchPolicy | None = None):
    """Re-encode m's planes as `target` ("palette" or "huffman") on its device; a GPU decodes
    the Huffman stream with the decoder the policy measured fastest for its shape."""
    if target == m.encoding_name:
        return
    h = m.header
    if target == "palette" and (m.device.type == "cpu" or ops.cuda_kernels_built()):
        hdr, planes = ops.transcode_to_palette(h, m.planes(), m.lut(), scratch.error_counter(m.device),
                                               dispatch.decoder_variant(h, m.device, policy))
    else:
        o = m.owner()
        w = tc.decode(h, o.host_planes(), verify=False)
        enc = tc.encode(w, target, grid=(h.rows_per_group, h.cols_per_chunk))
        hdr, planes = enc.header, enc.planes
    m.replace_planes(hdr, planes)


def _build_lut(m: CompressedWeightMixin):
    # An empty LUT is the only stale one: replace_planes (transcode, index) drops it.
    if m.is_tied or m.encoding != C.ENC_HUFFMAN or m.device.type != "cuda" or m.weight_lut.numel():
        return
    m.weight_lut = ops.build_lut(m.code_table(), m.exp_lo, m.exp_hi, scratch.error_counter(m.device))


def _add_index(m: CompressedWeightMixin, policy: policies.DispatchPolicy | None = None):
    """A huffman weight kept compressed on a GPU gets the checkpoint index when its file has
    none: without it the decode kernel runs one thread per segment, a few per SM.  Built on
    the GPU (ops.build_index: one decode of the stream as stored, with the decoder the policy
    measured fastest for it)."""
    if m.is_tied or m.encoding != C.ENC_HUFFMAN or m.device.type != "cuda" or not ops.cuda_kernels_built():
        return
    _build_lut(m)  # (the decode below runs through it)
    h = m.header
    indexed = ops.build_index(h, m.planes(), m.lut(), scratch.error_counter(m.device),
                              variant=dispatch.decoder_variant(h, m.device, policy))
    if indexed is not None:
        m.replace_planes(*indexed)


def prepare_module(m: CompressedWeightMixin, policy: policies.DispatchPolicy | None = None) -> None:
    """Ready one compressed module built by hand (tests, benchmarks) to run on its device:
    CUDA decode tables (and checkpoint index), scratch, policy (None: decode + F.linear only)."""
    _add_index(m, policy)
    _build_lut(m)
    _hold_palette(m)
    if not (isinstance(m, CompressedEmbedding) and m.device.type == "cpu"):
        scratch.reserve(m.device, m.n_rows * m.n_cols)
    m.policy = policy


def _hold_palette(m: CompressedWeightMixin) -> None:
    """The palette order a module runs in: paired on CUDA (ops.paired_palette, the decode's
    cheaper lookup; the same weights, so always), as stored on CPU, where the codec's lookup
    costs the same in any order."""
    m.set_palette_order("paired" if m.device.type == "cuda" else "file")


def _time_cuda(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def _auto_modes(owners: list, stacks: list = (), policy: policies.DispatchPolicy | None = None) -> dict:
    """{id(owner or ExpertStack): "dense" | "compressed"} by the rule in the module docstring."""
    out = {}
    by_dev = {}
    for n, m in owners:
        by_dev.setdefault(m.device, []).append((n, m))
    st_by_dev = {}
    for st in stacks:
        st_by_dev.setdefault(st.device, []).append(st)
        by_dev.setdefault(st.device, [])
    for dev, items in by_dev.items():
        sts = st_by_dev.get(dev, [])
        extra = sum(m.decoded_bytes() - m.held_bytes() for _, m in items)
        st_extra = sum(st.decoded_bytes() - st.held_bytes() for st in sts)
        if dev.type == "cpu":
            total = sum(m.decoded_bytes() for _, m in items) + sum(st.decoded_bytes() for st in sts)
            choice = "dense" if total <= 0.5 * _meminfo_available() else "compressed"
            out.update({id(m): choice for _, m in items})
            out.update({id(st): choice for st in sts})
            continue
        free, _total = torch.cuda.mem_get_info(dev)
        budget = 0.8 * free
        if extra + st_extra <= budget:
            out.update({id(m): "dense" for _, m in items})
            out.update({id(st): "dense" for st in sts})
            continue
        out.update({id(st): "compressed" for st in sts})
        if extra <= budget:
            out.update({id(m): "dense" for _, m in items})
            continue
        # Time one layer per distinct shape/encoding: compressed forward vs dense forward.
        cost = {}
        for _, m in items:
            key = (m.n_rows, m.n_cols, m.encoding, type(m).__name__)
            if key in cost or isinstance(m, CompressedEmbedding):
                continue
            # Timed as it would run if kept: with the checkpoint index a huffman weight on a
            # GPU gets, without which its decode has a fraction of the parallelism.
            _add_index(m, policy)
            _build_lut(m)
            x = torch.randn(1, m.n_cols, dtype=torch.bfloat16, device=dev)
            w = m.decode_weight()
            t_c = _time_cuda(lambda: m(x))
            t_d = _time_cuda(lambda w=w: torch.nn.functional.linear(x, w))
            del w
            cost[key] = max(0.0, t_c - t_d)
        ranked = sorted(items, key=lambda it: -cost.get((it[1].n_rows, it[1].n_cols, it[1].encoding,
                                                         type(it[1]).__name__), 0.0)
                        / max(1, it[1].decoded_bytes() - it[1].held_bytes()))
        for _, m in ranked:
            add = m.decoded_bytes() - m.held_bytes()
            if add <= budget and cost.get((m.n_rows, m.n_cols, m.encoding, type(m).__name__), 0.0) > 0:
                out[id(m)] = "dense"
                budget -= add
            else:
                out[id(m)] = "compressed"
    return out


def prepare(model: nn.Module, mode: str = "auto", policy: policies.DispatchPolicy | None = None,
            plane_order: str = "auto", merge_siblings: bool | str = "auto", l2_prefetch: bool = False,
            verify: bool | HeldCheck = False) -> dict:
    """Finish a model whose compressed modules hold loaded planes: validate, apply `mode`,
    build device tables, set the dispatch policy (default: the measured one, which only ever
    picks a fused kernel on CUDA), reserve scratch.  plane_order: "tiled" holds every palette
    matmul weight that can be tile-major (CompressedWeightMixin.set_plane_order; the same
    results, the planes in the order the fused kernels stream; on CPU, where the codec reads
    file order, each decode untiles them first), "file" keeps the stored order, "auto" each
    weight in the order the policy's table measured faster for its shape and device (a shape
    it never timed: the nearest timed shape's, DispatchPolicy.plane_order; file order where
    nothing applies, and on CPU).  Palette weights on CUDA hold their
    palette in paired order (CompressedWeightMixin.set_palette_order).  merge_siblings: True
    stacks each parent's sibling projections that read one input (q/k/v, gate/up;
    runtime/siblings.py) into one palette matrix that a forward multiplies once, the members'
    planes views of it; "auto" (the default) only where the policy measured the stack faster
    than its members apart (never on CPU); False never.  l2_prefetch: on a model whose
    compressed matmuls are on one CUDA device, prefetch each matmul's weight into L2 while the
    kernels before it run (runtime/prefetch.py; a hint that changes no result).  verify: check
    every weight the model holds, once its mode is applied, against its checkpoint crc32 where
    it is held (runtime/verify.py: a GPU decodes and hashes its own weights); ChecksumError
    names the first that differs.  A HeldCheck given as `verify` is the one used (tensor
    parallelism: its shard records; its policy becomes prepare's).  Returns the summary stored
    as model.unweight_info."""
    check_mode(mode)
    check_plane_order(plane_order, ValueError)
    if merge_siblings not in (True, False, "auto"):
        raise ValueError(f"merge_siblings={merge_siblings!r}: choose True, False or 'auto'")
    siblings.dissolve_all(model)  # a mode or order applies to each module alone; merged again below
    plan = getattr(model, "_unweight_plan", {}) or {}
    decode_fallbacks(model, plan)
    cms = compressed_modules(model)
    owners = [(n, m) for n, m in cms if not m.is_tied]
    for n, m in owners:
        m.check_loaded(n)
    stacks = experts.expert_stacks(model)
    for n, _, _, st in stacks:
        for p in st.planes():
            p.check_loaded(n)
    devices = [m.device for _, m in owners] + [st.device for *_, st in stacks]
    if any(d.type == "cuda" for d in devices) and not ops.cuda_kernels_built() and mode != "dense":
        _warn_once("nocuda", "unweight: the CUDA kernels (unweight._cuda) are not built; compressed modules on "
                   "the GPU are decoded to dense weights at load")
        mode = "dense"
    if any(d.type not in ("cpu", "cuda") for d in devices):
        bad = sorted({str(d) for d in devices if d.type not in ("cpu", "cuda")})
        if mode != "dense":
            log.warning("unweight: modules on %s run dense (no decode kernels there)", ", ".join(bad))
    # CUDA decode tables first: auto's timing and the on-device transcode decode through them.
    for _, m in owners:
        _build_lut(m)
    choice = {}
    policy = policy if policy is not None else policies.measured()
    auto = _auto_modes(owners, [st for *_, st in stacks], policy) if mode == "auto" else {}
    for n, m in owners:
        if m.device.type not in ("cpu", "cuda"):
            choice[id(m)] = "dense"
        elif mode == "auto":
            choice[id(m)] = auto[id(m)]
        elif mode == "dense":
            choice[id(m)] = "dense"
        else:
            choice[id(m)] = mode
    dense_of = {}
    if isinstance(verify, HeldCheck):
        check = verify
        check.policy = policy
        check.locations = {**plan.get("locations", {}), **check.locations}
    else:
        check = HeldCheck(policy, plan.get("locations")) if verify else None
    counts = {"dense": 0, "huffman": 0, "palette": 0}
    # Owners first so a tied module finds its source's dense Parameter.
    for n, m in sorted(cms, key=lambda it: it[1].is_tied):
        c = choice[id(m.owner())]
        if c == "dense":
            m.policy = policy  # its decode at load runs the decoder the table chose for its shape
            new = _to_dense(model, n, m, dense_of)
            if check is not None and not m.is_tied:
                check.dense(f"{n}.weight", m.header, new.weight)
            counts["dense"] += 1
            continue
        if not m.is_tied:
            # c: "huffman" / "palette", or auto's "compressed" (the checkpoint's encoding kept);
            # either way a huffman weight on a GPU needs its index and decode tables.
            if c in ("huffman", "palette"):
                _transcode(m, c, policy)
            _add_index(m, policy)
            _build_lut(m)
        counts[m.encoding_name] += 1
    experts_info = _prepare_experts(model, plan, stacks, mode, auto, policy, check)
    # Scratch: one per device, the largest decoded weight that decodes into it (an experts
    # module's parameters each have a slot: their sum).
    need = dict(experts_info.pop("scratch"))
    for n, m in compressed_modules(model):
        if isinstance(m, CompressedEmbedding) and m.device.type == "cpu":
            continue  # CPU embeddings gather rows without the scratch
        k = str(m.device)
        need[k] = max(need.get(k, 0), m.n_rows * m.n_cols)
    for dev, numel in need.items():
        scratch.reserve(dev, numel)
    tiled = paired = 0
    for _, m in compressed_modules(model):
        m.policy = policy
        m.set_plane_order(plane_order)
        tiled += m.plane_order == "tiled" and not m.is_tied
        _hold_palette(m)
        paired += m.palette_order == "paired" and not m.is_tied
    for *_, st in experts.expert_stacks(model):
        st.policy = policy
    verified = None
    if check is not None:  # the weights as the forwards will read them (before stacking siblings)
        for n, m in compressed_modules(model):
            if not m.is_tied:
                check.module(f"{n}.weight", m)
        for n, _, _, st in experts.expert_stacks(model):
            check.stack(n, st)
        verified = check.finish()
    # The fused kernels the policy may run on each GPU and its row gathers, checked there before
    # any forward (and before stacking siblings, whose gain counts only paths that passed).
    kernel_checks = {}  # what this preparation checked (a device checked earlier: nothing new)
    for d in need:
        if torch.device(d).type == "cuda":
            fused = selftest.check_fused_paths(policy, d)
            kernel_checks[d] = {"fused_checked": len(fused),
                                "fused_failed": sorted({f"{p}{' (tile-major)' if t else ''}"
                                                        for (p, t, _), r in fused.items() if not r["passed"]}),
                                "row_gathers": selftest.check_gather(d)}
    stacked = (siblings.merge_siblings(model, "auto" if merge_siblings == "auto" else "always", plane_order)
               if merge_siblings else {"groups": [], "skipped": {}})
    prefetcher = None
    l2.detach(model)
    lins = [m for _, m in compressed_modules(model) if isinstance(m, CompressedLinear)]
    if l2_prefetch and lins:
        devs = {str(m.device) for m in lins}
        if len(devs) == 1 and lins[0].device.type == "cuda" and ops.cuda_kernels_built():
            prefetcher = l2.attach(model, lins, lins[0].device)
        else:
            log.warning("unweight: L2 prefetch needs every compressed matmul on one CUDA device (%s); left off",
                        ", ".join(sorted(devs)))
    info = {"mode": mode, "modules": counts, "experts": experts_info, "verified_tensors": verified,
            "tiled_modules": tiled,
            "paired_palette_modules": paired, "sibling_groups": len(stacked["groups"]),
            "l2_prefetch_bytes": prefetcher.budget if prefetcher is not None else 0,
            **_held_totals(model, experts_info),
            "scratch_bytes": {d: scratch.scratch_bytes(d) for d in need},
            "kernel_checks": kernel_checks,
            "tied": plan.get("tied", []),
            "dense_fallback": [f"{fb['module']}.{fb['attr']} ({fb['type']})" for fb in plan.get("dense_fallback", [])]}
    model.unweight_info = info
    _report_unmeasured(lins, policy)
    _guard_tie_weights(model)
    _count_compressed_weights(model)
    _densify_on_resize(model)
    if ops.programmatic_launch():
        # A launch started early reads its planes before it waits on the launch ahead: the
        # planes this preparation wrote on the devices (transcodes, tile-major copies, rewritten
        # indices) are complete before any forward.
        for d in need:
            if torch.device(d).type == "cuda":
                torch.cuda.synchronize(d)
    log.info("unweight: %s", json.dumps({k: v for k, v in info.items() if k != "tied"}))
    return info


def _held_totals(model: nn.Module, experts_info: dict) -> dict:
    """held_bytes, bf16_bytes and their ratio over the model's compressed modules and expert
    stacks (a tied module shares its source's planes and counts once)."""
    cms = compressed_modules(model)
    held = sum(m.held_bytes() for _, m in cms) + experts_info["held_bytes"]
    bf16 = sum(m.decoded_bytes() for _, m in cms if not m.is_tied) + experts_info["bf16_bytes"]
    return {"held_bytes": held, "bf16_bytes": bf16, "ratio": held / bf16 if bf16 else None}


def _stack_mode(st, mode: str, auto: dict) -> str:
    if st.device.type not in ("cpu", "cuda") or mode == "dense":
        return "dense"
    if mode == "auto":
        return "dense" if auto.get(id(st)) == "dense" else next(iter(sorted(st.encodings())))
    return mode


def _prepare_experts(model: nn.Module, plan: dict, stacks: list, mode: str, auto: dict,
                     policy: policies.DispatchPolicy | None, check: HeldCheck | None = None) -> dict:
    """Apply the mode to every ExpertStack (a transcode on a GPU decodes with the policy's
    decoder); returns the summary for model.unweight_info plus the scratch each device needs
    ("scratch": {device: weights})."""
    created = {(e["module"], e["attr"]): e.get("created", []) for e in plan.get("experts", [])}
    info = {"stacks": 0, "experts": 0, "dense": 0, "held_bytes": 0, "bf16_bytes": 0, "encodings": [],
            "paired_palette_tensors": 0, "scratch": {}}
    slots = {}  # id(experts module) -> next free scratch offset
    for name, mod, attr, st in stacks:
        m = _stack_mode(st, mode, auto)
        if m == "dense":
            headers = HeldCheck.stack_headers(st)
            experts.to_dense(model, mod, attr, st, created.get((name.rpartition(".")[0], attr), []))
            if check is not None:
                check.dense_stack(name, headers, getattr(mod, attr))
            info["dense"] += 1
            continue
        experts.transcode(st, m, policy)
        experts.prepare_planes(st, experts.add_index(st, policy))
        info["paired_palette_tensors"] += experts.hold_paired(st)  # on CUDA
        st.slot = slots.get(id(mod), 0)
        slots[id(mod)] = st.slot + st.rows * st.cols
        k = str(st.device)
        info["scratch"][k] = max(info["scratch"].get(k, 0), slots[id(mod)])
        info["stacks"] += 1
        info["experts"] += st.num_experts
        info["held_bytes"] += st.held_bytes()
        info["bf16_bytes"] += st.decoded_bytes()
        info["encodings"] = sorted(set(info["encodings"]) | st.encodings())
    if info["stacks"]:
        info["implementation"] = experts.use_routed_forward(model)
    return info


def _guard_tie_weights(model: nn.Module) -> None:
    """Make later ``model.tie_weights()`` calls (lm-eval's HFLM makes one) keep the tie map
    pruned at load.  Recomputing it from the config would try to tie an lm_head to an
    embedding ``weight`` Parameter that no longer exists: those modules share compressed
    planes structurally instead."""
    orig = getattr(model, "tie_weights", None)
    if orig is None or getattr(orig, "_unweight_guard", False):
        return

    def tie_weights(*args, **kwargs):
        kwargs["recompute_mapping"] = False
        try:
            return orig(*args, **kwargs)
        except TypeError:  # transformers versions without recompute_mapping
            kwargs.pop("recompute_mapping")
            return orig(*args, **kwargs)

    tie_weights._unweight_guard = True
    model.tie_weights = tie_weights


def _num_parameters(model: nn.Module, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
    """transformers' ``num_parameters`` counting the weights held compressed too: they are
    planes (buffers), not Parameters, and the model's own count would leave out nearly every
    weight (35 thousand of SmolLM2's 135 million).  They take no gradient, so ``only_trainable``
    leaves them out; ``exclude_embeddings`` leaves out compressed embeddings, as it does an
    nn.Embedding's weight; a tied head shares its embedding's weight and counts once, as in the
    original model."""
    n = type(model).num_parameters(model, only_trainable=only_trainable, exclude_embeddings=exclude_embeddings)
    if only_trainable:
        return n
    for _, m in compressed_modules(model):
        if not m.is_tied and not (exclude_embeddings and isinstance(m, CompressedEmbedding)):
            n += m.n_rows * m.n_cols
    return n + sum(st.numel() for *_, st in experts.expert_stacks(model))


def _count_compressed_weights(model: nn.Module) -> None:
    """Make ``model.num_parameters()`` (lm-eval records it with every result) the original
    model's count in huffman / palette modes (see _num_parameters)."""
    if callable(getattr(type(model), "num_parameters", None)):
        # A bound method: copy.deepcopy binds it to the copy.
        model.num_parameters = types.MethodType(_num_parameters, model)


def _resized_rows(n_rows: int, new_num_tokens: int | None, pad_to_multiple_of: int | None) -> int:
    """The vocabulary size transformers' resize_token_embeddings arrives at (its rounding)."""
    n = n_rows if new_num_tokens is None else new_num_tokens
    if isinstance(pad_to_multiple_of, int) and pad_to_multiple_of > 0:
        n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
    return n


def _resize_token_embeddings(model: nn.Module, new_num_tokens: int | None = None,
                             pad_to_multiple_of: int | None = None, mean_resizing: bool = True):
    """transformers' ``resize_token_embeddings`` on a model whose input or output embeddings
    are held compressed.  transformers only resizes an nn.Embedding / nn.Linear, and a grown
    table has rows no checkpoint holds, so the embeddings that change size are decoded first
    into the dense modules "dense" mode would have given (a tie stays one shared Parameter),
    then resized by transformers itself: the model that results is the one resizing the
    original gives, bit for bit in the rows kept."""
    inp = model.get_input_embeddings()
    out = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    targets = [m for m in (inp, out) if isinstance(m, CompressedWeightMixin)]
    if targets and (new_num_tokens is not None or pad_to_multiple_of is not None):
        rows = inp.num_embeddings if hasattr(inp, "num_embeddings") else inp.weight.shape[0]
        if _resized_rows(rows, new_num_tokens, pad_to_multiple_of) != rows:
            _densify_modules(model, targets)
    return type(model).resize_token_embeddings(model, new_num_tokens, pad_to_multiple_of, mean_resizing)


def _densify_modules(model: nn.Module, targets: list) -> None:
    """Replace the compressed modules `targets` of `model` by their dense equivalents (owners
    before the modules tied to them, so a tie stays one Parameter) and update
    model.unweight_info."""
    names = {id(m): n for n, m in model.named_modules()}
    info = getattr(model, "unweight_info", None)
    dense_of = {}
    for m in sorted(targets, key=lambda t: t.is_tied):
        name = names[id(m)]
        new = _to_dense(model, name, m, dense_of)
        hook = getattr(m, "_hf_hook", None)
        if hook is not None:  # accelerate's device placement hook (device_map dispatch)
            from accelerate.hooks import add_hook_to_module
            add_hook_to_module(new, hook)
        log.info("unweight: %s decoded to a dense %s (%.1f MB) to be resized", name, type(new).__name__,
                 m.decoded_bytes() / 1e6)
        if info is not None:
            info["modules"][m.encoding_name] -= 1
            info["modules"]["dense"] += 1
    if info is not None:
        info.update(_held_totals(model, info["experts"]))


def _densify_on_resize(model: nn.Module) -> None:
    """Make ``model.resize_token_embeddings`` work on compressed embeddings (see
    _resize_token_embeddings)."""
    if callable(getattr(type(model), "resize_token_embeddings", None)):
        model.resize_token_embeddings = types.MethodType(_resize_token_embeddings, model)
