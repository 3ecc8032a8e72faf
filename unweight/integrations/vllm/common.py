"""What the vLLM methods of unweight share: plane placeholders, per-rank pieces, load reports.

Used by quant.py (linear and embedding layers) and moe.py (fused-MoE experts); imports vLLM
only inside functions that run in a vLLM process.
"""
from __future__ import annotations

import json
import logging

import numpy as np
import torch

from ... import ops
from ...codec import shard as sh
from ...codec import tensor_codec as tc
from ...codec.shard_check import decode_record
from ...format import constants as C
from ...format.errors import FormatError
from ...format.header import TensorHeader
from ...runtime import dispatch
from ...runtime import kernel_plan as kp
from ...runtime import scratch
from ...runtime.policy import resolve_plane_order
from ...runtime.weights import EncodedWeight, code_table, device_planes, hold_paired, hold_row_index
from .ops import current_policy

# a child of vLLM's logger, so the lines show up in every vLLM process with vLLM's formatting
log = logging.getLogger("vllm.unweight")

# Checkpoint names of encoded tensors whose planes vLLM's weight stream skips unread: under
# expert parallelism, other ranks' per-expert tensors and the expert stacks that their layers'
# methods read themselves, their own experts' segments only (moe.UnweightStackedMoEMethod).
# Set for the length of one load by loader.py, from the model being loaded.
SKIP_UNREAD: set = set()

PLANE_DTYPES = {C.SUFFIX_HDR: torch.uint8, C.SUFFIX_SM: torch.uint8, C.SUFFIX_EXP: torch.uint8,
                C.SUFFIX_OFF: torch.uint32, C.SUFFIX_IDX: torch.uint8, C.SUFFIX_VPOS: torch.uint32,
                C.SUFFIX_VEXP: torch.uint8, C.SUFFIX_CHK: torch.uint16}


def report_layer(prefix: str, record: dict) -> None:
    """One log line per layer saying what this rank holds (operators read it; so do the tests)."""
    log.info("unweight layer report %s", json.dumps({"layer": prefix, **record}, sort_keys=True))


def tp_info(layer) -> tuple[int, int]:
    """(rank, size) of the layer's tensor-parallel group."""
    rank = getattr(layer, "tp_rank", None)
    size = getattr(layer, "tp_size", None)
    if rank is None or size is None:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )
        rank, size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    return int(rank), int(size)


def take_shard(pend: dict, name: str, shard_range) -> dict | None:
    """This rank's piece of one encoded tensor, once `pend` ({suffix: mapped plane}) holds all
    its planes (None before).  shard_range(full header) -> (rows, cols) of the rank's block.
    The piece: its header and planes (fresh host arrays: the block's segments, or where the
    block is off the segment grid the block decoded from the segments that hold it and encoded
    anew, "recoded"), the full tensor's header, the block's ranges and the full planes' bytes."""
    if C.SUFFIX_HDR not in pend:
        return None
    h = TensorHeader.parse(pend[C.SUFFIX_HDR].numpy(), name)
    need = tc.planes_for(h)
    if any(s not in pend for s in need):
        return None
    planes = {s: pend[s].numpy() for s in need}
    tc.check_planes(h, planes, name)
    rows, cols = shard_range(h)
    hs, ps, recoded = sh.block_planes(h, planes, rows=rows, cols=cols, where=name)
    if recoded:
        log.info("unweight: %s: this rank's %s", name, sh.recoded_note(h, rows, cols))
    return {"name": name, "header": hs, "planes": ps, "full_header": h, "rows": rows or (0, h.rows),
            "cols": cols or (0, h.cols), "full_bytes": int(sum(a.nbytes for a in planes.values())),
            "recoded": recoded}


def missing_plane(pend: dict, name: str) -> FormatError:
    """The error for a tensor whose planes never all arrived ({suffix: plane} in pend)."""
    if C.SUFFIX_HDR not in pend:
        return FormatError(f"{name}: compressed tensor is missing plane {C.SUFFIX_HDR} in the checkpoint")
    h = TensorHeader.parse(pend[C.SUFFIX_HDR].numpy(), name)
    miss = [s for s in tc.planes_for(h) if s not in pend]
    return FormatError(f"{name}: compressed tensor is missing plane {miss[0]} in the checkpoint")


