"""The vLLM adapter's two torch ops: opaque wrappers over the shared runtime dispatch.

vLLM compiles its models with torch.compile and captures CUDA graphs; an opaque custom op
per layer keeps the compiler out of the decode (the scratch buffer it writes is process
state), while the work itself is unweight.runtime.dispatch's, the same code transformers
models run.  A layer's per-rank weight is a list of *pieces*: self-contained encoded tensors
stacked along rows (q, k, v of a merged qkv projection; gate, up of gate_up; one piece for
everything else), each the rank's own segments only (unweight.codec.shard).  The ops take
the pieces as a flat tensor list plus an int list of metadata:

    planes: PLANES_PER_PIECE tensors per piece, on the layer's device
        huffman: sm uint8 [n, k], exp uint8 [bytes], off uint32 [n_seg + 1],
                 table uint8 [4, exp_hi - exp_lo + 1], lut uint16 [4, 4096] (CUDA) or empty,
                 chk uint16 [n_seg, P] (the checkpoint index) or the placeholder
        palette: sm uint8 [n, k], idx uint8 [n, ceil(k/2)], vpos uint32 [nv], vexp uint8 [nv, 32],
                 vrow uint32 [n + 1] (the verbatim row index, runtime.weights.hold_row_index) or
                 the placeholder, then the placeholder
    meta: META_LEN ints per piece: encoding, rows, cols, R, C, exp_lo, exp_hi, pal_size, palette[16],
          chk_interval (0: no index), tiled (1: a palette piece's sm and idx are tile-major,
          ops/layout.py)

    unweight_vllm::linear(x, planes, meta, bias, out_rows, cols) -> y   bf16 [..., out_rows]
    unweight_vllm::embedding(ids, planes, meta, out_rows, cols) -> e   bf16 [..., cols]

``out_rows`` may exceed the pieces' rows (vocab padding of a vLLM vocab-parallel shard):
those rows are zero, as in vLLM's own padded embedding.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from ...format import constants as C
from ...runtime import dispatch, selftest
from ...runtime.policy import DispatchPolicy
from ...runtime.weights import EncodedWeight

META_LEN = 10 + C.PAL_MAX_ENTRIES
PLANES_PER_PIECE = 6

_POLICY: dict = {}


def set_policy(policy: DispatchPolicy) -> None:
    """The dispatch policy every unweight layer of this process runs under (set at load)."""
    _POLICY["p"] = policy


def current_policy() -> DispatchPolicy | None:
    """The policy set_policy set (None before a load)."""
    return _POLICY.get("p")


def check_kernels(device: torch.device) -> None:
    """Check on a CUDA `device`, before any forward, the fused kernels the policy may run there,
    its row gathers and its expert-slot kernels (runtime/selftest.py: once per device; one that
    fails is not used)."""
    if torch.device(device).type != "cuda":
        return
    policy = current_policy()
    if policy is not None:
        selftest.check_fused_paths(policy, device)
    selftest.check_gather(device)
    selftest.check_slots(device)


def piece_meta(w: EncodedWeight) -> list:
    return [w.encoding, w.rows, w.cols, w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi,
            len(w.palette)] + w.palette + [0] * (C.PAL_MAX_ENTRIES - len(w.palette)) + [w.chk_interval,
                                                                                         int(w.tiled)]


def piece_planes(w: EncodedWeight, placeholder: Tensor) -> list:
    if w.is_huffman:
        return [w.sm, w.exp, w.off, w.table, w.lut, w.chk if w.chk is not None else placeholder]
    return [w.sm, w.idx, w.vpos, w.vexp, w.vrow if w.vrow is not None else placeholder, placeholder]


def pieces(planes: List[Tensor], meta: List[int]) -> list:
    """EncodedWeight pieces from the flat op arguments."""
    n = len(meta) // META_LEN
    if len(planes) != n * PLANES_PER_PIECE:
        raise ValueError(f"unweight_vllm: {len(planes)} plane tensors for {n} pieces")
    out = []
    for i in range(n):
        m = meta[i * META_LEN:(i + 1) * META_LEN]
        t = planes[i * PLANES_PER_PIECE:(i + 1) * PLANES_PER_PIECE]
        S = m[8 + C.PAL_MAX_ENTRIES]
        kw = ({"exp": t[1], "off": t[2], "table": t[3], "lut": t[4], "chk": t[5] if S else None, "chk_interval": S}
              if m[0] == C.ENC_HUFFMAN
              else {"idx": t[1], "vpos": t[2], "vexp": t[3], "tiled": bool(m[9 + C.PAL_MAX_ENTRIES]),
                    "vrow": t[4] if t[4].numel() else None})
        out.append(EncodedWeight(m[0], m[1], m[2], m[3], m[4], m[5], m[6], list(m[8:8 + m[7]]), t[0], **kw))
    return out


@torch.library.custom_op("unweight_vllm::linear", mutates_args=())
def linear(x: Tensor, planes: List[Tensor], meta: List[int], bias: Optional[Tensor], out_rows: int,
           cols: int) -> Tensor:
    return dispatch.linear(pieces(planes, meta), x, bias, out_rows, cols, current_policy())


@linear.register_fake
def _(x, planes, meta, bias, out_rows, cols):
    return x.new_empty((*x.shape[:-1], out_rows))


@torch.library.custom_op("unweight_vllm::embedding", mutates_args=())
def embedding(ids: Tensor, planes: List[Tensor], meta: List[int], out_rows: int, cols: int) -> Tensor:
    return dispatch.embedding(pieces(planes, meta), ids, out_rows, cols)


@embedding.register_fake
def _(ids, planes, meta, out_rows, cols):
    return planes[0].new_empty((*ids.shape, cols), dtype=torch.bfloat16)
