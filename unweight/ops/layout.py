"""The device order of the palette planes: tile-major bytes (csrc/cuda/kernel_plan.h, "palette
plane order") and the paired palette order (csrc/cuda/pal_regs.cuh, pal_tables).

    tile_palette_planes(sm, idx) -> (sm_t, idx_t)
    untile_palette_planes(sm_t, idx_t) -> (sm, idx)
        sm uint8 [rows, cols] and idx uint8 [rows, cols / 2] in file order (docs/FORMAT.md) <->
        the same bytes cut into 16 x 64 tiles, [rows / 16][cols / 64][16][64] and
        [rows / 16][cols / 64][16][32], returned with the planes' [rows, cols] and
        [rows, cols / 2] shapes so that every shape check holds; any device (torch copies, no
        kernel).  Needs rows % 16 == 0 and cols % 64 == 0 (kernel_plan.pal_tiled_ok).

The palette kernels (decode_palette, palette_matmul, palette_gemv with ``tiled=True``) read a
tile-major weight as fast as their loads allow: a warp's 16-row step is one contiguous run of
DRAM instead of 16 runs a row length apart.  The file format does not change; a runtime may
hold a weight either way.

    palette_pairs(palette) -> bool
    paired_palette(palette) -> (palette, nibble_map) or None
    remap_index(idx, nibble_map) -> idx
    pair_index(palette, idx) -> (palette, nibble_map, idx) or None;  stored_index(idx, nibble_map) -> idx
        The CUDA palette decode looks an index up with byte permutes on register tables; it
        takes 8 operations per 4 weights when every entry k < 8 and its partner k + 8 have
        exponents of the same parity ("paired"), 11 otherwise.  The writer orders a palette by
        count (docs/FORMAT.md, "Palette choice"), which seldom pairs; a holder may reorder the
        palette and rewrite every index nibble to match (a bijection on 0..15 that keeps the
        nibbles >= pal_size where they are, so a corrupt nibble is still out of range) and get the
        same weights from fewer operations.  remap_index with the inverse map gives the file's
        bytes back.

    split_halves(palette) -> halves or None
    split_palette_planes(sm, idx, palette) -> (lo, codes)
        The split layout (kernel_plan.PGEMV_VARIANT_MMA_SPLIT): each weight's BF16 low byte
        (exponent bit 0, then the 7 mantissa bits) in place of its sign+mantissa byte, and in
        place of its index nibble a code c << 1 | sign, c the rank of the exponent's upper
        seven bits (e >> 1) among the palette's (split_halves).  A paired lookup of the code
        gives the BF16 high byte, so the decode skips the two bit-selects the stored layout's
        needs: 6 operations per 4 weights instead of 8.  It holds for palettes whose exponents
        fall in at most 8 halves (16 consecutive exponents starting at an even one).  Either
        plane order (file or tile-major); no file format change.

    verbatim_rows(vpos, rows, cols) -> vrow
        The row index of a verbatim list: vrow[r] (r <= rows) the count of entries whose block
        lies in a row before r, so row r's entries are vpos[vrow[r]:vrow[r + 1]].  The fused
        kernels (palette_matmul, palette_gemv, palette_gemv_queue, palette_gemv_slots) take it
        to find a warp's rows' first verbatim blocks in two dependent loads instead of a search
        of the whole list (~log16(nv) + 4 loads), before the warp's first multiply.  4 bytes per
        row beside the planes; built from vpos on its device by the holder, with no host sync.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..format import constants as C
from ..runtime import kernel_plan as plan

__all__ = ["tile_palette_planes", "untile_palette_planes", "palette_pairs", "paired_palette", "remap_index",
           "inverse_nibble_map", "pair_index", "stored_index", "split_halves", "split_palette_planes",
           "verbatim_rows"]

_R, _C = plan.PAL_TILE_ROWS, plan.PAL_TILE_COLS


def _shape(sm: Tensor, idx: Tensor) -> tuple[int, int]:
    if sm.dim() != 2 or idx.dim() != 2:
        raise ValueError("palette planes must be 2-D")
    rows, cols = sm.shape
    if not plan.pal_tiled_ok(rows, cols):
        raise ValueError(f"tile-major planes need rows % {_R} == 0 and cols % {_C} == 0, got {rows} x {cols}")
    if tuple(idx.shape) != (rows, cols // 2):
        raise ValueError(f"index plane must be [{rows}, {cols // 2}], got {tuple(idx.shape)}")
    return rows, cols


def _reorder(sm: Tensor, idx: Tensor, to_tiled: bool) -> tuple[Tensor, Tensor]:
    """Both planes between the orders: one transpose of the (row tile, row, column tile,
    column) axes, which swaps the middle two whichever way it goes."""
    rows, cols = _shape(sm, idx)

    def swap(p: Tensor, width: int) -> Tensor:  # width: a tile row's bytes in this plane
        mid = (_R, cols // _C) if to_tiled else (cols // _C, _R)
        return p.reshape(rows // _R, *mid, width).transpose(1, 2).contiguous().view(rows, p.size(1))
    return swap(sm, _C), swap(idx, _C // 2)


def tile_palette_planes(sm: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """File order -> tile-major (new tensors, same shapes and device)."""
    return _reorder(sm, idx, True)


def untile_palette_planes(sm: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Tile-major -> file order (new tensors, same shapes and device)."""
    return _reorder(sm, idx, False)


