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
* ``decode(ids, out)``: slot s of the output is expert ids[s].  The slots' planes are gathered
  from the stack (index_select), their verbatim ids offset by the slot's place in an
  [S * rows, cols] matrix, and that matrix decodes as one palette weight through
  runtime.dispatch (one decode launch and one patch launch, any S).

The bytes held are the stack's planes plus the padded lists (``held_bytes``; the padding alone:
``padding_bytes``, which one expert with many verbatim blocks multiplies by the expert count);
the bits decoded are the original weights' (tests/runtime/test_expert_slots.py).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..codec import tensor_codec as tc
from ..format import constants as C
from . import dispatch
from .weights import EncodedWeight

__all__ = ["ExpertSlots"]


class ExpertSlots:
    """One projection of a layer's experts, palette-encoded as a stack for a decode by device
    expert ids.  Build with ``from_weights``."""

    def __init__(self, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, palette: list, rows_per_group: int,
                 cols_per_chunk: int):
        """sm uint8 [E, rows, cols]; idx uint8 [E, rows, ceil(cols / 2)]; vpos int64 [E, V]
        (each expert's block ids within its matrix, ascending); vexp uint8 [E, V, PAL_BLOCK];
        palette: the stack's exponents; all tensors on one device."""
        self.sm, self.idx, self.vpos, self.vexp = sm, idx, vpos, vexp
        self.palette = palette
        self.num_experts, self.rows, self.cols = sm.shape
        self.grid = (rows_per_group, cols_per_chunk)
        self.blocks = self.rows * -(-self.cols // C.PAL_BLOCK)  # blocks of one expert's matrix

    @classmethod
    def from_weights(cls, w: np.ndarray, device, threads: int | None = None) -> "ExpertSlots":
        """From the experts' BF16 bits, uint16 [E, rows, cols] on the host."""
        w = np.ascontiguousarray(w, dtype=np.uint16)
        if w.ndim != 3:
            raise ValueError(f"expert slots take [experts, rows, cols] weights, got shape {w.shape}")
        enc = tc.encode(w, "palette", threads=threads)
        h, p = enc.header, enc.planes
        E, rows, cols = w.shape
        bpr = -(-cols // C.PAL_BLOCK)
        bpm = rows * bpr
        vpos = p[C.SUFFIX_VPOS].astype(np.int64)
        vexp = p[C.SUFFIX_VEXP].reshape(-1, C.PAL_BLOCK)
        bounds = np.searchsorted(vpos, np.arange(E + 1, dtype=np.int64) * bpm)
        width = int(np.diff(bounds).max()) if E else 0
        pos = np.empty((E, width), np.int64)
        exps = np.zeros((E, width, C.PAL_BLOCK), np.uint8)
        for e in range(E):
            own = vpos[bounds[e]:bounds[e + 1]] - e * bpm
            # Blocks that are not verbatim fill the list up to `width`: the first ones of the matrix.
            extra = np.setdiff1d(np.arange(min(bpm, width + len(own)), dtype=np.int64), own)[: width - len(own)]
            ids = np.concatenate([own, extra])
            order = np.argsort(ids, kind="stable")
            pos[e] = ids[order]
            ex = np.zeros((len(extra), C.PAL_BLOCK), np.uint8)
            for i, b in enumerate(extra):  # their exponents, from the weights (a row's last block may be short)
                r, c0 = divmod(int(b), bpr)
                seg = w[e, r, c0 * C.PAL_BLOCK:(c0 + 1) * C.PAL_BLOCK]
                ex[i, :len(seg)] = (seg >> 7) & 0xFF
            exps[e] = np.concatenate([vexp[bounds[e]:bounds[e + 1]], ex])[order]
        dev = torch.device(device)
        slots = cls(torch.from_numpy(p[C.SUFFIX_SM]).to(dev), torch.from_numpy(p[C.SUFFIX_IDX]).to(dev),
                   torch.from_numpy(pos).to(dev), torch.from_numpy(exps).to(dev),
                   [int(b) for b in h.palette[: h.pal_size]], int(h.rows_per_group), int(h.cols_per_chunk))
        # the bytes the padded entries hold (8 of block id, PAL_BLOCK of exponents each)
        slots.padding_bytes = (E * width - len(vpos)) * (8 + C.PAL_BLOCK)
        return slots

    def tensors(self) -> list:
        """The device tensors held (to register as module buffers)."""
        return [self.sm, self.idx, self.vpos, self.vexp]

    def held_bytes(self) -> int:
        return sum(int(t.numel() * t.element_size()) for t in self.tensors())

    @property
    def device(self) -> torch.device:
        return self.sm.device

    def slots_weight(self, ids: Tensor) -> EncodedWeight:
        """The experts ids [S] (an integer tensor on the stack's device) as one palette weight
        [S * rows, cols]: their planes gathered, their verbatim ids moved to their slot's rows.
        No host sync: S is the only size, and it comes from the shape of ids."""
        ids = ids.reshape(-1).to(torch.int64)
        S = ids.numel()
        if S * self.blocks > 0x7FFFFFFF:
            raise ValueError(f"{S} slots of {self.blocks} blocks exceed the uint32 block ids of one decode")
        sm = self.sm.index_select(0, ids).view(S * self.rows, self.cols)
        idx = self.idx.index_select(0, ids).view(S * self.rows, -1)
        base = torch.arange(S, device=ids.device, dtype=torch.int64).mul_(self.blocks).unsqueeze(1)
        vpos = (self.vpos.index_select(0, ids) + base).reshape(-1).to(torch.int32).view(torch.uint32)
        vexp = self.vexp.index_select(0, ids).reshape(-1, C.PAL_BLOCK)
        return EncodedWeight(C.ENC_PALETTE, S * self.rows, self.cols, self.grid[0], self.grid[1], 0, 0, self.palette,
                             sm, idx=idx, vpos=vpos, vexp=vexp)

    def decode(self, ids: Tensor, out: Tensor, policy=None) -> Tensor:
        """Experts ids [S] decoded into the first S * rows * cols words of `out` (bf16, the
        stack's device): the bf16 [S, rows, cols] view, slot s holding expert ids[s].  An id
        outside [0, E) is an error of index_select's.  policy: picks the decoder variant
        (runtime/policy.py; the same bits either way)."""
        S = ids.numel()
        w = dispatch.decode_into([self.slots_weight(ids)], out, S * self.rows, self.cols, policy)
        return w.view(S, self.rows, self.cols)
