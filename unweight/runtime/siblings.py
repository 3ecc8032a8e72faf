"""Sibling projections run as one matmul: a Llama attention's q_proj, k_proj and v_proj, its
MLP's gate_proj and up_proj, a BERT attention's query, key and value.

Projections of one parent module that read the same input can run as one product over their
stacked rows: one launch where there were three (or two), over a larger matrix.  A fused
palette kernel pays a fixed cost per launch (its ramp and tail) that cuBLAS pays less of, and
streams a large matrix closer to the memory's bandwidth than a small one; the serving engines
hold such projections stacked for the same reason (vLLM's QKVParallelLinear and
MergedColumnParallelLinear).  transformers keeps them as separate nn.Linear modules, so
merge_siblings() stacks them after loading:

* The group's rows are decoded and re-encoded as one palette matrix under one palette (the
  16 most frequent exponents of the stacked rows; a block holding any other exponent is
  stored verbatim, as in every palette weight) and checked to decode to the same bits.
* The stacked planes are held once.  Each member's sm and idx buffers are views of its rows
  (tile-major planes are row-tile-major, so a member's rows are its own tile-major planes),
  with its own header, verbatim lists and the shared palette: every member stays a complete
  palette weight (its state_dict(), its forward alone), and no byte is held twice.  Its
  state_dict() is then that re-encoding (the same weights), not the checkpoint's bytes.
* A forward: the first member called computes the whole group (dispatch.linear_group) and
  keeps the others' outputs for their calls with the same input tensor (the same object at
  the same version); a call with any other input, with autograd tracking it, on a tensor made
  under torch.inference_mode (it keeps no version, so its reuse cannot be checked: use
  torch.no_grad, as transformers' generate does), or inside a torch.compile trace runs the
  member alone.  The outputs are column views of one [..., rows] result.
* A member whose planes changed after the merge (a state-dict load, .to(), a re-order) ends
  its group, checked at every forward; the members then run alone, each still correct.

The members' outputs equal their own forwards' where both take decode + GEMM (the decoded
rows multiply member by member); a fused kernel plans its K split for the stacked shape, so
its sums may round differently than on one member alone, within the same bound.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.errors import FormatError
from ..ops import layout as ops_layout
from ..ops import transcode
from . import dispatch, scratch
from . import kernel_plan as kp
from .modules import CompressedLinear
from .policy import resolve_plane_order
from .stacking import SIBLINGS
from .weights import EncodedWeight, hold_row_index

log = logging.getLogger("unweight")


__all__ = ["SIBLINGS", "SiblingGroup", "dissolve_all", "merge_siblings", "sibling_sets", "stack_gain",
           "stack_planes", "stack_tiled", "stack_weights"]


def sibling_sets(model: nn.Module) -> list:
    """[(parent name, [(child name, module)])] for every parent holding a whole set of SIBLINGS
    as CompressedLinear modules."""
    out = []
    for pname, parent in model.named_modules():
        for names in SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if all(isinstance(m, CompressedLinear) for m in mods):
                out.append((pname, list(zip(names, mods))))
    return out


def _why_not(mods: list) -> str | None:
    """Why these modules cannot be stacked (None: they can)."""
    if any(m.is_tied for m in mods):
        return "a member reads another module's planes"
    if any(m.encoding != C.ENC_PALETTE for m in mods):
        return "not every member is palette-encoded"
    if len({m.n_cols for m in mods}) != 1 or len({str(m.device) for m in mods}) != 1:
        return "the members differ in columns or device"
    if any(m.__dict__.get("_uw_group") is not None for m in mods):
        return "a member is in a group already"
    return None


class SiblingGroup:
    """The stacked palette weight of sibling CompressedLinear modules (see the module docstring).

    members: the modules in stacking order; w: the stacked EncodedWeight [sum of rows, cols]
    on their device, whose sm and idx the members' buffers are row views of."""

    def __init__(self, members: list, w: EncodedWeight):
        self.members = list(members)
        self.rows = [m.n_rows for m in members]
        self.w = w
        self._planes = [(m.weight__sm, m.weight__idx) for m in members]
        self._state = [(m._tiled, m._pal_map) for m in members]
        self._versions = (w.sm._version, w.idx._version)
        self._stash = None  # (input, its version, {member: output}) of the last group forward
        self.launched = False  # whether the last forward() ran the stack (not a stashed output)

    def intact(self) -> bool:
        """Whether every member still holds the planes the group was built on, unchanged."""
        if (self.w.sm._version, self.w.idx._version) != self._versions:
            return False
        for m, (sm, idx), st in zip(self.members, self._planes, self._state):
            if m.__dict__.get("_uw_group") is not self or m.weight__sm is not sm or m.weight__idx is not idx:
                return False
            if (m._tiled, m._pal_map) != st:
                return False
        return True

    def dissolve(self) -> None:
        """Let every member run alone (their planes stay valid; the stacked weight is dropped)."""
        for m in self.members:
            if m.__dict__.get("_uw_group") is self:
                del m.__dict__["_uw_group"]
        self._stash = None
        log.info("unweight: sibling group %s ended; its members run alone", self.w.name or len(self.members))

    def forward(self, member: CompressedLinear, x: Tensor) -> Tensor | None:
        """`member`'s output for x from the group's product, or None: the member runs alone."""
        self.launched = False
        if torch.compiler.is_compiling():
            return None  # a traced forward runs each member alone: its stash is Python state a graph can't keep
        if not self.intact():
            self.dissolve()
            return None
        if torch.is_grad_enabled() and x.requires_grad:
            return None
        try:
            ver = x._version
        except RuntimeError:  # an inference-mode tensor keeps no version: its reuse can't be checked
            return None
        st = self._stash
        if st is not None and st[0] is x and st[1] == ver and member in st[2]:
            y = st[2].pop(member)
            if not st[2]:
                self._stash = None
            return y
        outs = dispatch.linear_group(self.w, x, self.rows, [m.bias for m in self.members], member.policy)
        if outs is None:
            return None
        i = self.members.index(member)
        rest = {m: y for j, (m, y) in enumerate(zip(self.members, outs)) if j != i}
        self._stash = (x, ver, rest) if rest else None
        self.launched = True
        return outs[i]