def palette_pairs(palette) -> bool:
    """Whether the CUDA decode's paired lookup applies to `palette` (a list of 1..16 exponents
    in index order): entries k and k + 8 of the same parity wherever both are used (pal_tables
    in csrc/cuda/pal_regs.cuh fills an unused partner with the matching parity)."""
    p = [int(e) for e in palette]
    return all((p[k] ^ p[k + 8]) & 1 == 0 for k in range(max(0, len(p) - 8)))


def paired_palette(palette) -> tuple[list[int], list[int]] | None:
    """The palette reordered so that palette_pairs holds, and the nibble map old index -> new
    index (16 entries; indices >= len(palette) map to themselves); None when the palette pairs
    already or no order of its entries pairs (16 entries of which an odd number are even).

    Entries k < n - 8 (n = len(palette)) need a same-parity partner at k + 8; entries
    n - 8 .. 7 stand alone.  Same-parity pairs are taken from the even entries, then the odd
    ones, each list in index order (the most frequent entries keep the low indices where they
    can)."""
    p = [int(e) for e in palette]
    n = len(p)
    if not 1 <= n <= 16:
        raise ValueError(f"a palette has 1..16 entries, got {n}")
    if palette_pairs(p):
        return None
    need = n - 8  # slots k, k + 8 both used
    ev = [i for i in range(n) if p[i] % 2 == 0]
    od = [i for i in range(n) if p[i] % 2 == 1]
    pe = min(len(ev) // 2, need)
    po = need - pe
    if 2 * po > len(od):
        return None
    pairs = [(ev[2 * j], ev[2 * j + 1]) for j in range(pe)] + [(od[2 * j], od[2 * j + 1]) for j in range(po)]
    alone = ev[2 * pe:] + od[2 * po:]
    slot = [0] * n  # old index -> new index
    for k, (a, b) in enumerate(pairs):
        slot[a], slot[b] = k, k + 8
    for k, a in enumerate(alone, start=need):
        slot[a] = k
    new = [0] * n
    for old, k in enumerate(slot):
        new[k] = p[old]
    nib = slot + list(range(n, 16))
    assert sorted(nib) == list(range(16)) and palette_pairs(new)
    return new, nib


def pair_index(palette, idx: Tensor) -> tuple[list[int], list[int], Tensor] | None:
    """(palette in paired order, its nibble map, a new index plane rewritten for it):
    paired_palette then remap_index; None where paired_palette gives None."""
    paired = paired_palette(palette)
    return None if paired is None else (*paired, remap_index(idx, paired[1]))


def stored_index(idx: Tensor, nibble_map) -> Tensor:
    """The index plane as stored, from one rewritten by `nibble_map` (a new tensor)."""
    return remap_index(idx, inverse_nibble_map(nibble_map))


def inverse_nibble_map(nibble_map) -> list[int]:
    """The map that undoes `nibble_map` (a permutation of 0..15)."""
    inv = [0] * 16
    for old, new in enumerate(nibble_map):
        inv[int(new)] = old
    return inv


# Index bytes rewritten per slice: bounds remap_index's temporaries (int64 indices) to
# 8 x this many bytes on the planes' device.
_REMAP_CHUNK = 1 << 24


def remap_index(idx: Tensor, nibble_map) -> Tensor:
    """A new index plane (uint8, idx's shape and device, any order of its bytes) with both
    nibbles of every byte mapped through `nibble_map` (16 entries, a permutation of 0..15)."""
    if idx.dtype != torch.uint8:
        raise ValueError(f"an index plane is uint8, got {idx.dtype}")
    nib = [int(v) for v in nibble_map]
    if sorted(nib) != list(range(16)):
        raise ValueError("a nibble map is a permutation of 0..15")
    lut = torch.tensor([nib[b & 15] | nib[b >> 4] << 4 for b in range(256)], dtype=torch.uint8, device=idx.device)
    flat = idx.contiguous().view(-1)
    out = torch.empty_like(flat)
    for a in range(0, flat.numel(), _REMAP_CHUNK):
        b = min(a + _REMAP_CHUNK, flat.numel())
        torch.index_select(lut, 0, flat[a:b].to(torch.int64), out=out[a:b])
    return out.view(idx.shape)


def split_halves(palette) -> list[int] | None:
    """The split layout's exponent halves: the distinct e >> 1 of the palette's entries in
    ascending order (a code's c indexes them), or None when there are more than
    kernel_plan.PAL_SPLIT_HALVES of them (the layout does not apply)."""
    h = sorted({int(e) >> 1 for e in palette})
    return h if 1 <= len(h) <= plan.PAL_SPLIT_HALVES else None


def split_palette_planes(sm: Tensor, idx: Tensor, palette) -> tuple[Tensor, Tensor]:
    """A palette weight's planes in the split layout: (lo uint8, sm's shape: BF16 low bytes;
    codes uint8, idx's shape: nibbles c << 1 | sign), new tensors on the planes' device, in the
    planes' order (file or tile-major: index byte i always holds the nibbles of sign+mantissa
    bytes 2i and 2i + 1).  A nibble past the palette (a verbatim weight's) takes entry 0's
    exponent bits, which the kernels' verbatim patch replaces; its sign and mantissa stay.
    Raises ValueError for a palette split_halves refuses."""
    halves = split_halves(palette)
    if halves is None:
        raise ValueError(f"the split layout needs at most {plan.PAL_SPLIT_HALVES} exponent halves (e >> 1), "
                         f"palette {list(palette)} has more")
    if sm.dtype != torch.uint8 or idx.dtype != torch.uint8 or sm.numel() != 2 * idx.numel():
        raise ValueError("split_palette_planes takes uint8 planes with two sign+mantissa bytes per index byte")
    pal = [int(e) for e in palette] + [int(palette[0])] * (16 - len(palette))
    code = [halves.index(e >> 1) << 1 for e in pal]  # (sign 0)
    e0 = [e & 1 for e in pal]
    dev = sm.device
    # Index byte b with the signs s0, s1 of its two weights -> their code byte; b -> the two
    # weights' low-byte bit 7, as one 16-bit word (byte 2i in its low half: little-endian).
    codes_lut = torch.tensor([(code[b & 15] | (k & 1)) | (code[b >> 4] | (k >> 1)) << 4
                              for k in range(4) for b in range(256)], dtype=torch.uint8, device=dev)
    e0_lut = torch.tensor([(e0[b & 15] << 7 | e0[b >> 4] << 15) - (1 << 16 if e0[b >> 4] else 0)
                           for b in range(256)], dtype=torch.int16, device=dev)
    flat_idx = idx.contiguous().view(-1)
    pairs = sm.contiguous().view(-1).view(torch.int16)  # weights 2i, 2i + 1 of index byte i
    lo = torch.empty_like(pairs)
    codes = torch.empty_like(flat_idx)
    for a in range(0, flat_idx.numel(), _REMAP_CHUNK):
        b = min(a + _REMAP_CHUNK, flat_idx.numel())
        ix = flat_idx[a:b].to(torch.int64)
        w = pairs[a:b]
        signs = ((w >> 7) & 1).to(torch.int64) | (((w >> 15) & 1) << 1).to(torch.int64)
        torch.index_select(codes_lut, 0, ix + (signs << 8), out=codes[a:b])
        lo[a:b] = (w & 0x7F7F) | torch.index_select(e0_lut, 0, ix)
    return lo.view(torch.uint8).view(sm.shape), codes.view(idx.shape)


def verbatim_rows(vpos: Tensor, rows: int, cols: int) -> Tensor:
    """The row index of a palette weight's verbatim list (see the module docstring).

    vpos: uint32 [nv] ascending block ids r * cdiv(cols, 32) + b of one [rows, cols] matrix, or
    [E, V] for a stack of E such matrices, each list ascending (runtime/expert_slots.py).
    Returns uint32 [rows + 1] (or [E, rows + 1], each row of offsets into its own list) on
    vpos's device; torch.searchsorted, no host sync, so a CUDA graph may capture it."""
    if vpos.dim() not in (1, 2):
        raise ValueError(f"verbatim_rows takes vpos [nv] or [E, V], got shape {tuple(vpos.shape)}")
    bpr = -(-int(cols) // C.PAL_BLOCK)
    keys = torch.arange(int(rows) + 1, dtype=torch.int64, device=vpos.device) * bpr
    v = vpos.to(torch.int64)
    if v.dim() == 2:
        keys = keys.expand(v.size(0), -1).contiguous()
    return torch.searchsorted(v, keys).to(torch.uint32)