def device_piece(hs: TensorHeader, ps: dict, dev, mode: str, name: str) -> EncodedWeight:
    """The rank's piece on the layer's device, in the mode's encoding (dense: as stored,
    decoded by the caller).  A huffman piece kept compressed on a GPU gets the checkpoint
    index when the file has none (the decode kernel's parallelism); a palette piece on a GPU
    holds its palette in paired order (runtime.weights.hold_paired: the decode's cheaper
    lookup, the same weights) and its verbatim list's row index (hold_row_index: the fused
    kernels' cursors)."""
    planes = device_planes(ps, dev)
    table = lut = None
    if hs.encoding == C.ENC_HUFFMAN:
        table = code_table(hs, dev)
        lut = torch.empty(0, dtype=torch.uint16, device=dev)
        if dev.type == "cuda" and ops.cuda_kernels_built():
            lut = ops.build_lut(table, hs.exp_lo, hs.exp_hi, scratch.error_counter(dev))
            if mode == "huffman":  # built on the GPU from the stream as stored (ops.build_index)
                indexed = ops.build_index(hs, planes, lut, scratch.error_counter(dev),
                                          variant=dispatch.decoder_variant(hs, dev, current_policy()))
                if indexed is not None:
                    hs, planes = indexed
    if mode in ("huffman", "palette") and mode != hs.encoding_name:
        if mode == "palette" and dev.type == "cuda" and ops.cuda_kernels_built():
            hs, planes = ops.transcode_to_palette(hs, planes, lut, scratch.error_counter(dev),
                                                  dispatch.decoder_variant(hs, dev, current_policy()))
        else:
            # On the host: a shard's header carries no crc32 of its own (shard_planes), so the
            # decode here is not checked against one; the piece was checked with the TP
            # group's shard records (quant._check_group).
            w = tc.decode(hs, {s: np.ascontiguousarray(a) for s, a in ps.items()}, verify=False)
            enc = tc.encode(w, mode, grid=(hs.rows_per_group, hs.cols_per_chunk))
            return device_piece(enc.header, enc.planes, dev, mode, name)
        table = lut = None
    w = EncodedWeight.from_header(hs, planes, table=table, lut=lut, name=name)
    return hold_row_index(hold_paired(w)) if dev.type == "cuda" else w


def hold_tiled(w: EncodedWeight, order: str = "tiled", policy=None) -> EncodedWeight:
    """A palette piece of whole 16 x 64 tiles with its sm and idx permuted tile-major on their
    device (ops/layout.py; the fused kernels' streaming order, the same results) when `order`
    is "tiled", or "auto" and the policy (DispatchPolicy) measured its shape faster tile-major
    on that device; any other piece as it is."""
    if (w.is_huffman or w.tiled or not kp.pal_tiled_ok(w.rows, w.cols)
            or resolve_plane_order(order, policy, w.rows, w.cols, w.device) != "tiled"):
        return w
    w.sm, w.idx = ops.tile_palette_planes(w.sm, w.idx)
    w.tiled = True
    return w


def moe_ranks(layer) -> tuple[int, int, int, int]:
    """(tp rank, tp size, ep rank, ep size) of a RoutedExperts layer's experts, from vLLM's
    FusedMoEParallelConfig: with --enable-expert-parallel each rank holds whole experts (tp 0
    of 1, ep rank of the TP group's size); without it, ep 0 of 1 and the model's TP."""
    pc = layer.moe_config.moe_parallel_config
    return int(pc.tp_rank), int(pc.tp_size), int(pc.ep_rank), int(pc.ep_size)


def gather(layer, record, size: int | None = None, experts: bool = False) -> list:
    """Every rank's `record` (any picklable object), in rank order, through the CPU group of
    the ranks that hold parts of the layer: the model's TP ranks, or for a MoE layer's experts
    (experts=True) vLLM's expert group (its TP ranks times its data-parallel ranks: experts
    are split over all of them, by expert under expert parallelism, else by intermediate
    range).  size: how many ranks hold parts (default: the layer's TP size)."""
    if size is None:
        _, size = tp_info(layer)
    if size == 1:
        return [record]
    import torch.distributed as dist
    if experts:
        from vllm.distributed import get_ep_group
        g = get_ep_group()
    else:
        from vllm.distributed import get_tp_group
        g = getattr(layer, "parallel_group", None) or get_tp_group()
    if g.world_size != size:
        raise RuntimeError(f"unweight: {size} ranks hold parts of the layer but its group has {g.world_size}")
    out = [None] * size
    dist.all_gather_object(out, record, group=g.cpu_group)
    return out


def piece_record(pc: dict) -> tuple:
    """(uint16 [rows, cols] block, shard record) of a piece (a layer's _uw_pieces entry)
    decoded from its planes on the host, its stored index checked (codec.shard_check)."""
    return decode_record(pc["header"], pc["planes"], pc["rows"], pc["cols"], pc["full_header"].cols, pc["name"])
