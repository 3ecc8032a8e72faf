"""Routed decode of a layer's palette experts from expert ids that stay on the device.

A serving engine that captures its forward in a CUDA graph cannot read the router's choice on
the host, so it cannot pick the experts to decode there; decoding every local expert at every
step instead costs a layer's whole expert weights per token.  ``ExpertSlots`` holds one
projection of a layer's experts ([E, rows, cols], this rank's block of each) so that any list
of expert ids, a device tensor, decodes with a fixed number of launches and no host sync:

* every expert is encoded as one palette stack (tensor_codec.encode of [E, rows, cols]: one
  palette for the layer, each expert's sign+mantissa and index planes at a fixed stride);
* each expert's verbatim list is padded to the layer's longest with further blocks of the same
  expert, written with their own exponents (patching them rewrites exactly what the palette
  decode wrote), so every expert's list has one length and holds ascending block ids;
* ``decode(ids, out)``: slot s of the output is expert ids[s], decoded by
  ops.decode_palette_slots, whose kernels read the ids on the device (grid y = slot) and run
  the palette decode's own bodies on that expert's planes: one decode launch and one patch
  launch for any S, the planes read once.

* ``gemv(x, ids)``: y[s] = x[s] @ W[ids[s]]^T at batch 1 per slot, on the compressed planes
  (ops.palette_gemv_slots: the tensor-core GEMV over grid y = slot, ids read on the device);
  ``routed_forward`` composes a SwiGLU MoE's routed experts from two of them (w13, w2) for the
  few tokens of a decode step, reading 0.75 of the experts' BF16 bytes where decode + a dense
  experts kernel writes and reads them again.

The bytes held are the stack's planes plus the padded lists (``held_bytes``; the padding alone:
``padding_bytes``, which one expert with many verbatim blocks multiplies by the expert count);
the bits decoded are the original weights' (tests/runtime/test_expert_slots.py).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

import torch.nn.functional as F

from .. import ops
from ..ops import transcode
from ..format import constants as C
from . import dispatch, scratch
from . import kernel_plan as kp

__all__ = ["ExpertSlots", "routed_forward"]


class ExpertSlots:
    """One projection of a layer's experts, palette-encoded as a stack for a decode by device
    expert ids.  Build with ``from_weights``."""

    def __init__(self, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, palette: list, rows_per_group: int,
                 cols_per_chunk: int):
        """sm uint8 [E, rows, cols]; idx uint8 [E, rows, ceil(cols / 2)]; vpos uint32 [E, V]
        (each expert's block ids within its matrix, ascending); vexp uint8 [E, V, PAL_BLOCK];
        palette: the stack's exponents; all tensors on one device.  vrow: the verbatim lists'
        row index (ops.verbatim_rows, uint32 [E, rows + 1]) the slots GEMV takes on CUDA, built
        by from_weights; None: the kernel searches the lists."""
        self.sm, self.idx, self.vpos, self.vexp = sm, idx, vpos, vexp
        self.vrow: Tensor | None = None
        self.palette = palette
        self.num_experts, self.rows, self.cols = sm.shape
        self.grid = (rows_per_group, cols_per_chunk)
        self.blocks = self.rows * -(-self.cols // C.PAL_BLOCK)  # blocks of one expert's matrix

    @classmethod
    def from_weights(cls, w, device, paired: bool | None = None,
                     chunk_weights: int = transcode.TRANSCODE_CHUNK_WEIGHTS) -> "ExpertSlots":
        """From the experts' BF16 bits w uint16 [E, rows, cols] (a host array, or a tensor of
        bf16 or uint16 on any device), encoded on `device`: the palette stack by
        ops.transcode.encode_palette_stack (on a GPU its device passes, a group of experts of at
        most chunk_weights weights on the device at a time; on the CPU the codec: the codec's
        stack encoding either way), then each expert's verbatim list padded on the device, the
        same groups at a time.  paired: hold the palette in paired order with idx rewritten to
        match (ops.paired_palette: the CUDA decode's cheaper lookup, the same weights); None:
        on a CUDA device."""
        dev = torch.device(device)
        t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.uint16)) if isinstance(w, np.ndarray) else w
        if t.dim() != 3 or t.element_size() != 2:
            raise ValueError(f"expert slots take [experts, rows, cols] BF16 weights, got shape {tuple(t.shape)}")
        E, rows, cols = t.shape
        h, p = transcode.encode_palette_stack(t, dev, chunk_weights)
        bpr = -(-cols // C.PAL_BLOCK)
        bpm = rows * bpr
        nv = int(p[C.SUFFIX_VPOS].numel())
        # Each expert's list: its verbatim blocks, then the first blocks that are not verbatim
        # until it is as long as the longest, in ascending block order; every entry holds its
        # block's exponents (0 past the end of a row).
        verbatim = torch.zeros(E * bpm, dtype=torch.bool, device=dev)
        verbatim[p[C.SUFFIX_VPOS].view(torch.int32).to(torch.int64) & 0xFFFFFFFF] = True
        verbatim = verbatim.view(E, bpm)
        counts = verbatim.sum(dim=1)
        width = int(counts.max()) if E else 0
        fill = ~verbatim & (torch.cumsum(~verbatim, dim=1) <= (width - counts)[:, None])
        listed = verbatim | fill  # width blocks per expert (width <= the blocks of a matrix)
        pos = listed.nonzero()[:, 1].to(torch.int32).view(torch.uint32).view(E, width)
        vexp = torch.empty((E, width, C.PAL_BLOCK), dtype=torch.uint8, device=dev)
        per = max(1, chunk_weights // max(1, rows * cols))
        for e0 in range(0, E, per):
            e1 = min(E, e0 + per)
            exps = torch.zeros((e1 - e0, rows, bpr * C.PAL_BLOCK), dtype=torch.uint8, device=dev)
            exps[..., :cols] = transcode.exponent_bytes(t[e0:e1].view(torch.int16).to(dev))
            vexp[e0:e1] = exps.view(e1 - e0, bpm, C.PAL_BLOCK)[listed[e0:e1]].view(e1 - e0, width, C.PAL_BLOCK)
        slots = cls(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], pos, vexp, [int(b) for b in h.palette[: h.pal_size]],
                    int(h.rows_per_group), int(h.cols_per_chunk))
        # the bytes the padded entries hold (4 of block id, PAL_BLOCK of exponents each)
        slots.padding_bytes = (E * width - nv) * (4 + C.PAL_BLOCK)
        if (dev.type == "cuda") if paired is None else paired:
            reorder = ops.pair_index(slots.palette, slots.idx)
            if reorder is not None:
                slots.palette, _, slots.idx = reorder
        if dev.type == "cuda" and width:
            slots.vrow = ops.verbatim_rows(slots.vpos, rows, cols)
        return slots

    def tensors(self) -> list:
        """The device tensors held (to register as module buffers)."""
        return [self.sm, self.idx, self.vpos, self.vexp] + ([self.vrow] if self.vrow is not None else [])

    def held_bytes(self) -> int:
        return sum(int(t.numel() * t.element_size()) for t in self.tensors())

    @property
    def device(self) -> torch.device:
        return self.sm.device

    def decode(self, ids: Tensor, out: Tensor) -> Tensor:
        """Experts ids [S] (an integer tensor on the stack's device) decoded into the first
        S * rows * cols words of `out` (bf16, the stack's device): the bf16 [S, rows, cols] view,
        slot s holding expert ids[s].  One launch of ops.decode_palette_slots (and one of its
        verbatim patch), which on CUDA reads the ids on the device: no host sync, so a CUDA
        graph captures it, and a replay decodes whatever ids the tensor then holds.  An id
        outside [0, E) leaves its slot unwritten and counts on the device's error counter (a
        FormatError on CPU)."""
        ids = ids.reshape(-1)
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        S = ids.numel()
        w = out[: S * self.rows * self.cols].view(S, self.rows, self.cols)
        ops.run.decode_palette_slots(ids, self.sm, self.idx, self.vpos, self.vexp, w,
                                     scratch.error_counter(w.device), self.palette, dispatch.palette_variant())
        return w

    def gemv(self, x: Tensor, ids: Tensor) -> Tensor:
        """y bf16 [S, rows] = x[s] @ W[ids[s]]^T for x bf16 [S, cols] and expert ids [S] (an
        integer tensor), all on the stack's device: one launch of ops.palette_gemv_slots, which
        on CUDA reads the ids on the device (no host sync; a CUDA graph captures it) and runs
        the tensor-core GEMV on each slot's expert planes (its bits: the GEMV's on that expert
        alone at batch 1); fp32 sums, one rounding.  An id outside [0, E) leaves its row
        unwritten and counts on the device's error counter (a FormatError on CPU)."""
        ids = ids.reshape(-1)
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        dev = self.device
        # (the launch holds S times one matrix's tiles: the split over K is planned for all of them)
        parts = ops.palette_gemv_parts(self.rows * max(1, ids.numel()), self.cols, dev, kp.PGEMV_VARIANT_MMA)
        return ops.run.palette_gemv_slots(x, ids, self.sm, self.idx, self.vpos, self.vexp,
                                          scratch.error_counter(dev), self.palette, parts, self.vrow)


def routed_forward(w13: ExpertSlots, w2: ExpertSlots, x: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """A SwiGLU MoE layer's routed experts on their compressed planes: out[t] = sum_j
    topk_weights[t, j] * W2[e] (silu(W1[e] x[t]) * W3[e] x[t]) with e = topk_ids[t, j], W13 = [W1;
    W3] stacked by rows (w13: [E, 2I, H], w2: [E, H, I]).  x bf16 [T, H]; topk_weights [T, k];
    topk_ids [T, k] (local expert ids); returns bf16 [T, H] on x's device.  Slot s = t * k + j:
    two ExpertSlots.gemv launches over the T * k slots (no host sync, nothing decoded), the
    activation in fp32 rounded to bf16, the weighted sum over k in fp32 with one rounding: within
    bf16 rounding of a dense experts kernel on the decoded weights, not its bits."""
    T, k = topk_ids.shape
    inter = w13.rows // 2
    if w13.rows != 2 * inter or w2.cols != inter or w2.rows != w13.cols or x.shape != (T, w13.cols):
        raise ValueError(f"routed_forward: stacks [{w13.num_experts}, {w13.rows}, {w13.cols}] and "
                         f"[{w2.num_experts}, {w2.rows}, {w2.cols}] do not make a SwiGLU MoE for x {tuple(x.shape)}")
    ids = topk_ids.reshape(-1)
    xs = x.to(torch.bfloat16).repeat_interleave(k, dim=0)  # slot s = t * k + j holds x[t]
    h = w13.gemv(xs, ids).float()
    act = (F.silu(h[:, :inter]) * h[:, inter:]).to(torch.bfloat16)
    y = w2.gemv(act, ids)
    out = (y.float().view(T, k, -1) * topk_weights.float().view(T, k, 1)).sum(dim=1)
    return out.to(x.dtype)
