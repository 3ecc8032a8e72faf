"""Tensor parallelism in transformers for unweight checkpoints (``DistributedConfig(tp_plan=...)``).

``torchrun --nproc-per-node N script.py`` with ``AutoModelForCausalLM.from_pretrained(folder,
distributed_config=DistributedConfig(tp_plan="auto"))`` after ``import unweight``:

1. Before weights load (model on meta, torch.distributed already initialized by transformers):
   ``convert_model`` swaps in compressed modules as usual; then :func:`defer_planes` turns
   every compressed module's plane buffers into empty non-persistent placeholders, so
   transformers' loader never materializes a whole encoded tensor on any rank (the checkpoint's
   plane keys are listed in ``_keys_to_ignore_on_load_unexpected``).
2. transformers applies its TP plan to the skeleton (``apply_tensor_parallelism``): our
   CompressedLinear modules have no ``weight`` Parameter to shard, so they only get the style's
   forward wrapper (``ColwiseParallel`` / ``RowwiseParallel`` ``install_forward``).  Every
   compressed module carries ``_hf_quantized_needs_local_tp = True``, transformers' flag for
   "this forward runs on local tensors", so its styles take their local fast paths: colwise
   feeds the replicated input and returns (or all-gathers, for ``colwise_gather_output``) the
   local output shard; rowwise feeds the local input shard and all-reduces the partial output.
   No collective here is ours: they are the TP classes' own.
3. After weights load, :func:`load_tp_planes` reads each encoded tensor from the memory-mapped
   checkpoint and keeps only this rank's block with :func:`unweight.codec.shard.block_planes`
   (colwise style: rows; rowwise style: columns; anything replicated: the whole tensor), so only
   the bytes of the segments that hold the block are ever read: a block on the segment grid is
   its segments copied, any other is decoded from them and encoded anew.
   ``in_features``/``out_features`` keep the full widths (the TP classes use them to build the
   global DTensor shapes).
4. Integrity: with verify on, each rank checks only its shard, as held once prepare has applied
   the mode (:func:`held_check`, runtime/verify.py: on a GPU decoded and hashed there, on the
   CPU by the codec), and the TP group checks every sharded tensor's stored crc32 by crc32
   arithmetic over the shards' crcs (codec/shard_check.py), the same policy as the vLLM
   integration.  Replicated tensors are checked whole; raw tensors keep their crc check.
   UNWEIGHT_VERIFY=host decodes each rank's blocks on the host here instead (and the experts
   each rank holds: :func:`host_check_experts`).  A rank whose block fails its decode raises
   after the group's gather, so the other ranks are not left waiting in it.

Expert parallelism (``ep_size`` > 1) cuts the experts before this runs: ep.py.

Embeddings and tied output projections stay replicated and compressed: a vocab-parallel
embedding / ``colwise_gather_output`` lm_head tied to a replicated embedding computes the same
full result locally, so its TP forward wrapper is removed.  Mode "auto" keeps the weights
compressed under TP (the point of loading a shard); "dense" decodes each rank's shard and
re-installs the style on the new nn.Linear.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import torch
import torch.nn as nn

from ...codec import shard as sh
from ...codec import tensor_codec as tc
from ...codec.shard_check import check_shard_records, decode_record
from ...codec.verify import decode_verified
from ...format.checkpoint import CompressedCheckpoint
from ...format.errors import ChecksumError, FormatError, InputError
from ...runtime.convert import prefixed_names
from ...runtime.modes import sharded_mode
from ...runtime.modules import CompressedEmbedding, CompressedLinear, CompressedWeightMixin, compressed_modules

log = logging.getLogger(__name__)

_ATTR = "_unweight_tp"  # model attribute: {"folder", "bases": {module name: checkpoint base}}


def distributed_world() -> int:
    """World size when torch.distributed is initialized (transformers initializes it for TP), else 1."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 1
    return torch.distributed.get_world_size()


# ------------------------------------------------------------------------ before loading


def refuse_unserved_layouts(model: nn.Module) -> None:
    """Refuse in one line the distributed layouts compressed checkpoints do not follow: FSDP
    (``DistributedConfig(fsdp_size=...)``, ``dp_replicate_size``), which gathers and re-shards
    Parameters for training, where compressed weights are buffers held for inference; and
    pipeline parallelism (``pp_size``), whose stage split does not place the compressed modules
    (it fails with a bare KeyError of a module name)."""
    dc = getattr(model.config, "distributed_config", None)
    if dc is not None and int(getattr(dc, "dp_size", 1) or 1) > 1:
        raise InputError(f"unweight: FSDP (fsdp_size x dp_replicate_size = {dc.dp_size}) shards parameters for "
                         "training and compressed checkpoints load for inference; give the ranks to tp_size / "
                         "ep_size, or decompress the checkpoint to train")
    if dc is not None and int(getattr(dc, "pp_size", 1) or 1) > 1:
        raise InputError(f"unweight: pipeline parallelism (pp_size = {dc.pp_size}) is not supported for compressed "
                         "checkpoints; give the ranks to tp_size / ep_size, or serve the model with vLLM")


