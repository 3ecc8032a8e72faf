"""EncodedWeight: one encoded matrix as the ops take it (header ints + plane tensors).

A compressed nn.Module holds one (runtime/modules.py); a vLLM layer may hold several
stacked along rows (the q, k, v pieces of a merged qkv projection).  Dispatch
(runtime/dispatch.py) works on lists of them, so transformers and vLLM share every decode,
gather and matmul path.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..format import constants as C
from ..format.header import TensorHeader
from ..ops import layout as ops_layout


class EncodedWeight:
    """Plain record of an encoded [rows, cols] bf16 matrix on one device.

    encoding: C.ENC_HUFFMAN | C.ENC_PALETTE; rows, cols; rows_per_group, cols_per_chunk (the
    segment grid); exp_lo, exp_hi (Huffman symbol range); palette: list of 1..16 exponent
    bytes (palette); planes (uint8/uint32 tensors, same device):
        huffman: sm [rows, cols], exp [stream bytes], off [n_seg + 1], table [4, exp_hi-exp_lo+1],
                 lut [4, 4096] uint16 on CUDA (empty on CPU)
        palette: sm [rows, cols], idx [rows, ceil(cols/2)], vpos [nv], vexp [nv, PAL_BLOCK]
    chk: the Huffman checkpoint index uint16 [n_seg, P] and chk_interval its S (None and 0
    without one; FORMAT.md "Checkpoint index").  vrow: the verbatim list's row index (uint32
    [rows + 1], ops.verbatim_rows; hold_row_index), which the fused CUDA kernels take in place
    of a search of vpos, or None.  Unused planes are None.  tiled: a palette
    weight's sm and idx hold their bytes tile-major (ops/layout.py), which every palette op
    is told; False (file order) unless the holder permuted them.  in_stack: a matrix of a
    stored 3-D stack (views of its planes, its verbatim list rebased from the stack's:
    runtime/experts.py), which the fused kernels' self-test checks apart (runtime/selftest.py).
    """

    __slots__ = ("encoding", "rows", "cols", "rows_per_group", "cols_per_chunk", "exp_lo", "exp_hi", "palette",
                 "sm", "exp", "off", "table", "lut", "idx", "vpos", "vexp", "name", "chk", "chk_interval", "tiled",
                 "vrow", "in_stack")

    def __init__(self, encoding: int, rows: int, cols: int, rows_per_group: int, cols_per_chunk: int, exp_lo: int,
                 exp_hi: int, palette: list, sm: Tensor, exp: Tensor | None = None, off: Tensor | None = None,
                 table: Tensor | None = None, lut: Tensor | None = None, idx: Tensor | None = None,
                 vpos: Tensor | None = None, vexp: Tensor | None = None, name: str = "",
                 chk: Tensor | None = None, chk_interval: int = 0, tiled: bool = False, vrow: Tensor | None = None,
                 in_stack: bool = False):
        self.encoding, self.rows, self.cols = encoding, rows, cols
        self.rows_per_group, self.cols_per_chunk = rows_per_group, cols_per_chunk
        self.exp_lo, self.exp_hi, self.palette = exp_lo, exp_hi, palette
        self.sm, self.exp, self.off, self.table, self.lut = sm, exp, off, table, lut
        self.idx, self.vpos, self.vexp = idx, vpos, vexp
        self.name = name
        self.chk, self.chk_interval = (chk, int(chk_interval)) if chk is not None and chk_interval else (None, 0)
        self.tiled = bool(tiled)
        self.vrow = vrow
        self.in_stack = bool(in_stack)

    @classmethod
    def from_header(cls, header: TensorHeader, planes: dict, table: Tensor | None = None, lut: Tensor | None = None,
                    name: str = "") -> "EncodedWeight":
        """From a parsed header and {suffix: tensor} planes (table: the code lengths as a tensor
        on the planes' device, for Huffman)."""
        return cls(int(header.encoding), int(header.rows), int(header.cols), int(header.rows_per_group),
                   int(header.cols_per_chunk), int(header.exp_lo), int(header.exp_hi),
                   [int(b) for b in header.palette[: header.pal_size]], planes[C.SUFFIX_SM],
                   exp=planes.get(C.SUFFIX_EXP), off=planes.get(C.SUFFIX_OFF), table=table, lut=lut,
                   idx=planes.get(C.SUFFIX_IDX), vpos=planes.get(C.SUFFIX_VPOS), vexp=planes.get(C.SUFFIX_VEXP),
                   name=name, chk=planes.get(C.SUFFIX_CHK), chk_interval=int(header.chk_interval))

    @property
    def is_huffman(self) -> bool:
        return self.encoding == C.ENC_HUFFMAN

    @property
    def encoding_name(self) -> str:
        return "huffman" if self.is_huffman else "palette"

    @property
    def device(self):
        return self.sm.device


def device_planes(planes: dict, device) -> dict:
    """{suffix: tensor on `device`} of host planes ({suffix: NumPy array})."""
    return {s: torch.from_numpy(np.ascontiguousarray(a)).to(device) for s, a in planes.items()}


def code_table(header: TensorHeader, device) -> Tensor:
    """A huffman header's code lengths uint8 [4, exp_hi-exp_lo+1] on `device` (the decode ops' table)."""
    return torch.from_numpy(np.ascontiguousarray(header.table, dtype=np.uint8)).to(device)


def hold_paired(w: EncodedWeight) -> EncodedWeight:
    """`w` with its palette in paired order and idx rewritten to match, in place on its device
    (ops.paired_palette: the CUDA palette decode's cheaper lookup; the same weights); a huffman
    weight, or a palette that pairs as stored or cannot pair, as it is."""
    if w.is_huffman or w.idx is None:
        return w
    paired = ops_layout.pair_index(w.palette, w.idx)
    if paired is not None:
        w.palette, _, w.idx = paired
    return w


def hold_row_index(w: EncodedWeight) -> EncodedWeight:
    """`w` with the row index of its verbatim list (w.vrow, ops.verbatim_rows) built on its
    device, for a palette weight on CUDA with verbatim blocks; any other weight as it is.  Call
    it once the holder's vpos is final: the index describes that list and nothing checks it
    against a later one."""
    if w.is_huffman or w.vpos is None or w.vpos.numel() == 0 or w.device.type != "cuda":
        return w
    w.vrow = ops_layout.verbatim_rows(w.vpos, w.rows, w.cols)
    return w
