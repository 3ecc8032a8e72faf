"""Expert parallelism in transformers for unweight checkpoints (``DistributedConfig(ep_size=N)``).

``torchrun --nproc-per-node N script.py`` with ``AutoModelForCausalLM.from_pretrained(folder,
distributed_config=DistributedConfig(tp_size=N, ep_size=N))`` after ``import unweight``.

transformers' expert-parallel plan (a model's ``base_model_ep_plan``: ``grouped_gemm`` on an
experts module's 3-D parameters, ``ep_dispatch_experts`` on the module) gives EP rank r the
experts [r * E / N, (r + 1) * E / N), whole; its parameter style sets the module's
``num_experts`` to E / N, and an EPImplementation brings the experts their tokens: at inference
on the batch the EP group shares, every rank runs its own experts with the other ranks' routes
masked (local id E / N, weight 0) and an all-reduce sums the outputs; otherwise an all-to-all
carries each routed token to its expert's rank and back.  Either way the experts forward sees
local expert ids only.

Compressed experts take the same layout.  :func:`keep_local_experts` runs before the weights
load, after runtime/convert.py has installed the ExpertStacks (which are not Parameters, so
transformers' style has nothing to shard or count):

* per-expert checkpoint tensors (Qwen3-MoE, Mixtral, DeepSeek-V3 / Kimi-K2, ...): the stack keeps
  this rank's experts; the plane buffers of the others are dropped and their checkpoint keys
  join the keys transformers' loader ignores, so no rank reads or holds another rank's experts;
* a stacked checkpoint tensor (gpt-oss): its plane buffers become placeholders, and after the
  load :func:`load_local_stacks` reads from the memory-mapped file the bytes of this rank's
  matrices alone (codec.tensor_codec.stack_slice: their segments as stored, nothing decoded or
  encoded again).

It sets ``num_experts`` to the local count as transformers' style would, so the routed forward
(runtime/experts.routed_experts_forward) skips the masked routes.  The experts' own mode,
routed decode and fused kernels are unchanged: the stack is simply shorter.

Integrity: each per-expert tensor is whole on the rank that holds it and is checked there
against its own crc32 (the ranks' ranges tile [0, E), so every tensor is checked once).  A
stacked tensor's slice is rows [r * E/N * rows, (r + 1) * E/N * rows) of the stack taken as one
[E * rows, cols] matrix: each rank makes a codec.shard_check record of it and the EP group
combines the records into the stored crc32 (runtime/verify.py, HeldCheck.stack).

transformers warns that the plan's ``grouped_gemm`` rules for the stacks "match nothing ... and
will not be applied" (they name Parameters, and the stacks are not); :func:`quiet_stack_rules`
drops that warning, and only that one, since the layout those rules ask for is applied here.
"""
from __future__ import annotations

import dataclasses
import logging
import re

import numpy as np
import torch
import torch.nn as nn

from ...codec import tensor_codec as tc
from ...codec.shard_check import check_shard_records, decode_record
from ...format.checkpoint import CompressedCheckpoint
from ...format.errors import ChecksumError, FormatError, InputError
from ...runtime.experts import expert_stacks
from ...runtime.verify import piece_key

log = logging.getLogger(__name__)

_ATTR = "_unweight_ep"  # model attribute: see keep_local_experts
_DISPATCH, _PARAM = "ep_dispatch_experts", "grouped_gemm"  # transformers' EP styles this follows


def ep_ranks(model: nn.Module) -> tuple[int, int] | None:
    """(this rank's expert-parallel rank, EP size) under ``DistributedConfig(ep_size > 1)``, else None.

    transformers lays its expert mesh out as (pp, dp_replicate, efsdp, ep), ep innermost, so the
    EP rank is the global rank modulo the EP size; :func:`check_mesh` compares it with the mesh
    once transformers has built it."""
    dc = getattr(getattr(model, "config", None), "distributed_config", None)
    size = int(getattr(dc, "ep_size", 1) or 1)
    if size <= 1 or not torch.distributed.is_initialized():
        return None
    return torch.distributed.get_rank() % size, size


def _ep_plan(model: nn.Module) -> dict:
    return model._resolve_parallel_plans(model.config.distributed_config)[1]


def _style_of(plan: dict, full: str, mod_name: str):
    """The EP styles given to an experts parameter and its module, refused in one line unless
    they are the pair this module follows (or none: the experts stay whole on every rank)."""
    style, pstyle = plan.get(mod_name), plan.get(full)
    hit = next((k for k in plan if mod_name.startswith(k + ".")), None)  # a module above the experts
    if hit is None and style is None and pstyle is None:
        return None
    if hit is not None or style != _DISPATCH or pstyle not in (None, _PARAM):
        where, what = (hit, plan[hit]) if hit is not None else \
            ((mod_name, style) if style != _DISPATCH else (full, pstyle))
        raise InputError(f"unweight: transformers' expert-parallel plan gives {where} the style {what!r}, which "
                         f"compressed experts ({full}) cannot follow (they take {_DISPATCH!r} on the experts module); "
                         "override it in DistributedConfig(ep_plan=...) or decompress the checkpoint")
    return style