def stack_planes(ws: list, policy=None) -> tuple:
    """The palette planes of encoded weights' rows stacked: (header, {suffix: tensor} on their
    device, [each weight decoded, bf16 [rows_i, cols]]).  ws: EncodedWeights of one cols on one
    device, any encoding and order; the result is in file order under the palette of the stacked
    rows (ops.transcode.encode_palette; its header's crc32 is 0: it is held in memory only) and
    decodes to the weights' bits, which is checked (FormatError otherwise)."""
    cols = ws[0].cols
    if any(w.cols != cols for w in ws) or len({str(w.device) for w in ws}) != 1:
        raise ValueError("stack_planes: weights of one column count on one device")
    parts = [dispatch.decode_new([w], w.rows, cols, policy) for w in ws]
    full = torch.cat(parts)
    hdr, planes = transcode.encode_palette(full, tc.choose_grid(full.size(0), cols))
    dev = ws[0].device
    planes = {s: t.to(dev) for s, t in planes.items()}
    got = dispatch.decode_new([EncodedWeight.from_header(hdr, planes)], hdr.rows, cols, policy)
    if not torch.equal(got.view(torch.int16), full.view(torch.int16)):
        raise FormatError(f"stacking {len(ws)} weights: the stacked planes do not decode to their rows")
    return hdr, planes, parts


def stack_weights(ws: list, policy=None) -> EncodedWeight:
    """One palette EncodedWeight of `ws`' rows stacked (stack_planes), file order, its palette
    as chosen: a vLLM merged projection's pieces as one matrix (paired and tiled by the caller)."""
    hdr, planes, _ = stack_planes(ws, policy)
    return EncodedWeight.from_header(hdr, planes, name="+".join(w.name for w in ws if w.name))


def stack_tiled(rows: list, cols: int, plane_order: str, policy, device) -> bool:
    """Whether a stack of [rows_i, cols] palette weights is held tile-major: every member whole
    16-row tiles and `plane_order` resolving so for the stack's shape
    (runtime.policy.resolve_plane_order: "auto" is the table's choice for it)."""
    n = sum(rows)
    can = kp.pal_tiled_ok(n, cols) and all(r % kp.PAL_TILE_ROWS == 0 for r in rows)
    return can and resolve_plane_order(plane_order, policy, n, cols, device) == "tiled"


def stack_gain(rows: list, cols: int, plane_order: str, policy, device) -> float | None:
    """DispatchPolicy.stack_gain of [rows_i, cols] palette weights at batch 1 (the decode step),
    in the plane order their stack would be held in; None without a policy."""
    if policy is None:
        return None
    return policy.stack_gain(rows, cols, device, stack_tiled(rows, cols, plane_order, policy, device))


def _stack_order(mods: list, plane_order: str) -> tuple[bool, bool]:
    """(tiled, paired): the orders a stack of `mods` is held in (stack_tiled; the paired palette
    on CUDA, the decode's cheaper lookup, the stored one on CPU, as prepare holds single modules)."""
    dev = mods[0].device
    return stack_tiled([m.n_rows for m in mods], mods[0].n_cols, plane_order, mods[0].policy, dev), dev.type == "cuda"


