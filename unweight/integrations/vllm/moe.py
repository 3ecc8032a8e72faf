"""vLLM fused-MoE experts kept compressed: the "unweight" method of a RoutedExperts layer.

Imported by unweight.integrations.vllm.quant (it imports vLLM's fused-MoE package).

Checkpoints hold per-expert 2-D matrices (``...experts.<e>.gate_proj.weight`` as transformers
saves them; ``w1``/``w3``/``w2`` for Mixtral), each encoded on its own.  vLLM's expert mapping
routes every plane of expert e's gate / up / down projection to the layer parameters
``w13_weight<suffix>`` / ``w2_weight<suffix>`` with shard id w1 / w3 / w2, so the method
registers one placeholder per plane suffix and collects the planes there.

Loading, per rank: as soon as an expert's projection has all its planes, only this rank's
segments are copied out with unweight.codec.shard.shard_planes (gate and up: the rank's block
of intermediate rows; down: its block of intermediate columns, as vLLM's unquantized loader
narrows them) and the mapped planes are dropped.  After loading, each piece is decoded once
and the TP group checks every expert tensor's stored crc32 from the ranks' shard crcs (one
all-gather per layer, codec/shard_check.py).

Palette mode holds each projection's experts as one palette stack instead
(runtime/expert_slots.py), built at load from the rank's decoded pieces: its experts decode by
ids that stay on the device.  Mode "auto" on CUDA serves Huffman-stored experts that way too
(other layers keep the stored encoding).

Forward: the pieces of the experts the batch routes to are decoded into the device's scratch
as [E', 2I/tp, H] and [E', H, I/tp] bf16 stacks, handed to the same kernel vLLM's unquantized
method builds for this platform (its weight conversion, e.g. the CPU kernels' prepacking,
runs on the decoded stacks), and the routed ids are renumbered onto the stack in increasing
order.  What vLLM's op allows: its experts kernels take any number of experts and ids below
global_num_experts, so only the routed experts are decoded.  On the CPU, and on CUDA for a
Huffman layer, finding them reads the ids on the host; while a CUDA graph is being captured,
where that read would synchronise the stream and break the capture, a Huffman layer decodes
every local expert, and the graph's replays do the same.  A palette layer on CUDA never reads
them: slot s of its decoded stack is the expert of routing choice s (T * k slots, or every
local expert when there are fewer), and the routing is renumbered onto the slots (GPU
behaviour is unmeasured).  Where the dispatch table timed the tensor-core GEMV faster than
decode + cuBLAS at batch 1 for both of the layer's expert shapes, a SwiGLU layer with fewer
routing choices than local experts (a decode step) and no shared experts skips the decode:
its routed experts run on the compressed stacks (runtime/expert_slots.py routed_forward, two
slot GEMV launches, still with no host sync), within bf16 rounding of vLLM's kernel on the
decoded weights.  The scratch then holds
the BF16 weights of one layer's routed experts; layers run one at a time, so it is one
layer's worth, never the model's.

Expert parallelism (--enable-expert-parallel over the TP ranks): vLLM gives each rank whole
experts (tp 0 of 1); the loader keeps only this rank's, each checked whole against its crc32,
and the forward turns the routing's global ids into this rank's local ids on the device
(local_routing), other ranks' choices adding nothing, as vLLM's kernels do with its expert
map; vLLM's layer sums the ranks' outputs.

Data parallelism (--data-parallel-size > 1): the experts are split over the TP x DP ranks of
vLLM's expert group (by expert with --enable-expert-parallel, else by intermediate range),
and the load check gathers the ranks' records over that group.  The method reports no
internal modular kernel under DP (supports_internal_mk), so vLLM's MoE runner gathers every
DP rank's tokens and router logits before apply and reduce-scatters the output after; the
routed decode then sees every token this rank's experts serve, and the experts kernel is
built without vLLM's dispatch step (_init_moe_kernel).  The runner's gather goes through the
all-to-all backend's manager, which only the all-gather backend (vLLM's default) serves;
DeepEP and the other all-to-all kernels dispatch inside the kernel, after the decode would
have chosen, and are refused.

Not covered (one-line error at model construction, use --load-format unweight): context- or
sequence-parallel MoE ranks, data parallelism through other all-to-all backends, expert
biases, a layer whose experts are partly raw and partly compressed, and 3-D expert stacks
other than Llama 4's gate_up_proj / down_proj.
"""
from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import torch
from torch import nn

from vllm.model_executor.layers.fused_moe.oracle.unquantized import convert_to_unquantized_kernel_format
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from ...codec import shard as sh
from ...codec import tensor_codec as tc
from ...codec.shard_check import check_shard_records, shard_record
from ...format import constants as C
from ...format.errors import ChecksumError, FormatError, InputError
from ...format.header import TensorHeader
from ...runtime import dispatch, scratch, selftest
from ...runtime import kernel_plan as kp
from ...runtime.expert_slots import ExpertSlots, routed_forward
from ...runtime.tuning_table import PALETTE_GEMV_MMA
from ...runtime.verify import HeldCheck, block_fault, shard_record_of, verify_setting
from ...runtime.modes import sharded_mode
from .ops import check_kernels, current_policy
from .common import (PLANE_DTYPES, device_piece, gather, log, missing_plane, moe_ranks, piece_record, report_layer,
                     take_shard)


SHARD_IDS = ("w1", "w3", "w2")  # vLLM's names: gate, up (stacked into w13), down
# The most the padded verbatim lists of a layer's expert stacks (runtime/expert_slots.py) may
# add, as a fraction of the bytes the stacks hold; past it the layer keeps per-expert pieces.
SLOT_PADDING_MAX = 0.05


def expert_names(layer, prefix: str) -> dict:
    """{(expert, shard id): checkpoint name} of a RoutedExperts layer's per-expert weights."""
    ckpt = {"w1": layer.ckpt_gate_proj_name, "w3": layer.ckpt_up_proj_name, "w2": layer.ckpt_down_proj_name}
    return {(e, sid): f"{prefix}.{e}.{ckpt[sid]}.weight" for e in range(layer.global_num_experts)
            for sid in SHARD_IDS if ckpt[sid] is not None}


def experts_compressed(config, layer, prefix: str) -> bool:
    """Whether the checkpoint holds any weight of the RoutedExperts layer `prefix` compressed:
    per expert (``{prefix}.7.down_proj.weight``), or as 3-D stacks (Llama 4's gate_up_proj).
    (Not the other bf16 tensors of a quantized model's experts, its int4 weights' group
    scales ``{prefix}.7.down_proj.weight_scale``: they reach that method decoded.)"""
    if any(n in config.encoded for n in expert_names(layer, prefix).values()):
        return True
    return any(n.startswith(prefix + ".") and meta[5] for n, meta in config.encoded.items())