def defer_planes(model: nn.Module, ck: CompressedCheckpoint, folder: str) -> int:
    """Replace the plane buffers of every compressed module by empty non-persistent placeholders
    (loaded later, shard by shard, by load_tp_planes).  Returns how many modules were deferred."""
    owners = {n: m for n, m in compressed_modules(model) if not m.is_tied}
    prefix = getattr(model, "base_model_prefix", "") or ""
    by_module = {}
    for base in ck.encoded:
        for c in prefixed_names(base, prefix):
            mod, _, attr = c.rpartition(".")
            if attr == "weight" and mod in owners:
                by_module[mod] = base
                break
    bases, pats = {}, set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    for name, m in compressed_modules(model):
        if m.is_tied or name not in by_module:
            continue
        for suf in m._suffixes:
            key = "weight" + suf
            m._buffers[key] = torch.empty(0, dtype=m._buffers[key].dtype, device="meta")
            m._non_persistent_buffers_set.add(key)
        base = by_module[name]
        bases[name] = base
        for stored in ck.encoded[base].values():
            pats.add("^" + re.escape(stored) + "$")
        for suf in m._suffixes:
            pats.add("^" + re.escape(f"{name}.weight{suf}") + "$")
    for _, m in compressed_modules(model):
        m._hf_quantized_needs_local_tp = True
    model._keys_to_ignore_on_load_unexpected = pats
    setattr(model, _ATTR, {"folder": folder, "bases": bases})
    return len(bases)


def check_experts(model: nn.Module) -> int:
    """Refuse (InputError, one line) compressed experts that the model's TP plan shards.

    A plan that gives an experts module, its parameters or a module above it a style (Llama
    4's moe_tp_experts / packed_rowwise, expert parallelism's routers) would shard or route
    parameters that are compressed stacks here, and the model would compute with the wrong
    weights.  Experts the plan leaves alone (Qwen3-MoE, Mixtral and DeepSeek-V3's routed
    experts in transformers' own plans) are replicated: every rank loads and checks the whole
    stacks, and computes the layer's full output itself.  Returns how many are replicated."""
    from ...runtime.experts import expert_stacks
    stacks = expert_stacks(model)
    if not stacks:
        return 0
    plan = {k: v for k, v in _resolved_plan(model).items() if v not in (None, "replicate")}
    for full, _, _, _ in stacks:
        mod = full.rpartition(".")[0]  # the experts module
        # the parameter, the module, a module above it, or another tensor of the module
        hit = next((k for k in plan if k in (full, mod) or mod.startswith(k + ".") or k.startswith(mod + ".")), None)
        if hit is not None:
            raise InputError(f"unweight: transformers' tensor-parallel plan gives {hit} the style {plan[hit]!r}, "
                             f"which compressed experts ({full}) cannot follow; serve the model with vLLM, "
                             f"override the plan in DistributedConfig(tp_plan=...), or decompress the checkpoint")
    log.info("unweight: %d compressed experts parameters stay replicated (whole on every rank) under tensor "
             "parallelism: the plan gives them no style", len(stacks))
    return len(stacks)


# ------------------------------------------------------------------------ after loading


def _tp_mesh(model):
    mm = getattr(model, "_mesh_manager", None)
    if mm is None or (getattr(model, "_tp_size", None) or 1) <= 1:
        return None
    return mm.get_mesh("tp")


def _resolved_plan(model) -> dict:
    dc = getattr(model.config, "distributed_config", None)
    if dc is None:
        return {}
    return model._resolve_parallel_plans(dc)[0]


def _style(plan: dict, name: str):
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES
    s = plan.get(name)
    return s, (ALL_PARALLEL_STYLES[s] if s is not None else None)


def _unhook(m: nn.Module):
    """Drop a TP forward wrapper installed on the instance (the class forward runs again)."""
    m.__dict__.pop("forward", None)
    m._is_hooked = False