def keep_local_experts(model: nn.Module, ck: CompressedCheckpoint, folder: str) -> int:
    """Under expert parallelism, cut every compressed ExpertStack the EP plan distributes down to
    this rank's experts (see the module doc); before the weights load.  Returns how many
    encoded checkpoint tensors this rank no longer holds (per-expert tensors of other ranks)."""
    ranks = ep_ranks(model)
    if ranks is None:
        return 0
    rank, size = ranks
    plan = _ep_plan(model)
    entries = {(e["module"], e["attr"]): e for e in (getattr(model, "_unweight_plan", {}) or {}).get("experts", [])}
    names = {id(m): n for n, m in model.named_modules()}
    pats = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    stacks, dropped, cut = {}, 0, 0

    def ignore(base: str, module_name: str, attr: str, suffixes):
        for stored in ck.encoded[base].values():
            pats.add("^" + re.escape(stored) + "$")
        for suf in suffixes:
            pats.add("^" + re.escape(f"{module_name}.{attr}{suf}".lstrip(".")) + "$")

    for full, mod, attr, st in expert_stacks(model):
        mod_name = full.rpartition(".")[0]
        if _style_of(plan, full, mod_name) is None:
            continue
        E = st.num_experts
        if E % size:
            raise InputError(f"unweight: {full} holds {E} experts, which {size} expert-parallel ranks cannot share "
                             "evenly")
        n = E // size
        lo, hi = rank * n, (rank + 1) * n
        entry = entries[(mod_name, attr)]
        if "bases" in entry:  # per-expert tensors: drop the other ranks' planes before the load
            for i, src in enumerate(st.sources):
                for e, p in enumerate(src):
                    if lo <= e < hi:
                        continue
                    for suf in p.suffixes:
                        del p.module._buffers[p.attr + suf]
                    ignore(entry["bases"][(i, e)], names[id(p.module)], p.attr, p.suffixes)
                    dropped += 1
            st.sources = [src[lo:hi] for src in st.sources]
            # The load check names a piece by its index in the stack: local now, so renumbered.
            locs = (getattr(model, "_unweight_plan", {}) or {}).get("locations", {})
            old = {(i, e): locs.get(piece_key(full, i, e)) for i in range(len(st.sources)) for e in range(E)}
            for (i, e), where in old.items():
                locs.pop(piece_key(full, i, e), None)
            for (i, e), where in old.items():
                if lo <= e < hi and where is not None:
                    locs[piece_key(full, i, e - lo)] = where
        else:  # one stacked tensor: its planes come after the load, this rank's matrices only
            p = st.sources[0]
            for suf in p.suffixes:
                key = p.attr + suf
                mod._buffers[key] = torch.empty(0, dtype=mod._buffers[key].dtype, device="meta")
                mod._non_persistent_buffers_set.add(key)
            ignore(entry["base"], mod_name, attr, p.suffixes)
            stacks[full] = {"module": mod_name, "attr": attr, "base": entry["base"], "experts": (lo, hi)}
        st.shape = torch.Size((n, st.rows, st.cols))
        # what transformers' grouped_gemm style sets on the module it shards
        mod.num_experts = n
        mod._is_expert_parallel = True
        cut += 1
    model._keys_to_ignore_on_load_unexpected = pats
    setattr(model, _ATTR, {"rank": rank, "size": size, "folder": folder, "stacks": stacks})
    if cut:
        log.info("unweight: expert-parallel rank %d/%d keeps its 1/%d of the experts of %d compressed experts "
                 "parameters (%d per-expert checkpoint tensors of other ranks left unread)", rank, size, size, cut,
                 dropped)
    return dropped


class _CompressedStackRules(logging.Filter):
    """Drops transformers' warning that plan rules "match nothing" when every rule it names is
    the parameter rule of a compressed experts stack.  Those rules name ExpertStacks, which are
    not Parameters; the expert parallelism they stand for is applied (keep_local_experts), so
    the warning's "will not be applied" would mislead.  A warning naming any other rule passes."""

    _RULES = re.compile(r"`\w+` rules \[(.*)\] match nothing")

    def __init__(self):
        super().__init__()
        self.names: set = set()

    def filter(self, record: logging.LogRecord) -> bool:
        m = self._RULES.search(record.getMessage())
        if m is None:
            return True
        named = set(re.findall(r"'([^']*)'", m.group(1)))
        return not named or not named <= self.names


_QUIET = _CompressedStackRules()


def quiet_stack_rules(model: nn.Module) -> None:
    """Install the filter above on transformers' plan logger for this model's compressed experts
    stacks (their names with layer numbers as ``*``, as the plans write them); before any plan is
    resolved."""
    try:
        from transformers.distributed.parallel_utils import replace_layer_number_by_wildcard
    except ImportError:  # another transformers layout: its warnings pass unchanged
        return
    _QUIET.names |= {replace_layer_number_by_wildcard(full) for full, _, _, _ in expert_stacks(model)}
    plan_log = logging.getLogger("transformers.distributed.mixin")
    if _QUIET not in plan_log.filters:
        plan_log.addFilter(_QUIET)