def moe_quant_method(config, layer, prefix: str):
    """The method for a RoutedExperts layer some of whose weights are stored encoded
    (experts_compressed): compressed when every expert weight is, or both of Llama 4's stacks;
    InputError otherwise."""
    names = expert_names(layer, prefix)
    enc = [n in config.encoded for n in names.values()]
    if not any(enc):
        stacked = [n for n in config.encoded if n.startswith(prefix + ".")]
        stacks = {"w13": f"{prefix}.gate_up_proj", "w2": f"{prefix}.down_proj"}
        if not all(config.encoded.get(n, [0] * 6)[5] for n in stacks.values()):
            raise InputError(f"{prefix}: experts stored as {stacked[0]} are not served compressed (Llama 4's "
                             f"gate_up_proj and down_proj stacks are); use --load-format unweight")
        _refuse_unserved(layer, prefix)
        return UnweightStackedMoEMethod(config, layer.moe_config, prefix, stacks)
    if not all(enc):
        raw = next(n for n, e in zip(names.values(), enc) if not e)
        raise InputError(f"{prefix}: experts mix compressed and raw weights ({raw} raw); serve them with "
                         f"--load-format unweight (decodes to bf16 at load)")
    _refuse_unserved(layer, prefix)
    return UnweightFusedMoEMethod(config, layer.moe_config, prefix, names)


def _refuse_unserved(layer, prefix: str) -> None:
    """One-line errors for what the compressed methods do not serve: context- or
    sequence-parallel MoE ranks (untested: their tokens move between ranks by other paths
    of vLLM's runner), data parallelism through an all-to-all backend other than the
    all-gather one, and expert biases."""
    pc = layer.moe_config.moe_parallel_config
    if getattr(pc, "pcp_size", 1) > 1 or getattr(pc, "is_sequence_parallel", False):
        raise InputError(f"{prefix}: compressed experts are served with tensor, expert and data parallelism, not "
                         f"with context-parallel or sequence-parallel ranks; use --load-format unweight")
    if pc.dp_size > 1 and pc.all2all_backend != "allgather_reducescatter":
        # (vLLM's runner gathers the DP ranks' tokens through the backend's manager, and only
        # the all-gather one has that call; DeepEP's and the others' dispatch inside a kernel)
        raise InputError(f"{prefix}: compressed experts under data parallelism take vLLM's all-gather dispatch "
                         f"(--all2all-backend allgather_reducescatter, the default), not {pc.all2all_backend}; "
                         f"use --load-format unweight")
    if layer.moe_config.has_bias:
        raise InputError(f"{prefix}: compressed experts with biases are not supported; use --load-format unweight")


def _local_experts(layer) -> list:
    """The global ids of this rank's experts in the order of their local ids (all of them
    without expert parallelism)."""
    ids = {e: layer._map_global_expert_id_to_local_expert_id(e) for e in range(layer.global_num_experts)}
    local = sorted((e for e, i in ids.items() if i >= 0), key=ids.get)
    if [ids[e] for e in local] != list(range(len(local))):
        raise InputError(f"unweight: vLLM's expert map of this rank is not numbered 0..{len(local) - 1}")
    return local


def _held_record(w, pc: dict) -> tuple:
    """A piece's shard record from its held form decoded on the device (a transient bf16 block)."""
    out = dispatch.decode_new([w], w.rows, w.cols, current_policy())
    return shard_record_of(out, pc["rows"], pc["cols"], pc["full_header"].cols)


def _per_shard(pieces: list) -> list:
    """The layer report's pieces, one per shard id (w1, w3, w2) over the rank's experts.  A
    piece per expert would make the report line of a 128-expert layer ~100 KB, and the start
    log of a Qwen3-235B-sized model at TP=8 tens of MB.  The loader gives every expert of a
    layer the same shapes and rank block; the entry keeps those of the first expert ("name"),
    "experts" counts them and "expert_range" gives the first and last id, the byte counts are
    sums, "encoding" joins the encodings seen and "recoded" counts the pieces decoded and
    encoded anew at load (blocks off the segment grid; every block of a 3-D stack).  Experts
    that differ in shape (none should) keep one piece each.  The per-expert list goes to the
    DEBUG log."""
    same = ("full_shape", "rows", "cols", "held_shape")
    out = []
    for sid in SHARD_IDS:
        mine = [p for p in pieces if p["shard_id"] == sid]
        if not mine:
            continue
        first = mine[0]
        if any(p[k] != first[k] for p in mine for k in same):
            out += mine
            continue
        out.append({"shard_id": sid, "name": first["name"], "experts": len(mine),
                    "expert_range": [first["expert"], mine[-1]["expert"]],
                    "encoding": ",".join(sorted({p["encoding"] for p in mine})),
                    "recoded": sum(p["recoded"] for p in mine),
                    **{k: first[k] for k in same},
                    **{k: sum(p[k] for p in mine) for k in ("held_bytes", "full_planes_bytes", "bf16_shard_bytes")}})
    return out


class UnweightFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Experts kept as per-expert compressed pieces (this rank's rows / columns only)."""

    def __init__(self, config, moe, prefix: str, names: dict):
        super().__init__(moe)
        self.config = config
        self.prefix = prefix
        self.names = names  # {(expert, shard id): checkpoint name}
        self.supports_pre_processed_weights = False

    @property
    def supports_eplb(self) -> bool:
        return False

    @property
    def supports_internal_mk(self) -> bool:
        """False under data parallelism, so vLLM's MoE runner gathers every DP rank's tokens and
        router logits before apply and reduce-scatters its output after (its naive dispatch):
        the routed decode then sees the routing of every token this rank's experts serve.
        vLLM's own kernel would gather inside its prepare step, after the decode has chosen."""
        return self.moe.moe_parallel_config.dp_size == 1 and super().supports_internal_mk

    def _init_moe_kernel(self, layer) -> None:
        """vLLM's unquantized kernel for this platform; under data parallelism with its
        dispatch and combine left out (vLLM's runner does them around apply, see
        supports_internal_mk)."""
        super()._init_moe_kernel(layer)
        if self.moe.moe_parallel_config.dp_size > 1:
            from vllm.model_executor.layers.fused_moe import modular_kernel as mk
            from vllm.model_executor.layers.fused_moe.prepare_finalize.no_dp_ep import (
                make_moe_prepare_and_finalize_no_dp_ep)
            experts = self.moe_kernel.fused_experts
            self.moe_kernel = mk.FusedMoEKernel(make_moe_prepare_and_finalize_no_dp_ep(
                issubclass(type(experts), mk.FusedMoEExpertsMonolithic)), experts)

    # ------------------------------------------------------------------ create / load

    @staticmethod
    def _placeholders(layer, loader) -> None:
        """Empty parameters named like the planes (w13_weight__sm, ...), loader(stem, suffix)
        their weight loaders; they hold nothing and give the layer its device."""
        layer._uw_pending = {}
        layer._uw_pieces = {}
        layer._uw_other_ranks_planes = 0  # planes of other ranks' experts read from the files and dropped
        for stem in ("w13", "w2"):
            for suf in C.ALL_SUFFIXES:
                p = nn.Parameter(torch.empty(0, dtype=PLANE_DTYPES[suf]), requires_grad=False)
                p.weight_loader = loader(stem, suf)
                layer.register_parameter(f"{stem}_weight{suf}", p)

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        self._placeholders(layer, lambda stem, suf: self._make_loader(layer, suf))
        for (_, sid), name in self.names.items():  # a grid TP cannot split fails here, before any read
            m = self.config.encoded[name]
            self._shard_range(layer, TensorHeader(encoding=m[2], rows=m[0], cols=m[1], rows_per_group=m[3],
                                                  cols_per_chunk=m[4], crc32=0), sid, name)

    def _make_loader(self, layer, suffix):
        def load(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None, return_success=False):
            local = layer._map_global_expert_id_to_local_expert_id(int(expert_id))
            if local < 0:
                layer._uw_other_ranks_planes += 1
                return False if return_success else None
            key = (int(expert_id), shard_id)
            layer._uw_pending.setdefault(key, {})[suffix] = loaded_weight
            self._maybe_finish_piece(layer, key)
            return True if return_success else None
        load.supports_moe_loading = True
        return load

    def _shard_range(self, layer, h: TensorHeader, sid: str, name: str):
        """(rows, cols) of this rank's block of one expert matrix (the whole matrix under expert
        parallelism); any equal split (take_shard recodes a block off the segment grid)."""
        rank, size, _, _ = moe_ranks(layer)
        moe = layer.moe_config
        inter, hidden = moe.intermediate_size_per_partition_unpadded * size, moe.hidden_dim_unpadded
        what = f"{name} [{h.rows}x{h.cols}, {h.encoding_name} grid {h.rows_per_group}x{h.cols_per_chunk}]"
        want = (inter, hidden) if sid in ("w1", "w3") else (hidden, inter)
        if (h.rows, h.cols) != want:
            raise InputError(f"{what}: model expects [{want[0]}x{want[1]}]")
        if sid == "w2":
            return None, sh.tp_shard_range(h.cols, size, rank, what=what, axis="cols")
        return sh.tp_shard_range(h.rows, size, rank, what=what, axis="rows"), None

    def _maybe_finish_piece(self, layer, key):
        name = self.names[key]
        piece = take_shard(layer._uw_pending[key], name, lambda h: self._shard_range(layer, h, key[1], name))
        if piece is not None:
            layer._uw_pieces[key] = piece
            del layer._uw_pending[key]  # drop the references to the full (mapped) planes

    # ------------------------------------------------------------------ after load

    def process_weights_after_loading(self, layer) -> None:
        rank, size, ep_rank, ep_size = moe_ranks(layer)
        for key, pend in layer._uw_pending.items():
            raise missing_plane(pend, self.names[key])
        local = _local_experts(layer)
        missing = [self.names[(e, sid)] for e in local for sid in SHARD_IDS
                   if (e, sid) in self.names and (e, sid) not in layer._uw_pieces]
        if missing:
            raise FormatError(f"{self.prefix}: no planes of {missing[0]} were found in the checkpoint "
                              "(a missing safetensors shard, or a --load-format that does not read the "
                              "checkpoint, e.g. dummy)")
        dev = next((p.device for p in layer.parameters(recurse=False)), torch.device("cpu"))
        where = verify_setting()
        verify = where is not None
        first = layer._uw_pieces[(local[0], "w1")]["header"]
        mode = sharded_mode(self.config.mode, first.encoding_name)
        if self.config.mode == "auto" and mode == "huffman" and dev.type == "cuda":
            # A Huffman layer finds its routed experts on the host, so inside a captured CUDA graph
            # it would decode every local expert at every step; palette stacks decode the routed
            # ones from the device ids (about 0.09 more of BF16's bytes for the experts).
            mode = "palette"
            log.info("unweight: %s -> palette experts on CUDA (mode auto: the routed decode runs inside CUDA "
                     "graphs)", self.prefix)
        # On a GPU the pieces are checked as held, decoded and hashed there (runtime/verify.py);
        # palette stacks are then built from the experts decoded there, unless they would take
        # more than a quarter of the free device memory at once.
        gpu = where != "host" and HeldCheck.on_device(dev)
        check_kernels(dev)  # before the slots are built and a forward picks the routed experts' GEMV
        stacks = self._device_stacks(layer, local, dev, verify) if gpu and mode == "palette" else None
        host_check = verify and (not gpu or (mode == "palette" and stacks is None))
        decoded = self._verify(layer, keep=mode == "palette") if host_check else {}
        w13, w2, report, mine = [], [], [], {}
        # Palette mode: the layer's experts held as one palette stack per projection
        # (runtime/expert_slots.py), so that the experts a batch routes to decode from the device
        # ids (a CUDA graph cannot read the routing on the host), built from the weights decoded
        # on the device, or on the host.
        host = {"w13": [], "w2": []} if mode == "palette" else None
        for e in local:
            ws = {}
            for sid in SHARD_IDS:
                pc = layer._uw_pieces[(e, sid)]
                hs = pc["header"]
                if host is not None:
                    ws[sid] = None if stacks is not None else decoded.pop(pc["name"], None)
                    if ws[sid] is None and stacks is None:
                        ws[sid] = tc.decode(hs, pc["planes"], verify=False, where=pc["name"])
                    held, enc = 0, "palette"  # filled in from the stacks below
                else:
                    ws[sid] = device_piece(hs, pc["planes"], dev, "auto" if mode == "dense" else mode, pc["name"])
                    held = sum(int(t.numel() * t.element_size()) for t in _piece_tensors(ws[sid]))
                    enc = ws[sid].encoding_name
                    if gpu and verify:
                        mine[pc["name"]] = _held_record(ws[sid], pc)
                report.append({"name": pc["name"], "expert": e, "shard_id": sid, "encoding": enc,
                               "full_shape": [pc["full_header"].rows, pc["full_header"].cols],
                               "rows": list(pc["rows"]), "cols": list(pc["cols"]), "held_shape": [hs.rows, hs.cols],
                               "held_bytes": held, "full_planes_bytes": pc["full_bytes"],
                               "bf16_shard_bytes": hs.rows * hs.cols * 2, "recoded": pc["recoded"]})
            if host is not None and stacks is None:
                host["w13"].append(np.concatenate([ws["w1"], ws["w3"]]))
                host["w2"].append(ws["w2"])
            elif host is None:
                w13.append([ws["w1"], ws["w3"]])
                w2.append([ws["w2"]])
        if mine:
            self._check_group(layer, mine, dev)
        if stacks is not None:
            host = stacks  # ({"w13": bf16 [E, 2I, H], "w2": bf16 [E, H, I]} on the device)
        for stem in ("w13_weight", "w2_weight"):
            for suf in C.ALL_SUFFIXES:
                delattr(layer, stem + suf)
        del layer._uw_pieces, layer._uw_pending
        layer._uw_experts = local
        layer._uw_slots = None
        if host is not None:
            slots = (tuple(ExpertSlots.from_weights(host[k] if stacks is not None else np.stack(host[k]), dev)
                           for k in ("w13", "w2")) if selftest.slots_ok(dev, "decode") else None)
            if slots is not None and (sum(st.padding_bytes for st in slots)
                                      <= SLOT_PADDING_MAX * sum(st.held_bytes() for st in slots)):
                layer._uw_slots = slots
                _share_stack_bytes(report, slots)
            else:  # per-expert pieces, routed on the host
                if slots is None:
                    log.info("unweight: %s keeps per-expert palette pieces (the slot decode failed its self-test "
                             "on %s)", self.prefix, dev)
                else:  # an expert with many verbatim blocks
                    log.info("unweight: %s keeps per-expert palette pieces (padding its experts' verbatim lists to "
                             "one length would add %d bytes)", self.prefix, sum(st.padding_bytes for st in slots))
                self._palette_pieces(local, host, w13, w2, report, dev)
            del host, slots
        if w2:
            inter, hidden = w2[0][0].cols, w2[0][0].rows
        else:
            inter, hidden = layer._uw_slots[1].cols, layer._uw_slots[1].rows
        layer._uw_shape = (inter, hidden)
        record = {"tp_rank": rank, "tp_size": size, "verified": verify, "mode": mode, "experts": len(local),
                  **getattr(layer, "_uw_record_extra", {})}
        if ep_size > 1:
            record.update(ep_rank=ep_rank, ep_size=ep_size)
            if "stacked" not in record:  # (a stack is one tensor: read whole, its slice kept)
                record["other_ranks_planes"] = layer._uw_other_ranks_planes
        if mode == "dense":
            # decoded once here (by the decoder the tuning table chose per shape; every variant
            # writes the same bits); the unquantized method's own weight conversion then applies
            policy = current_policy()
            w13_t = torch.stack([dispatch.decode_new(p, 2 * inter, hidden, policy) for p in w13])
            w2_t = torch.stack([dispatch.decode_new(p, hidden, inter, policy) for p in w2])
            layer.register_parameter("w13_weight", nn.Parameter(w13_t, requires_grad=False))
            layer.register_parameter("w2_weight", nn.Parameter(w2_t, requires_grad=False))
            super().process_weights_after_loading(layer)
            layer._uw_w13 = layer._uw_w2 = None
            for r in report:
                r["held_bytes"] = r["bf16_shard_bytes"]
            record["path"] = "decoded-to-bf16-at-load"
        else:
            # keep the planes reachable as module buffers (device moves, memory accounting)
            if layer._uw_slots is not None:
                for i, st in enumerate(layer._uw_slots):
                    for k, t in enumerate(st.tensors()):
                        layer.register_buffer(f"uw_slots_{i}_{k}", t, persistent=False)
            for i, pieces in enumerate(w13 + w2):
                for j, p in enumerate(pieces):
                    for k, t in enumerate(_piece_tensors(p)):
                        layer.register_buffer(f"uw_{i}_{j}_{k}", t, persistent=False)
            layer._uw_w13, layer._uw_w2 = w13, w2
            _ROUTED[self.prefix] = (self, layer)
            scratch.reserve(dev, len(local) * 3 * inter * hidden)
            self._init_moe_kernel(layer)
            record["path"] = "compressed"
        held = sum(r["held_bytes"] for r in report)
        bf16 = sum(r["bf16_shard_bytes"] for r in report)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("unweight: %s expert pieces %s", self.prefix, json.dumps(report))
        report_layer(self.prefix, {**record, "pieces": _per_shard(report), "held_bytes": held, "bf16_bytes": bf16})
        where = (f"{len(local)} experts of {layer.global_num_experts} on expert-parallel rank {ep_rank}/{ep_size}, "
                 f"whole" if ep_size > 1 else
                 f"{len(local)} experts, rank {rank}/{size} holds intermediate {report[0]['rows']} of each")
        log.info("unweight: %s -> %s (%s, %.3fx of its bf16 shard)", self.prefix,
                 "compressed in memory" if mode != "dense" else "decoded to bf16 at load", where, held / max(1, bf16))

    def _palette_pieces(self, local, host, w13, w2, report, dev) -> None:
        """Palette pieces per expert from the weights host["w13"][i] ([2I, H], gate over up) and
        host["w2"][i] of local expert i (uint16 host arrays, or bf16 stacks on the device),
        what palette mode holds when the layer's experts do not make one stack, appended to
        w13 / w2, with the report's held bytes."""
        held = {}

        def bits(a):  # uint16 [rows, cols] on the host (the stacks decoded on the device: a copy back)
            return a if isinstance(a, np.ndarray) else a.view(torch.int16).cpu().numpy().view(np.uint16)

        for i, e in enumerate(local):
            up, down = bits(host["w13"][i]), bits(host["w2"][i])
            half = up.shape[0] // 2
            ps = {sid: device_piece(enc.header, enc.planes, dev, "palette", f"{self.prefix}.{e}.{sid}")
                  for sid, enc in (("w1", tc.encode(up[:half], "palette")), ("w3", tc.encode(up[half:], "palette")),
                                   ("w2", tc.encode(down, "palette")))}
            for sid, p in ps.items():
                held[(e, sid)] = sum(int(t.numel() * t.element_size()) for t in _piece_tensors(p))
            w13.append([ps["w1"], ps["w3"]])
            w2.append([ps["w2"]])
        for r in report:
            r["held_bytes"] = held[(r["expert"], r["shard_id"])]

    def _device_stacks(self, layer, local: list, dev, verify: bool) -> dict | None:
        """The local experts decoded on the device from their pieces moved there as stored:
        {"w13": bf16 [E, 2I, H] (gate over up), "w2": bf16 [E, H, I]}, each piece checked from
        its rows there (verify: one gather for the layer); None when the two stacks would take
        more than a quarter of the device's free memory (the caller decodes on the host)."""
        h1, h2 = layer._uw_pieces[(local[0], "w1")]["header"], layer._uw_pieces[(local[0], "w2")]["header"]
        inter, hidden = h1.rows, h1.cols
        need = len(local) * 3 * inter * hidden * 2
        if dev.type == "cuda" and need > torch.cuda.mem_get_info(dev)[0] // 4:
            log.info("unweight: %s decodes its experts on the host (%d bytes of BF16 experts would not fit a quarter "
                     "of the free memory of %s)", self.prefix, need, dev)
            return None
        out = {"w13": torch.empty((len(local), 2 * inter, hidden), dtype=torch.bfloat16, device=dev),
               "w2": torch.empty((len(local), h2.rows, h2.cols), dtype=torch.bfloat16, device=dev)}
        mine = {}
        for i, e in enumerate(local):
            for sid in SHARD_IDS:
                pc = layer._uw_pieces[(e, sid)]
                rows = out["w2"][i] if sid == "w2" else out["w13"][i, :inter] if sid == "w1" else out["w13"][i, inter:]
                piece = device_piece(pc["header"], pc["planes"], dev, "auto", pc["name"])
                dispatch.decode_into([piece], rows.view(-1), rows.size(0), rows.size(1), current_policy())
                if verify:
                    h = pc["full_header"]
                    mine[pc["name"]] = shard_record_of(rows, pc["rows"], pc["cols"], h.cols)
        if mine:
            self._check_group(layer, mine, dev)
        return out

    def _check_group(self, layer, mine: dict, device=None) -> None:
        """The TP group's check of every expert piece of the layer from each rank's records.
        device: where this rank's records were decoded (None: on the host); when the check
        fails, a piece whose device record differs from the CPU codec's decode of the same
        planes raises DeviceFaultError (runtime.verify.block_fault) in its place."""
        everyone = gather(layer, mine, moe_ranks(layer)[1], experts=True)  # (under EP: its whole experts)
        try:
            for pc in layer._uw_pieces.values():
                check_shard_records([d[pc["name"]] for d in everyone if pc["name"] in d], pc["full_header"],
                                    pc["name"])
        except ChecksumError as e:
            for pc in layer._uw_pieces.values() if device is not None else ():
                if pc["name"] in mine:
                    fault = block_fault(pc["name"], device, mine[pc["name"]], lambda pc=pc: piece_record(pc)[1])
                    if fault is not None:
                        raise fault from None
            raise e from None

    def _verify(self, layer, keep: bool = False) -> dict:
        """Decode each piece once; the TP group checks every expert tensor's stored crc32 from
        the shard records (one all-gather for the whole layer).  keep: return the decoded
        pieces, {checkpoint name: uint16 [rows, cols]} (palette mode builds its stacks from
        them), else {}."""
        mine, decoded = {}, {}
        for pc in layer._uw_pieces.values():
            w, mine[pc["name"]] = piece_record(pc)
            if keep:
                decoded[pc["name"]] = w
        self._check_group(layer, mine)
        return decoded

    # ------------------------------------------------------------------ forward

    def _decode_experts(self, layer, sel, device) -> tuple[torch.Tensor, torch.Tensor]:
        """bf16 w13 [len(sel), 2I, H] and w2 [len(sel), H, I] of the local experts `sel`
        (indices into the layer's local experts: a list, or for palette stacks an integer
        tensor on the device, read there), decoded into the device's scratch."""
        inter, hidden = layer._uw_shape
        n13, n2 = 2 * inter * hidden, hidden * inter
        buf = scratch.weights(device, len(sel) * (n13 + n2))
        policy = current_policy()
        if layer._uw_slots is not None:
            ids = sel if isinstance(sel, torch.Tensor) else torch.tensor(sel, dtype=torch.int64, device=device)
            return (layer._uw_slots[0].decode(ids, buf[: len(sel) * n13]),
                    layer._uw_slots[1].decode(ids, buf[len(sel) * n13: len(sel) * (n13 + n2)]))
        w13 = buf[: len(sel) * n13].view(len(sel), 2 * inter, hidden)
        w2 = buf[len(sel) * n13: len(sel) * (n13 + n2)].view(len(sel), hidden, inter)
        for i, e in enumerate(sel):
            dispatch.decode_into(layer._uw_w13[e], w13[i].view(-1), 2 * inter, hidden, policy)
            dispatch.decode_into(layer._uw_w2[e], w2[i].view(-1), hidden, inter, policy)
        return w13, w2

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if layer._uw_w13 is None:  # dense mode: vLLM's own path on the decoded weights
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        if x.device.type == "cpu" and (shared_experts is None or not self._kernel_runs_shared()):
            # vLLM traces the CPU MoE forward into its compiled graph (on CUDA it calls it
            # through its own opaque op): the routed-expert selection below depends on the
            # data, so it runs behind an op of ours that the compiler does not look into.  The
            # op takes no module: with shared experts (DeepSeek-V3, Kimi-K2) only where vLLM's
            # kernel would not run them either (its synchronous finalize: vLLM's MoE runner does).
            return torch.ops.unweight_vllm.moe_routed(x, topk_weights, topk_ids, self.prefix)
        return self.apply_routed(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)

    def _kernel_runs_shared(self) -> bool:
        """Whether vLLM's experts kernel, handed the layer's shared experts, runs them itself (an
        asynchronous finalize overlapping them with its combine); True where it cannot say."""
        return bool(getattr(self.moe_kernel, "can_overlap_shared_experts", True))

    def _slots_gemv(self, layer, device) -> bool:
        """Whether this layer's routed experts run on their compressed stacks at a decode step
        (routed_forward): a SwiGLU layer (gate and up stacked, silu) whose router weights
        scale the outputs, with the rank's expert projections timed faster on the tensor-core
        GEMV than decode + cuBLAS at batch 1 on this device.  The shapes looked up are the
        ones `unweight tune --tp N` times for a checkpoint (its per-expert matrices, each
        rank's block): gate / up [I / tp, H] for the stacked w13, down [H, I / tp].  Decided
        once per layer."""
        v = getattr(layer, "_uw_slots_gemv", None)
        if v is None:
            policy = current_policy()
            act = getattr(layer.activation, "value", layer.activation)
            s13, s2 = layer._uw_slots
            shapes = ((s13.rows // 2, s13.cols), (s2.rows, s2.cols))
            v = (act == "silu" and not layer.apply_router_weight_on_input and policy is not None
                 and selftest.slots_ok(device, "gemv")
                 and all(policy.measured_faster(n, k, 1, PALETTE_GEMV_MMA, device)
                         and kp.pgemv_supported(1, k, kp.PGEMV_VARIANT_MMA) for n, k in shapes))
            layer._uw_slots_gemv = v
            if v:
                log.info("unweight: %s runs its routed experts on the compressed stacks at decode steps", self.prefix)
        return v

    def apply_routed(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        """The compressed experts' forward: the routing made this rank's (local_routing), the
        experts it routes to decoded into scratch (routed_selection says which), then vLLM's
        experts kernel on them; at a decode step where _slots_gemv holds, the routed experts
        run on the compressed palette stacks instead (routed_forward)."""
        on_device = x.device.type != "cpu"
        topk_weights, topk_ids, mine = local_routing(layer, topk_weights, topk_ids)
        if (on_device and layer._uw_slots is not None and topk_ids.numel() < len(layer._uw_experts)
                and shared_experts is None and self._slots_gemv(layer, x.device)):
            return routed_forward(*layer._uw_slots, x, topk_weights, topk_ids)
        sel, ids = routed_selection(layer, topk_ids, mine, on_device)
        w13, w2 = self._decode_experts(layer, sel, x.device)
        w13, w2 = convert_to_unquantized_kernel_format(self.unquantized_backend, moe_config=layer.moe_config,
                                                       w13_weight=w13, w2_weight=w2, layer=layer)
        # The experts kernel converts weights on a module (CPU: prepacks them); give it a
        # stand-in holding the decoded stacks, so the layer's own attributes stay as they are.
        tmp = _Stacks(layer, w13, w2)
        self.moe_kernel.fused_experts.process_weights_after_loading(tmp)
        return self.moe_kernel.apply(hidden_states=x, w1=tmp.w13_weight, w2=tmp.w2_weight, topk_weights=topk_weights,
                                     topk_ids=ids, activation=layer.activation,
                                     apply_router_weight_on_input=layer.apply_router_weight_on_input,
                                     global_num_experts=len(sel), expert_map=None, shared_experts=shared_experts,
                                     shared_experts_input=shared_experts_input)


class UnweightStackedMoEMethod(UnweightFusedMoEMethod):
    """Experts stored as 3-D stacks, as Llama 4's checkpoints hold them: ``gate_up_proj``
    [E, H, 2I] and ``down_proj`` [E, I, H], every expert's matrices transposed against the
    [2I, H] / [H, I] that vLLM's experts kernel takes.  The stacks' planes come to take_plane
    straight from the weight stream (loader.py), not through the model's loader, which would
    transpose and split them as BF16.  As soon as a layer's two stacks have come, each rank
    decodes its block of every expert from the stacks' segments alone (the gate and up columns
    and the down rows of its intermediate range) and holds each block transposed into vLLM's
    orientation as a piece re-encoded in the stack's encoding (a rank-local tensor: its own
    crc32 is checked as the layer is held); after the load the TP group checks each stack's
    crc32 from those blocks.  Under expert parallelism a rank takes its whole experts instead,
    reading their segments itself from the memory-mapped files while the stream skips the
    stacks (the other experts' bytes are never read).  From there the layer
    is the per-expert method's: modes, palette stacks, routed decode and checks on a GPU."""

    def __init__(self, config, moe, prefix: str, stacks: dict):
        E = config.encoded[stacks["w13"]][5]
        names = {(e, sid): f"{stacks['w2' if sid == 'w2' else 'w13']}[{e}].{sid}" for e in range(E)
                 for sid in SHARD_IDS}
        super().__init__(config, moe, prefix, names)
        self.stacks = stacks  # {"w13": gate_up stack name, "w2": down stack name}

    def _stack_header(self, stem: str) -> TensorHeader:
        m = self.config.encoded[self.stacks[stem]]
        return TensorHeader(encoding=m[2], rows=m[0], cols=m[1], rows_per_group=m[3], cols_per_chunk=m[4], crc32=0,
                            stack=m[5])

    def _stack_ranges(self, layer, h13: TensorHeader, h2: TensorHeader) -> tuple:
        """This rank's intermediate range [i0, i1): the gate columns [i0, i1) and up columns
        [I + i0, I + i1) of every gate_up matrix, the rows [i0, i1) of every down matrix; the
        stacks' shapes checked against the model's (InputError naming the tensor); under
        expert parallelism the whole [0, I)."""
        rank, size, _, _ = moe_ranks(layer)
        moe = layer.moe_config
        inter, hidden = moe.intermediate_size_per_partition_unpadded * size, moe.hidden_dim_unpadded
        for h, name, want in ((h13, self.stacks["w13"], (hidden, 2 * inter)), (h2, self.stacks["w2"], (inter, hidden))):
            if (h.stack, h.rows, h.cols) != (layer.global_num_experts, *want):
                raise InputError(f"{name} [{h.stack}x{h.rows}x{h.cols}]: model expects "
                                 f"[{layer.global_num_experts}x{want[0]}x{want[1]}]")
        # Any equal split: a rank decodes its block from the segments that hold it (block() in
        # _pieces_from_stacks), so its edges need not lie on the stacks' segment grids.
        return sh.tp_shard_range(inter, size, rank, what=f"{self.prefix} (intermediate size)", axis="rows")

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        self._placeholders(layer, lambda stem, suf: self._stack_loader(layer, stem, suf))
        self._stack_ranges(layer, self._stack_header("w13"), self._stack_header("w2"))  # before any read
        # Under expert parallelism a rank needs its own experts' matrices only: it reads their
        # segments from the mapped files itself (_stack_planes), and the weight stream skips
        # the stacks' planes unread (loader.py: common.SKIP_UNREAD during the load; where
        # a stream does not ask, they arrive and are taken as without it).
        self.self_read = moe_ranks(layer)[3] > 1 and self.config.model_path is not None

    def _stack_loader(self, layer, stem: str, suffix: str):
        def load(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None, return_success=False):
            # The planes of a stack go to take_plane from the weight stream (loader.py), past the
            # model's own loader, which would transpose and split them as BF16 stacks.
            raise InputError(f"{self.stacks[stem]}: its planes reached the model's own weight loader (a load "
                             f"format other than the default); serve it with the default load format or "
                             f"--load-format unweight")
        load.supports_moe_loading = True
        return load

    def take_plane(self, layer, name: str, suffix: str, t: torch.Tensor) -> None:
        """One plane of one of the layer's stacks, as the checkpoint holds it (loader.py hands
        it over from the weight stream)."""
        stem = "w13" if name == self.stacks["w13"] else "w2"
        layer._uw_pending.setdefault(stem, {})[suffix] = t
        # Once both stacks are whole, this rank's blocks are cut from them at once: a rank holds
        # one layer's stacks at a time, not every layer's until the load ends (the stream's
        # tensors are copies in host memory: some 130 GB of Scout's stacks, on each rank).
        if all(self._arrived(layer, s) for s in ("w13", "w2")):
            self._pieces_from_stacks(layer)

    def _arrived(self, layer, stem: str) -> bool:
        """Whether every plane of the layer's `stem` stack has come."""
        pend = layer._uw_pending.get(stem, {})
        if C.SUFFIX_HDR not in pend:
            return False
        h = TensorHeader.parse(pend[C.SUFFIX_HDR].numpy(), self.stacks[stem])
        return all(s in pend for s in tc.plane_shapes(h))

    def _stack_planes(self, layer, stem: str) -> tuple[TensorHeader, dict]:
        """A stack's header and planes (NumPy views of the loaded tensors, or of the mapped
        checkpoint file when the stream skipped them: nothing read until a matrix's segments
        are taken), checked against it."""
        name = self.stacks[stem]
        pend = layer._uw_pending.pop(stem, {})
        if not pend and self.self_read:
            ck = layer.__dict__.get("_uw_ck")  # (one opening of the checkpoint for both stacks)
            if ck is None:
                from ...format.checkpoint import CompressedCheckpoint
                ck = layer._uw_ck = CompressedCheckpoint(self.config.model_path)
            try:
                h, planes = ck.header(name), ck.planes(name)
                tc.check_planes(h, planes, ck.location(name))
            except Exception:
                layer.__dict__.pop("_uw_ck").close()
                raise
            layer._uw_mapped = getattr(layer, "_uw_mapped", []) + [name]
            return h, planes
        if C.SUFFIX_HDR not in pend:
            raise missing_plane(pend, name)
        h = TensorHeader.parse(pend[C.SUFFIX_HDR].numpy(), name)
        planes = {C.SUFFIX_HDR: pend[C.SUFFIX_HDR].numpy()}
        for suf in tc.plane_shapes(h):
            if suf not in pend:
                raise missing_plane(pend, name)
            planes[suf] = pend[suf].numpy()
        tc.check_planes(h, planes, name)
        return h, planes

    def process_weights_after_loading(self, layer) -> None:
        if not layer._uw_pieces:
            self._pieces_from_stacks(layer)  # (a stack short of a plane: names it)
        self._check_stacks(layer)
        super().process_weights_after_loading(layer)

    def _check_stacks(self, layer) -> None:
        """Each stack's crc32 from the TP group's block records ([E*H, 2I] and [E*I, H] taken
        as matrices), gathered after the load, outside the weight stream (the blocks are cut as
        the stacks arrive)."""
        mine, views = layer.__dict__.pop("_uw_stack_records", None), layer.__dict__.pop("_uw_stack_views", {})
        if mine is None:
            return
        _, tp, _, ep = moe_ranks(layer)
        everyone = gather(layer, mine, tp * ep, experts=True)  # (blocks: intermediate ranges, or whole experts)
        parts = "expert-parallel slices" if ep > 1 else "tensor-parallel shards"
        for stem, view in views.items():
            if not check_shard_records([r for d in everyone for r in d[stem]], view, self.stacks[stem], parts):
                raise ChecksumError(f"{self.stacks[stem]}: the ranks' blocks do not cover the stack, so its "
                                    f"crc32 could not be checked")

    def _pieces_from_stacks(self, layer) -> None:
        rank, size, ep_rank, ep = moe_ranks(layer)
        (h13, p13), (h2, p2) = self._stack_planes(layer, "w13"), self._stack_planes(layer, "w2")
        i0, i1 = self._stack_ranges(layer, h13, h2)
        inter = h2.rows
        verify = verify_setting() is not None

        mapped = layer.__dict__.pop("_uw_mapped", [])  # names of the stacks read here, from ck
        ck = layer.__dict__.pop("_uw_ck", None)
        read = {}  # (stack name, expert) -> plane bytes of the expert's matrix taken from a stack

        def block(h, planes, e, rows=None, cols=None):
            # (a block narrower than the stack's segment grid, such as Scout's gate_up at TP 8 in
            # a file with 2048-column chunks, is cut from the segments that hold it)
            stack = self.stacks['w13' if h is h13 else 'w2']
            where = f"{stack}[{e}]"
            hm, pm = tc.matrix_planes(h, planes, e)
            read[(stack, e)] = sum(int(a.nbytes) for a in pm.values())
            return sh.decode_block(hm, pm, rows=rows, cols=cols, where=where)

        gate_crcs, up_crcs, gate_up_recs, down_recs = [], [], [], []
        full = {stem: sum(int(a.nbytes) for a in planes.values()) for stem, planes in (("w13", p13), ("w2", p2))}
        hidden = h13.rows
        local = _local_experts(layer)
        for e in local:
            if ep > 1:  # whole experts: a matrix's gate and up halves from one decode
                gu = block(h13, p13, e)
                g, u = gu[:, :inter], gu[:, inter:]
            else:
                g, u = block(h13, p13, e, cols=(i0, i1)), block(h13, p13, e, cols=(inter + i0, inter + i1))
            d = block(h2, p2, e, rows=(i0, i1))
            if verify and ep > 1:
                gate_up_recs.append(shard_record(gu, rows=(e * hidden, (e + 1) * hidden)))
            elif verify:
                gate_crcs += [int(c) for c in sh.row_crcs(g)]
                up_crcs += [int(c) for c in sh.row_crcs(u)]
            if verify:
                down_recs.append(shard_record(d, rows=(e * inter + i0, e * inter + i1)))
            for sid, w, stem in (("w1", g, "w13"), ("w3", u, "w13"), ("w2", d, "w2")):
                w = transposed(w)
                enc = tc.encode(w, h13.encoding_name if stem == "w13" else h2.encoding_name)
                layer._uw_pieces[(e, sid)] = {
                    "name": f"{self.names[(e, sid)]} rank {rank}", "header": enc.header, "planes": enc.planes,
                    "full_header": enc.header, "rows": (0, w.shape[0]), "cols": (0, w.shape[1]),
                    # (the stack's plane bytes over its experts and, for gate_up, its two halves)
                    "full_bytes": full[stem] // (h13.stack * (2 if stem == "w13" else 1) * size),
                    "recoded": True}
        if verify:  # (checked across the group by _check_stacks once the load is done)
            layer._uw_stack_records = {"w13": gate_up_recs or [("cols", i0, i1, gate_crcs),
                                                               ("cols", inter + i0, inter + i1, up_crcs)],
                                       "w2": down_recs}
            layer._uw_stack_views = {stem: dataclasses.replace(h, rows=h.stack * h.rows, stack=0)
                                     for stem, h in (("w13", h13), ("w2", h2))}
        if ck is not None:  # (the pieces are copies: the mapped pages can go)
            for name in mapped:
                ck.release_encoded(name)
            ck.close()
        # plane bytes this rank read of the stacks: its experts' segments of a stack it read
        # itself, the whole of one the weight stream brought
        got = sum(n for (stack, _), n in read.items() if stack in mapped) + \
            sum(full[stem] for stem, name in self.stacks.items() if name not in mapped)
        layer._uw_record_extra = {"stacked": {"gate_up": self.stacks["w13"], "down": self.stacks["w2"],
                                              "intermediate": [i0, i1], "stack_checked": verify,
                                              "stack_bytes": full["w13"] + full["w2"], "read_bytes": got}}
        if ep > 1:
            log.info("unweight: %s: expert-parallel rank %d/%d took %d of %d stacked experts' gate_up and down, whole",
                     self.prefix, ep_rank, ep, len(local), h13.stack)
        else:
            log.info("unweight: %s: rank %d/%d took intermediate [%d, %d) of %d stacked experts' gate_up and down",
                     self.prefix, rank, size, i0, i1, h13.stack)


def local_routing(layer, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple:
    """(topk_weights, topk_ids, mine) of this rank's experts.  Without expert parallelism the
    routing as it is (ids are local ids) and mine None.  Under it topk_ids [T, k] hold global
    expert ids: each becomes its local id from vLLM's expert map (layer._expert_map, -1 for
    another rank's expert; read on the device, no host sync), and a choice of another rank's
    expert gets weight 0 on local expert 0, whose output the weight zeroes, as vLLM's kernels
    skip what the map leaves out (vLLM's layer sums the ranks' outputs after the method);
    mine: bool [T, k], the choices of this rank's experts."""
    if not layer.use_ep:
        return topk_weights, topk_ids, None
    loc = layer._expert_map[topk_ids.long()]
    mine = loc >= 0
    return (torch.where(mine, topk_weights, torch.zeros_like(topk_weights)),
            torch.where(mine, loc, torch.zeros_like(loc)).to(topk_ids.dtype), mine)


def routed_selection(layer, topk_ids: torch.Tensor, mine: torch.Tensor | None, on_device: bool) -> tuple:
    """(sel, ids): the local experts to decode for the local routing topk_ids [T, k] (mine from
    local_routing) and the routing renumbered onto them.  sel: for palette stacks on a device,
    an integer tensor there (slot s: the expert of routing choice s, of T * k, or every local
    expert when there are fewer; no host sync, so a CUDA graph captures it); otherwise a list
    of local ids: the routed ones in increasing order (read on the host; under expert
    parallelism only this rank's, and local expert 0 when none is routed here), or every
    local expert while a CUDA graph is being captured (a host read would break the capture)."""
    n = len(layer._uw_experts)
    if on_device and layer._uw_slots is not None:
        flat = topk_ids.reshape(-1)
        if flat.numel() < n:
            return flat, torch.arange(flat.numel(), device=flat.device, dtype=topk_ids.dtype).view_as(topk_ids)
        return torch.arange(n, device=flat.device), topk_ids
    if not on_device or not torch.cuda.is_current_stream_capturing():
        used = torch.unique(topk_ids if mine is None else topk_ids[mine])
        if used.numel() == 0:
            used = topk_ids.new_zeros(1)
        return used.tolist(), torch.searchsorted(used, topk_ids).to(topk_ids.dtype)
    return list(range(n)), topk_ids


def transposed(w: np.ndarray) -> np.ndarray:
    """uint16 [K, N] copy of a host uint16 [N, K] matrix.  Through torch: its blocked,
    multithreaded copy runs ~4x numpy's strided one (12 against 41 ms for 5120 x 2048 on two
    cores); the transposes are still about 40% of a Llama 4 rank's load-time work on its
    stacks (scripts/bench_stack_load.py)."""
    return torch.from_numpy(w.view(np.int16)).t().contiguous().numpy().view(np.uint16)


# prefix -> (method, layer) of the compressed MoE layers, for moe_routed to find its layer by
# name (a module cannot be an op argument).
_ROUTED: dict = {}


@torch.library.custom_op("unweight_vllm::moe_routed", mutates_args=())
def moe_routed(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, prefix: str) -> torch.Tensor:
    """The compressed MoE layer `prefix`'s output for x [T, H] bf16 routed by topk_ids [T, k]
    with topk_weights [T, k]: [T, H] bf16 on x's device."""
    method, layer = _ROUTED[prefix]
    return method.apply_routed(layer, x, topk_weights, topk_ids)


@moe_routed.register_fake
def _(x, topk_weights, topk_ids, prefix):
    return torch.empty_like(x)


def _share_stack_bytes(report: list, slots: tuple) -> None:
    """The layer report's held bytes of palette stacks (w13, w2): each expert's share of its
    stack, w13's split between gate (w1) and up (w3) by rows (halves)."""
    per = [st.held_bytes() / st.num_experts for st in slots]
    for r in report:
        r["held_bytes"] = int(round(per[0] / 2 if r["shard_id"] in ("w1", "w3") else per[1]))


class _Stacks(nn.Module):
    """The decoded expert stacks of one forward, shaped like a RoutedExperts layer's weights."""

    def __init__(self, layer, w13: torch.Tensor, w2: torch.Tensor):
        super().__init__()
        self.moe_config = layer.moe_config
        self.activation = layer.activation
        self.w13_weight = nn.Parameter(w13, requires_grad=False)
        self.w2_weight = nn.Parameter(w2, requires_grad=False)


def _piece_tensors(w) -> list:
    return [t for t in (w.sm, w.exp, w.off, w.table, w.lut, w.idx, w.vpos, w.vexp) if t is not None and t.numel()]