def _shard_kind(name: str, m: CompressedWeightMixin, style_name, style) -> str:
    """"rows" | "cols" | "full" | "unhook" (replicated, wrapper removed) for one module."""
    from transformers.distributed.tensor_parallel import (ColwiseParallel, EmbeddingParallel, RowwiseParallel,
                                                          TensorParallelLayer)
    if style is None or type(style) is TensorParallelLayer:  # no rule / "replicate"
        return "full"
    if isinstance(m, CompressedEmbedding) and isinstance(style, EmbeddingParallel):
        return "unhook"  # the replicated table gives the reduced/gathered result directly
    if isinstance(m, CompressedLinear) and m.is_tied and isinstance(style, ColwiseParallel) \
            and style.output_layouts == style.input_layouts:  # colwise_gather_output: full logits locally
        return "unhook"
    if isinstance(m, CompressedLinear) and not m.is_tied:
        # The exact classes: a subclass may place blocks otherwise (UnitColwiseParallel gives
        # ranks whole heads, replicated when there are fewer heads than ranks).
        if type(style) is ColwiseParallel:
            return "rows"
        if type(style) is RowwiseParallel:
            return "cols"
        if type(style).__name__ == "MlaKvAProjParallel":
            # MLA's kv_a_proj_with_mqa (DeepSeek-V2/V3, Kimi-K2): a replicated weight whose
            # wrapper only all-reduces the rope part's gradient; its forward is the module's own.
            return "full"
    raise InputError(f"unweight: tensor-parallel style {style_name!r} of {name} ({type(m).__name__}"
                     f"{', tied' if m.is_tied else ''}) is not supported for compressed weights; "
                     f"override it in DistributedConfig(tp_plan=...) or load without tensor parallelism")


def _gather(group, obj):
    out = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def _check_group_crcs(mine: dict, headers: dict, group):
    """Check every sharded tensor's stored crc32 from the TP group's shard records."""
    everyone = _gather(group, mine)
    for base, h in headers.items():
        check_shard_records([d[base] for d in everyone if base in d], h, base)


def held_check(model: nn.Module):
    """The load check of this rank's weights as held (runtime/verify.py HeldCheck, for
    prepare's verify): each tensor-parallel block makes a shard record, which the group
    gathers and checks against the stored crc32s; each whole tensor is checked alone."""
    from ...runtime.verify import HeldCheck
    from . import ep
    held = getattr(model, "_unweight_tp_held", None) or {"shards": {}, "group": None, "locations": {}}
    group = held["group"]
    # Expert parallelism's slices of stacked tensors: checked over the EP group (ep.py).
    ep_shards = ep.shard_entries(model)
    ep_bases = {entry[0] for entry in ep_shards.values()}

    def group_check(records, headers):
        def part(d, mine):
            return {b: v for b, v in d.items() if (b in ep_bases) == mine}
        _check_group_crcs(part(records, False), part(headers, False), group)
        if ep_bases:
            ep.check_group(part(records, True), part(headers, True), ep.ep_group(model))
    return HeldCheck(locations=held["locations"], shards={**held["shards"], **ep_shards}, group_check=group_check)


def _install(m: CompressedWeightMixin, header, planes: dict, device):
    for suf in m._suffixes:
        m._buffers.pop("weight" + suf, None)
        m._non_persistent_buffers_set.discard("weight" + suf)
    m._buffers.pop("weight_lut", None)
    keep = (getattr(m, "in_features", None), getattr(m, "out_features", None))
    m._init_planes(header, planes=planes, device=device)
    if isinstance(m, CompressedLinear):
        m.in_features, m.out_features = keep  # full widths: the TP classes build global shapes from them