def check_mesh(model: nn.Module) -> None:
    """The EP rank keep_local_experts assumed is the one transformers' mesh gives this process
    (InputError otherwise: the rank would hold another rank's experts)."""
    info = getattr(model, _ATTR, None)
    mm = getattr(model, "_mesh_manager", None)
    if not info or mm is None:
        return
    mesh = mm.get_mesh("ep")
    if (mesh.get_local_rank(), mesh.size()) != (info["rank"], info["size"]):
        raise InputError(f"unweight: transformers placed this process at expert-parallel rank "
                         f"{mesh.get_local_rank()}/{mesh.size()}, not {info['rank']}/{info['size']} as its experts "
                         f"were chosen; this mesh layout is not supported for compressed experts")


def ep_group(model: nn.Module):
    return model._mesh_manager.get_mesh("ep").get_group()


def load_local_stacks(model: nn.Module, device: torch.device, verify: bool = False) -> dict:
    """After the weights loaded: fill each deferred stacked tensor with this rank's matrices
    from the memory-mapped checkpoint (their bytes only).  verify: decode them on the host and
    check the stack's crc32 across the EP group now (UNWEIGHT_VERIFY=host); otherwise the
    check after prepare makes the records (shard_entries).  Returns {stack name: (lo, hi)}."""
    info = getattr(model, _ATTR, None)
    if not info:
        return {}
    check_mesh(model)
    if not info["stacks"]:
        return {}
    mine, headers, done = {}, {}, {}
    error = None  # this rank's first slice that failed its host decode
    ck = CompressedCheckpoint(info["folder"])
    try:
        for full, s in info["stacks"].items():
            mod = model.get_submodule(s["module"]) if s["module"] else model
            st, attr, base = vars(mod)[s["attr"]], s["attr"], s["base"]
            lo, hi = s["experts"]
            h, where = ck.header(base), ck.location(base)
            if (h.stack, h.rows, h.cols) != (st.num_experts * info["size"], st.rows, st.cols):
                raise InputError(f"unweight: checkpoint tensor {where} is {list(h.shape)}, the model's {full} holds "
                                 f"{st.num_experts * info['size']} experts of [{st.rows}, {st.cols}]")
            hs, ps = tc.stack_slice(h, ck.planes(base), lo, hi)  # views of the mapped file
            ps = {suf: np.array(a) for suf, a in ps.items()}  # this rank's bytes, read once
            tc.check_planes(hs, ps, where)
            if verify and error is None:
                try:
                    mine[base] = decode_record(hs, ps, (lo * h.rows, hi * h.rows), None, h.cols, where)[1]
                    headers[base] = _matrix_view(h)
                except (ChecksumError, FormatError) as e:
                    error = e  # raised after the group's gather, which every rank must reach
            p = st.sources[0]
            for suf in p.suffixes:
                mod._buffers.pop(attr + suf, None)
                mod._non_persistent_buffers_set.discard(attr + suf)
            # (non-persistent: a state dict would otherwise hold this slice under the stack's name)
            for suf in tc.planes_for(hs):
                mod.register_buffer(attr + suf, torch.from_numpy(ps[suf]).to(device), persistent=False)
            p.set_header(hs)
            ck.release_encoded(base)
            s["header"] = h  # (the whole stack's: its crc32 is what the group's records check)
            done[full] = (lo, hi)
    finally:
        ck.close()
    if verify:
        try:
            check_group(mine, headers, ep_group(model))
        except ChecksumError:
            if error is None:
                raise
    if error is not None:
        raise error
    log.info("unweight: expert-parallel rank %d/%d read experts %s of %d stacked tensor(s) from the checkpoint",
             info["rank"], info["size"], sorted(set(done.values())), len(done))
    return done


def _matrix_view(h):
    """A stack's header taken as one [E * rows, cols] matrix (the records' coordinates)."""
    return dataclasses.replace(h, rows=h.stack * h.rows, stack=0)


def shard_entries(model: nn.Module) -> dict:
    """{stack name: (checkpoint name, rows, None, whole header)} of the stacked tensors this rank
    holds a slice of (after load_local_stacks): runtime/verify.HeldCheck's shard entries, rows
    of the stack taken as one [E * rows, cols] matrix."""
    out = {}
    for full, s in ((getattr(model, _ATTR, None) or {}).get("stacks") or {}).items():
        h, (lo, hi) = s["header"], s["experts"]
        out[full] = (s["base"], (lo * h.rows, hi * h.rows), None, _matrix_view(h))
    return out


def check_group(mine: dict, headers: dict, group) -> None:
    """Gather the EP group's records of the stacked tensors and check each stored crc32; every
    rank calls it (an empty dict too).  ChecksumError when a crc32 differs or the slices do not
    cover a stack."""
    everyone = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(everyone, mine, group=group)
    for base, h in headers.items():
        if not check_shard_records([d[base] for d in everyone if base in d], h, base, "expert-parallel slices"):
            raise ChecksumError(f"{base}: the expert-parallel ranks' slices do not cover the stack, so its crc32 "
                                "could not be checked")