def _merge(mods: list, names: list, tiled: bool, paired: bool, state: dict | None = None) -> SiblingGroup:
    """Stack `mods` (checked by _why_not) into one palette weight held tile-major or not and
    with its palette paired or not; see the module docstring.  A failure before any member's
    planes are replaced leaves the members as they were and raises; state["replaced"] (when
    given) says whether the failure came later."""
    state = {} if state is None else state
    state["replaced"] = False
    before = [(m.plane_order, m.palette_order) for m in mods]
    for m in mods:  # build in file order and the stored palette order
        m.set_plane_order("file")
        m.set_palette_order("file")
    policy = mods[0].policy
    try:
        hdr, planes, orig = stack_planes([m.encoded() for m in mods], policy)
    except BaseException:
        for m, (po, pa) in zip(mods, before):
            m.set_plane_order(po)
            m.set_palette_order(pa)
        raise
    rows, cols = hdr.rows, hdr.cols
    dev = mods[0].device
    sm, idx, vexp = planes[C.SUFFIX_SM], planes[C.SUFFIX_IDX], planes[C.SUFFIX_VEXP]
    vpos = planes[C.SUFFIX_VPOS].cpu().numpy().astype(np.int64)
    bpr = kp.blocks_per_row(cols)
    r = 0
    state["replaced"] = True
    for m in mods:
        n = m.n_rows
        lo, hi = (int(i) for i in np.searchsorted(vpos, [r * bpr, (r + n) * bpr]))
        mh = dataclasses.replace(m.header, encoding=C.ENC_PALETTE, pal_size=hdr.pal_size, pal_block=hdr.pal_block,
                                 num_verbatim=hi - lo, palette=hdr.palette)
        m.replace_planes(mh, {C.SUFFIX_HDR: torch.from_numpy(mh.pack()).to(dev), C.SUFFIX_SM: sm[r:r + n],
                              C.SUFFIX_IDX: idx[r:r + n],
                              C.SUFFIX_VPOS: torch.from_numpy((vpos[lo:hi] - r * bpr).astype(np.uint32)).to(dev),
                              C.SUFFIX_VEXP: vexp[lo:hi]})
        r += n
    for m, o in zip(mods, orig):  # each member alone decodes to its own weight
        if not torch.equal(m.decode_weight().view(torch.int16), o.view(torch.int16)):
            raise FormatError(f"stacking siblings: a member's re-encoded rows do not decode to its weight "
                              f"({m.n_rows} x {cols})")
    palette = [int(b) for b in hdr.palette[: hdr.pal_size]]
    pal_map = None
    if tiled:
        st, it = ops_layout.tile_palette_planes(sm, idx)
        sm.copy_(st)
        idx.copy_(it)
    if paired:
        p = ops_layout.pair_index(palette, idx)
        if p is not None:
            idx.copy_(p[2])
            pal_map = p[:2]
    for m in mods:
        m._tiled, m._pal_map = tiled, pal_map
    ew = EncodedWeight(C.ENC_PALETTE, rows, cols, hdr.rows_per_group, hdr.cols_per_chunk, 0, 0,
                       palette if pal_map is None else pal_map[0], sm, idx=idx, vpos=planes[C.SUFFIX_VPOS],
                       vexp=vexp, name="+".join(names), tiled=tiled)
    hold_row_index(ew)
    g = SiblingGroup(mods, ew)
    for m in mods:
        m.__dict__["_uw_group"] = g
    scratch.reserve(dev, rows * cols)  # the group's decode + GEMM path decodes the whole stack
    return g


def merge_siblings(model: nn.Module, when: str = "always", plane_order: str = "auto") -> dict:
    """Stack the sets of sibling projections of `model` (after prepare(): palette modules with
    their policies).  when: "always" every set that can be, "auto" only where the members'
    policy measured the stack faster than the members apart at batch 1, the decode step
    (DispatchPolicy.stack_gain; never off CUDA or without measurements).  plane_order: the
    stack's plane order ("auto": the table's choice for the stacked shape).  Returns
    {"groups": [[names], ...], "skipped": {parent: reason}}."""
    if when not in ("always", "auto"):
        raise ValueError(f"merge_siblings when={when!r}: choose 'always' or 'auto'")
    done, skipped = [], {}
    for pname, members in sibling_sets(model):
        mods = [m for _, m in members]
        why = _why_not(mods)
        if why is None and when == "auto":
            gain = stack_gain([m.n_rows for m in mods], mods[0].n_cols, plane_order, mods[0].policy, mods[0].device)
            if gain is None or gain <= 1.0:
                why = ("the stack is not measured faster than its members" if gain is not None
                       else "no fused path measured faster for the stacked shape")
        if why is not None:
            skipped[pname] = why
            continue
        names = [f"{pname}.{n}" if pname else n for n, _ in members]
        tiled, paired = _stack_order(mods, plane_order)
        state = {}
        try:
            _merge(mods, names, tiled, paired, state)
        except (FormatError, RuntimeError, ValueError) as e:
            if when != "auto" or state.get("replaced"):
                raise  # asked for by name, or the members' planes were already replaced
            # "auto" is an optimisation the caller did not ask for by name: the members run alone
            log.warning("unweight: %s not stacked (%s)", ", ".join(names), e)
            skipped[pname] = f"stacking failed: {e}"
            continue
        done.append(names)
    if done:
        log.info("unweight: %d sibling groups stacked (%s, ...)", len(done), ", ".join(done[0]))
    return {"groups": done, "skipped": skipped}


def dissolve_all(model: nn.Module) -> int:
    """End every sibling group of `model` (prepare() starts from single modules); returns how
    many there were.  The members keep their planes: the stacked encoding of their rows."""
    groups = {id(g): g for _, m in model.named_modules() if (g := m.__dict__.get("_uw_group")) is not None}
    for g in groups.values():
        g.dissolve()
    return len(groups)