def device_of(model) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def load_tp_planes(model: nn.Module, verify: bool = True) -> dict:
    """Fill the deferred compressed modules with this rank's shard (see the module doc).
    Returns {module name: (kind, rows range, cols range)}."""
    info = getattr(model, _ATTR, None)
    if not info:
        return {}
    mesh = _tp_mesh(model)
    if mesh is None and (getattr(model, "_tp_size", None) or 1) > 1:
        # transformers before 5.24 shards through another API (a bare ``_device_mesh``, no mesh
        # manager or resolved plans): read through it, every rank would hold and compute whole
        # tensors under TP forward wrappers, not the tensor-parallel model asked for.
        import transformers
        raise InputError(f"unweight: compressed checkpoints under transformers tensor parallelism need transformers "
                         f">= 5.24 (this is {transformers.__version__}); upgrade it, or load without tensor "
                         f"parallelism")
    plan = _resolved_plan(model) if mesh is not None else {}
    rank, size = (mesh.get_local_rank(), mesh.size()) if mesh is not None else (0, 1)
    group = mesh.get_group() if mesh is not None else None
    modules = dict(model.named_modules())
    device = device_of(model)
    # Every compressed module of the model, tied ones included, gets its kind checked first.
    kinds = {}
    for name, m in compressed_modules(model):
        kinds[name] = _shard_kind(name, m, *_style(plan, name)) if mesh is not None else "full"
    done, mine_crcs, sharded_headers, shards, files = {}, {}, {}, {}, {}
    error = None  # this rank's first block that failed its host decode
    ck = CompressedCheckpoint(info["folder"])
    try:
        for name, base in info["bases"].items():
            m = modules[name]
            h = ck.header(base)
            where = ck.location(base)
            files[f"{name}.weight"] = where
            planes = ck.planes(base)  # memory-mapped: shard_planes reads only the shard's bytes
            kind = kinds[name]
            rows = cols = None
            if kind == "rows":
                rows = sh.tp_shard_range(h.rows, size, rank, what=base, axis="rows")
            elif kind == "cols":
                cols = sh.tp_shard_range(h.cols, size, rank, what=base, axis="cols")
            if rows is None and cols is None:
                hs, ps = h, {k: np.array(v) for k, v in planes.items()}  # own copy of the whole tensor
                if verify:
                    decode_verified(hs, ps, where=where, keep=False)
                else:
                    tc.check_planes(hs, ps, where)
            else:
                # (a block off the segment grid is decoded from the segments that hold it and
                # encoded anew: any equal split serves)
                hs, ps, recoded = sh.block_planes(h, planes, rows=rows, cols=cols, where=where)
                if recoded:
                    log.info("unweight: %s: rank %d's %s", base, rank, sh.recoded_note(h, rows, cols))
                tc.check_planes(hs, ps, where)
                shards[f"{name}.weight"] = (base, rows, cols, h)
                if verify and error is None:
                    try:
                        mine_crcs[base] = decode_record(hs, ps, rows, cols, h.cols, where)[1]
                        sharded_headers[base] = h
                    except (ChecksumError, FormatError) as e:
                        error = e  # raised after the group's gather, which every rank must reach
            del planes
            ck.release_encoded(base)
            _install(m, hs, ps, device)
            done[name] = (kind, rows, cols)
    finally:
        ck.close()
    if verify and mesh is not None:
        try:
            _check_group_crcs(mine_crcs, sharded_headers, group)
        except ChecksumError:
            if error is None:
                raise
    if error is not None:
        raise error
    for name, kind in kinds.items():
        if kind == "unhook":
            _unhook(modules[name])
            log.info("unweight: %s stays replicated (compressed) under tensor parallelism", name)
    model._unweight_tp_layout = {n: {"kind": k, "rows": r, "cols": c} for n, (k, r, c) in done.items()}
    # (for the check of the held blocks after prepare: held_check)
    model._unweight_tp_held = {"shards": shards, "group": group, "locations": files}
    if mesh is not None:
        log.info("unweight: tensor-parallel rank %d/%d loaded %d compressed tensors (%d sharded)", rank, size,
                 len(done), sum(1 for k, _, _ in done.values() if k in ("rows", "cols")))
    return done


def host_check_experts(model: nn.Module) -> int:
    """UNWEIGHT_VERIFY=host under torch.distributed: every compressed expert this rank holds
    whole (each per-expert tensor; a stack no expert-parallel plan cut), decoded on the host
    and checked against its crc32, as the checkpoint-wide pass does without distribution (a
    stack's expert-parallel slice is checked across the group as it is read: ep.py).  Returns
    how many tensors were checked."""
    from ...runtime.experts import expert_stacks
    from ...runtime.verify import piece_key
    sliced = set((getattr(model, "_unweight_ep", None) or {}).get("stacks") or {})
    locations = (getattr(model, "_unweight_plan", {}) or {}).get("locations", {})
    n = 0
    for name, _, _, st in expert_stacks(model):
        if name in sliced:
            continue
        for k, src in enumerate(st.sources):
            for e, p in enumerate(src) if isinstance(src, list) else [(None, src)]:
                key = name if e is None else piece_key(name, k, e)
                decode_verified(p.header, p.host_planes(), where=locations.get(key, key), keep=False)
                n += 1
    return n


def reinstall_styles(model: nn.Module, before: dict):
    """After prepare(): modules it replaced (dense mode) get their TP style installed again."""
    mesh = _tp_mesh(model)
    if mesh is None:
        return
    plan = _resolved_plan(model)
    layout = getattr(model, "_unweight_tp_layout", {})
    for name, m in model.named_modules():
        old = before.get(name)
        if old is None or old is m:
            continue
        style_name, style = _style(plan, name)
        kind = layout.get(name, {}).get("kind")
        if style is None or kind not in ("rows", "cols"):
            continue  # replicated: the plain module computes the full result
        m._hf_quantized_needs_local_tp = True
        style.install_forward(m, mesh)
        m._is_hooked = True


def resolve_mode(mode: str, model: nn.Module) -> str:
    """Mode "auto" under tensor parallelism keeps the shards compressed (the checkpoint's encoding)."""
    if _tp_mesh(model) is None:
        return mode
    owners = [m for _, m in compressed_modules(model) if not m.is_tied]
    return sharded_mode(mode, owners[0].encoding_name) if owners else mode
