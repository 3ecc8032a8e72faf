"""Mixture-of-experts weights kept compressed: a layer decodes only the experts its router
picked for the current tokens, one at a time, into the per-device scratch.

transformers keeps a layer's experts as 3-D parameters of an experts module (``gate_up_proj``
[E, 2I, H] and ``down_proj`` [E, H, I] for Qwen3-MoE, Mixtral and DeepSeek-V3; [E, H, 2I] and
[E, I, H] for Llama 4 and gpt-oss).  A checkpoint holds them either as

* per-expert 2-D tensors (``mlp.experts.3.gate_proj.weight``, ``block_sparse_moe.experts.3.w1
  .weight``) that transformers' own conversion mapping fuses at load: ``MergeModulelist(dim=0)``
  stacks the experts and, for several source patterns, ``Concatenate(dim=1)`` stacks their
  pieces along rows, so expert e of the fused parameter is the pieces of expert e one under
  the other, in source-pattern order; or
* one stacked 3-D tensor (format 1.1, FORMAT.md "Stacked tensors"): expert e is matrix e.

:func:`install` (called by runtime/convert.py on the meta model) replaces such a parameter by
an :class:`ExpertStack`, a stand-in whose ``[e]`` decodes expert e through
runtime.dispatch.decode_into.  The names come from transformers' mapping of this model, so
there is no per-architecture table here.  The planes stay buffers named as the checkpoint's
(renamed) keys, so transformers' loader fills them without a conversion: a per-expert piece
``...experts.3.gate_proj.weight`` gets the buffers ``weight__hdr``, ``weight__sm``, ... of a
small holder module at ``...experts.3.gate_proj``; a stack gets ``gate_up_proj__hdr``, ... on
the experts module itself.

The model's own experts modules run.  Their forward is transformers' experts implementation
(``use_experts_implementation``); the default ones ("grouped_mm", "batched_mm") take every
expert's weight at once, so while the experts stay compressed runtime/prepare.py selects
:func:`routed_experts_forward`, registered as the implementation "unweight": it computes what
"batched_mm" computes, with the same operations in the same order (per-sample projections,
then the fp32 sum over the top-k), so the logits are bitwise those of the default load, but
it takes the weights one routed expert at a time through ``self.gate_up_proj[e]`` (or, where
the dispatch policy measured a fused kernel faster for an expert's shape and batch on the GPU,
runs that kernel on the expert's compressed planes: ``ExpertStack.fused_linear``).  (The
"eager" loop also indexes one expert at a time, but sums the top-k in the hidden dtype,
which for fp32 routing weights, Mixtral's and DeepSeek-V3's, rounds differently from the
default implementations; a model loaded with "eager" keeps it.)  A forward that multiplies the
whole stack, as Llama 4's does
(``torch.bmm(x, self.gate_up_proj)`` with zero input rows for the experts a token was not
routed to), reaches ``__torch_function__``, which decodes only the experts with a non-zero
input: the zero rows of the others give zero outputs, as the full product does.  Whatever
else a forward does with the stand-in gets the whole decoded tensor: correct, not routed.

Contract of ``[e]``: the returned bf16 [rows, cols] tensor is a view of scratch that stays
valid until the same parameter of any layer is indexed again (transformers' loops use it at
once).  Each parameter of an experts module has its own slot in the scratch.  With autograd
on (``torch.is_grad_enabled()``) it is a tensor of its own instead, which a backward can
read after later layers have run.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.errors import FormatError, InputError
from ..format.header import TensorHeader
from ..ops import layout as ops_layout
from . import dispatch, scratch
from .modules import LazyTensor, _ShapeOnly, refuse_dtype_cast
from .policy import DECODE_CUBLAS
from .weights import EncodedWeight

log = logging.getLogger(__name__)

__all__ = ["ROUTED", "ExpertStack", "Fusion", "PlaneHolder", "expert_stacks", "hf_renamer", "install_fused",
           "install_stack", "prepare_planes", "hold_paired", "routed_experts_forward", "to_dense", "transcode",
           "use_routed_forward", "stack_row_index"]


# ----------------------------------------------------------------------------- names


@dataclass(frozen=True)
class Fusion:
    """Where a per-expert checkpoint tensor goes in a fused 3-D parameter: expert `expert`,
    piece `source` (of `n_sources`, stacked along rows in this order) of parameter `target`
    (the name transformers' converter gives it).  `ops` names the converter's operations;
    `supported` is False when expert e of the result is not simply the pieces of expert e
    (a transpose, an interleave...), which compressed experts cannot follow."""

    target: str
    source: int
    n_sources: int
    expert: int
    ops: str = ""
    supported: bool = True


def _supported_ops(conv) -> bool:
    """The converter fuses by stacking experts (and concatenating pieces along rows): the
    only fusions whose expert e is its pieces of expert e, whole and in order."""
    names = [(type(op).__name__, getattr(op, "dim", None)) for op in conv.operations]
    if names == [("MergeModulelist", 0)]:
        return len(conv.source_patterns) == 1
    return names == [("MergeModulelist", 0), ("Concatenate", 1)]


_BRANCH_SPLIT = re.compile(r"\|(?=\(\?P<g\d+>)")


def whole_names(transforms: list) -> list:
    """Make each of transformers' weight transforms match a source pattern ending in a name
    character only where that name ends, as transformers does itself from 5.21 on (``(?!\\w)``).

    Earlier 5.x releases search the pattern anywhere in a key, so ``experts.*.down_proj.weight``
    also matched the plane keys ``experts.0.down_proj.weight__hdr`` and fused them (or made
    them unloadable); the planes must pass through under their own names.  Works on the
    compiled alternation ``(?P<g0>...)|(?P<g1>...)`` the transforms build, in place;
    idempotent.  Returns ``transforms``."""
    for t in transforms:
        rx = getattr(t, "compiled_sources", None)
        if not isinstance(rx, re.Pattern):
            continue
        branches = _BRANCH_SPLIT.split(rx.pattern)
        fixed = [b[:-1] + r"(?!\w))" if re.search(r"[A-Za-z0-9]\)$", b) else b for b in branches]
        if fixed != branches:
            object.__setattr__(t, "compiled_sources", re.compile("|".join(fixed), rx.flags))
    return transforms


def hf_renamer(model: nn.Module):
    """name -> (renamed name, Fusion or None): what transformers' loader does to a checkpoint
    key of `model` (its renamings, then at most one converter), from transformers' own
    conversion mapping for this model.  Identity for models transformers has no mapping for."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:
        return lambda name: (name, None)
    if not hasattr(model, "config") or not hasattr(model, "base_model_prefix"):
        return lambda name: (name, None)
    transforms = whole_names(get_model_conversion_mapping(model) or [])
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    star = {}

    def expert_of(pattern: str, key: str) -> int | None:
        rx = star.get(pattern)
        if rx is None:
            rx = star[pattern] = re.compile(re.escape(pattern).replace(r"\*", r"(\d+)"))
        m = rx.search(key)
        return int(m.group(1)) if m and m.groups() else None

    def rename(name: str):
        key = name
        for r in renamings:
            key, _ = r.rename_source_key(key)
        for conv in converters:
            new, pat = conv.rename_source_key(key)
            if pat is None:
                continue
            e = expert_of(pat, key)
            ops = ", ".join(type(op).__name__ for op in conv.operations)
            return new, Fusion(new, conv.source_patterns.index(pat), len(conv.source_patterns), -1 if e is None else e,
                               ops, _supported_ops(conv) and e is not None)
        return key, None

    return rename


# ----------------------------------------------------------------------------- planes


class PlaneHolder(nn.Module):
    """Holds the plane buffers of encoded tensors (``<attr>__hdr``, ``<attr>__sm``, ...) at the
    module path where the checkpoint's keys put them; also the empty containers on the way
    (``experts.3`` of ``experts.3.gate_proj``)."""

    def extra_repr(self) -> str:
        return ", ".join(n for n, _ in self.named_buffers(recurse=False))

    def _apply(self, fn, recurse=True):
        refuse_dtype_cast(fn)  # the stacks it holds decode to bfloat16 (modules.refuse_dtype_cast)
        return super()._apply(fn, recurse)


def ensure_holder(model: nn.Module, path: str) -> tuple[nn.Module, list]:
    """The module at `path`, creating PlaneHolders for the missing parts; returns it and the
    names of the modules created (so dense mode can remove them again)."""
    mod, created, done = model, [], []
    for part in path.split(".") if path else []:
        child = mod._modules.get(part)
        if child is None:
            if hasattr(mod, part):
                raise InputError(f"unweight: cannot place planes at {path!r}: {'.'.join(done + [part])} is not a "
                                 f"module")
            child = PlaneHolder()
            mod.add_module(part, child)
            created.append(".".join(done + [part]))
        mod = child
        done.append(part)
    return mod, created


def register_planes(mod: nn.Module, attr: str, shapes: dict) -> None:
    """Empty (meta) plane buffers {suffix: (shape, dtype)} named attr + suffix on mod."""
    for suf, (shape, dt) in shapes.items():
        mod.register_buffer(attr + suf, torch.empty(shape, dtype=dt, device="meta"), persistent=True)


class _Planes:
    """One encoded tensor whose planes are buffers ``attr + suffix`` of `module`: a 2-D
    piece (one expert's part) or a stack (every expert)."""

    __slots__ = ("attr", "header", "module", "suffixes", "vranges")

    def __init__(self, module: nn.Module, attr: str, header: TensorHeader):
        self.module, self.attr = module, attr
        self.set_header(header)

    def set_header(self, header: TensorHeader):
        self.header = header
        self.suffixes = tc.planes_for(header)
        self.vranges = None  # palette stacks: per-matrix verbatim ranges, set by prepare_planes

    def plane(self, suf: str) -> Tensor:
        return getattr(self.module, self.attr + suf)

    def planes(self) -> dict:
        return {suf: self.plane(suf) for suf in self.suffixes}

    def host_planes(self) -> dict:
        """{suffix: NumPy array} of the planes as stored (a paired palette's index put back),
        on the host (copied from a device)."""
        planes, cur = self.planes(), self.paired()
        if cur is not None:
            planes = {**planes, C.SUFFIX_IDX: ops_layout.stored_index(planes[C.SUFFIX_IDX], cur[1])}
        return {suf: t.detach().cpu().numpy() for suf, t in planes.items()}

    @property
    def device(self) -> torch.device:
        return self.plane(C.SUFFIX_SM).device

    def held_bytes(self) -> int:
        return sum(int(t.numel() * t.element_size()) for t in self.planes().values())

    def code_table(self) -> Tensor:
        """A huffman tensor's code lengths uint8 [4, exp_hi-exp_lo+1]: a view into its header plane."""
        return self.plane(C.SUFFIX_HDR)[C.HEADER_BYTES:].view(C.HUFF_NUM_CTX, -1)

    def lut(self) -> Tensor:
        t = getattr(self.module, self.attr + "_lut", None)
        return t if t is not None else torch.empty(0, dtype=torch.uint16, device=self.device)

    def weight(self, e: int | None = None) -> EncodedWeight:
        """The piece (e None) or matrix e of the stack as the ops take it."""
        h = self.header
        sm = self.plane(C.SUFFIX_SM)
        if h.encoding == C.ENC_HUFFMAN:
            off = self.plane(C.SUFFIX_OFF)
            if e is not None:
                s0, s1 = tc.matrix_segments(h, e)
                off = off[s0:s1 + 1]  # absolute offsets into the shared stream (FORMAT.md)
                sm = sm[e]
            chk = self.plane(C.SUFFIX_CHK) if h.chk_interval else None
            if chk is not None and e is not None:
                chk = chk[s0:s1]  # matrix e's segments' rows; checkpoints count from each segment's start
            table = self.code_table()
            return EncodedWeight(C.ENC_HUFFMAN, h.rows, h.cols, h.rows_per_group, h.cols_per_chunk, h.exp_lo,
                                 h.exp_hi, [], sm, exp=self.plane(C.SUFFIX_EXP), off=off, table=table,
                                 lut=self.lut(), chk=chk, chk_interval=h.chk_interval)
        idx, vpos, vexp = self.plane(C.SUFFIX_IDX), self.plane(C.SUFFIX_VPOS), self.plane(C.SUFFIX_VEXP)
        if e is not None:
            # The ops take a matrix's own block ids: matrix e's, rebased at load (prepare_planes)
            # or here, on the first decode of a stack no mode prepared (dense decodes it once).
            if self.vranges is None:
                self.rebase_verbatim()
            v0, v1 = self.vranges[e]
            sm, idx = sm[e], idx[e]
            vpos, vexp = getattr(self.module, self.attr + "_vpos_local")[v0:v1], vexp[v0:v1]
            vrow = getattr(self.module, self.attr + "_vrow_local", None)
            vrow = vrow[e] if vrow is not None and vrow.device == vpos.device else None
        else:
            vrow = None
        paired = self.paired()
        pal = [int(b) for b in h.palette[: h.pal_size]] if paired is None else list(paired[0])
        return EncodedWeight(C.ENC_PALETTE, h.rows, h.cols, h.rows_per_group, h.cols_per_chunk, 0, 0, pal, sm,
                             idx=idx, vpos=vpos, vexp=vexp, vrow=vrow, in_stack=e is not None)

    def paired(self) -> tuple | None:
        """(palette, nibble map) when idx holds the paired palette order (hold_paired), else None."""
        return getattr(self.module, "_uw_paired", {}).get(self.attr)

    def set_paired(self, want: bool) -> bool:
        """Hold a palette tensor's palette in paired order (ops.paired_palette: every index
        nibble rewritten in place, the weights unchanged) or as stored; True when it changed.
        The holding module's state_dict() gives the stored bytes either way, and a state-dict
        load of this tensor's planes puts it back as stored (hooks on the module)."""
        cur = self.paired()
        if self.header.encoding != C.ENC_PALETTE or want == (cur is not None):
            return False
        idx = self.plane(C.SUFFIX_IDX).data
        if not want:
            idx.copy_(ops_layout.stored_index(idx, cur[1]))
            del self.module._uw_paired[self.attr]
            return True
        new = ops_layout.pair_index([int(b) for b in self.header.palette[: self.header.pal_size]], idx)
        if new is None:
            return False
        idx.copy_(new[2])
        if not hasattr(self.module, "_uw_paired"):
            self.module._uw_paired = {}
            self.module._register_state_dict_hook(_stored_index_state_dict)
            self.module._register_load_state_dict_pre_hook(_loading_stored_index, with_module=True)
        self.module._uw_paired[self.attr] = new[:2]
        return True

    def rebase_verbatim(self) -> None:
        """Palette stack: each matrix's range of the verbatim lists, and the block ids rebased
        to the matrix (buffer ``attr + "_vpos_local"``, uint32, on the planes' device); on CUDA
        also each matrix's row index into its own range (buffer ``attr + "_vrow_local"``, uint32
        [stack, rows + 1]: ops.verbatim_rows of each matrix's list, the fused kernels' cursors)."""
        h = self.header
        bpr = -(-h.cols // C.PAL_BLOCK)
        per = h.rows * bpr  # blocks of one matrix
        vpos = self.plane(C.SUFFIX_VPOS).to(torch.int64)
        bounds = torch.searchsorted(vpos.cpu(), torch.arange(h.stack + 1, dtype=torch.int64) * per).tolist()
        local = (vpos - (vpos // per) * per).to(torch.uint32)
        self.module.register_buffer(self.attr + "_vpos_local", local, persistent=False)
        self.vranges = [(bounds[e], bounds[e + 1]) for e in range(h.stack)]
        if vpos.device.type == "cuda" and vpos.numel():
            self.module.register_buffer(self.attr + "_vrow_local", stack_row_index(vpos, h.stack, h.rows, h.cols),
                                        persistent=False)
        elif hasattr(self.module, self.attr + "_vrow_local"):  # (an index of planes this stack no longer holds)
            delattr(self.module, self.attr + "_vrow_local")

    def check_loaded(self, where: str) -> None:
        """After loading: the header plane parses, agrees with the checkpoint's, and fits the planes."""
        h = TensorHeader.parse(self.plane(C.SUFFIX_HDR).detach().cpu().numpy(), where)
        if (h.shape, h.encoding) != (self.header.shape, self.header.encoding):
            raise FormatError(f"loaded header of {where} differs from the checkpoint's")
        tc.check_planes(h, {s: _ShapeOnly(t) for s, t in self.planes().items()}, where)
        self.set_header(h)

    def replace(self, header: TensorHeader, planes: dict) -> None:
        """Swap in another encoding of the same tensor (a transcode at load)."""
        getattr(self.module, "_uw_paired", {}).pop(self.attr, None)  # the new planes are as stored
        dev = self.device
        for suf in self.suffixes:
            delattr(self.module, self.attr + suf)
        for suf in tc.planes_for(header):
            a = planes[suf]
            t = a if isinstance(a, Tensor) else torch.from_numpy(a.copy() if not a.flags.writeable else a)
            self.module.register_buffer(self.attr + suf, t.to(dev), persistent=True)
        self.set_header(header)

    def remove(self) -> None:
        getattr(self.module, "_uw_paired", {}).pop(self.attr, None)
        for suf in self.suffixes:
            delattr(self.module, self.attr + suf)
        for extra in ("_lut", "_vpos_local", "_vrow_local"):
            if hasattr(self.module, self.attr + extra):
                delattr(self.module, self.attr + extra)


def stack_row_index(vpos: Tensor, stack: int, rows: int, cols: int) -> Tensor:
    """Each matrix's verbatim row index into its own range of a palette stack's list: uint32
    [stack, rows + 1], row e being ops.verbatim_rows of matrix e's entries (block ids rebased to
    the matrix).  vpos: the stack's ascending block ids (any integer dtype) over `stack`
    matrices [rows, cols], on any device; one search of the whole list, no host sync."""
    bpr = -(-cols // C.PAL_BLOCK)
    v = vpos.to(torch.int64)
    # matrix e's row r starts at the stack's block e * rows * bpr + r * bpr
    keys = (torch.arange(stack, dtype=torch.int64, device=v.device)[:, None] * (rows * bpr)
            + torch.arange(rows + 1, dtype=torch.int64, device=v.device)[None, :] * bpr)
    first = torch.searchsorted(v, keys.reshape(-1)).view(stack, rows + 1)
    return (first - first[:, :1]).to(torch.uint32)


def _stored_index_state_dict(module, state_dict, prefix, local_metadata):
    """state_dict() hook of a module holding paired palette tensors: the stored index bytes."""
    for attr, (_, nib) in getattr(module, "_uw_paired", {}).items():
        key = prefix + attr + C.SUFFIX_IDX
        if key in state_dict:
            state_dict[key] = ops_layout.stored_index(state_dict[key], nib)
    return state_dict


def _loading_stored_index(module, state_dict, prefix, *args):
    """load_state_dict() pre-hook: a tensor whose index the load writes holds the stored order."""
    for attr in [a for a in getattr(module, "_uw_paired", {}) if prefix + a + C.SUFFIX_IDX in state_dict]:
        del module._uw_paired[attr]


# ----------------------------------------------------------------------------- the stand-in


def _as_index(idx) -> int | None:
    """A Python int for an int / 0-d or one-element integer tensor index, else None."""
    if isinstance(idx, bool):
        return None
    if isinstance(idx, int):
        return idx
    if isinstance(idx, Tensor) and idx.numel() == 1 and not idx.is_floating_point() and idx.dtype != torch.bool:
        return int(idx.reshape(()).item())
    return None


class ExpertStack(LazyTensor):
    """Stand-in for a 3-D experts parameter [E, rows, cols] whose experts stay compressed.

    ``stack[e]`` (e an int or a one-element integer tensor, on any device): expert e decoded
    into this parameter's scratch slot, a `dtype` [rows, cols] tensor on the planes' device
    (see the module docstring for how long it stays valid).  ``torch.bmm(x, stack)`` /
    ``x @ stack`` with x [E, T, rows] on the same device: the product, decoding only experts
    whose rows of x are not all zero.  Other indexing, torch functions and tensor methods get
    the whole decoded tensor (``materialize``).
    """

    def __init__(self, name: str, shape, dtype: torch.dtype, sources: list):
        """sources: one entry per piece (row order): a list of E 2-D _Planes (per-expert
        checkpoint tensors) or one stacked _Planes."""
        self.name = name
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.sources = sources
        self.slot = 0  # offset of this parameter's region in the device scratch (prepare sets it)
        self.policy = None  # picks the CUDA decoder variant per expert shape (prepare sets it)

    # ---------------------------------------------------------------- structure
    def planes(self) -> list:
        """Every _Planes of the stack (each piece of each expert, or the one stack)."""
        out = []
        for src in self.sources:
            out.extend(src if isinstance(src, list) else [src])
        return out

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def rows(self) -> int:
        return self.shape[1]

    @property
    def cols(self) -> int:
        return self.shape[2]

    @property
    def device(self) -> torch.device:
        return self.planes()[0].device

    def held_bytes(self) -> int:
        return sum(p.held_bytes() for p in self.planes())

    def decoded_bytes(self) -> int:
        return self.numel() * 2

    def encodings(self) -> set:
        return {p.header.encoding_name for p in self.planes()}

    def __repr__(self) -> str:
        return (f"ExpertStack({self.name}, shape={list(self.shape)}, "
                f"encoding={'/'.join(sorted(self.encodings()))}, held={self.held_bytes()} bytes)")

    # ---------------------------------------------------------------- decoding
    def pieces(self, e: int) -> list:
        """Expert e as EncodedWeight pieces stacked along rows."""
        return [src[e].weight() if isinstance(src, list) else src.weight(e) for src in self.sources]

    def decode_expert(self, e: int, out: Tensor) -> Tensor:
        """Decode expert e into the flat bf16 buffer `out` (>= rows * cols words, the planes'
        device); returns the bf16 [rows, cols] view.  The single place experts are decoded."""
        return dispatch.decode_into(self.pieces(e), out, self.rows, self.cols, self.policy)

    def _expert(self, e: int) -> Tensor:
        if not -self.num_experts <= e < self.num_experts:
            raise IndexError(f"expert {e} out of range for {self.name} with {self.num_experts} experts")
        e %= self.num_experts
        n = self.rows * self.cols
        if torch.is_grad_enabled():
            # Autograd may save the weight for a backward, after the next layer has overwritten
            # the scratch slot: a tensor of its own (freed with the graph, or at once when
            # nothing needs it).
            buf = torch.empty(n, dtype=torch.bfloat16, device=self.device)
        else:
            buf = scratch.weights(self.device, self.slot + n)[self.slot:self.slot + n]
        w = self.decode_expert(e, buf)
        return w if self.dtype == torch.bfloat16 else w.to(self.dtype)

    def materialize(self, experts=None) -> Tensor:
        """A new `dtype` tensor [len(experts), rows, cols] of the given experts decoded (all
        when None), on the planes' device."""
        ids = range(self.num_experts) if experts is None else list(experts)
        out = torch.empty((len(ids), self.rows, self.cols), dtype=torch.bfloat16, device=self.device)
        for i, e in enumerate(ids):
            self.decode_expert(int(e), out[i].view(-1))
        return out if self.dtype == torch.bfloat16 else out.to(self.dtype)

    def fused_linear(self, e: int, x: Tensor) -> Tensor | None:
        """x @ W_e^T, bf16 [T, rows], for a bf16 x [T, cols] on the planes' device, through the
        fused kernels where the policy picks one for a piece of expert e's shape at this batch
        (dispatch.linear: those pieces run the kernel, the others decode + GEMM; the measured
        policy picks one only on CUDA, where it was timed faster); None where it picks none, for
        a non-bf16 stack, or when autograd tracks x: the caller then decodes the expert
        (``stack[e]``) and multiplies, as without a policy."""
        pol = self.policy
        if (pol is None or x.dtype != torch.bfloat16 or self.dtype != torch.bfloat16 or x.dim() != 2
                or x.shape[-1] != self.cols or (torch.is_grad_enabled() and x.requires_grad)):
            return None
        if not -self.num_experts <= e < self.num_experts:
            raise IndexError(f"expert {e} out of range for {self.name} with {self.num_experts} experts")
        pieces = self.pieces(e % self.num_experts)
        if all(pol.linear_path(p, x.shape[0], x.device) == DECODE_CUBLAS for p in pieces):
            return None
        return dispatch.linear(pieces, x, None, self.rows, self.cols, pol)

    def __getitem__(self, idx):
        e = _as_index(idx)
        if e is not None:
            return self._expert(e)
        if isinstance(idx, Tensor) and not idx.is_floating_point() and idx.dtype != torch.bool:
            # A batch of expert ids (the "batched_mm" experts forward): decode each distinct one.
            uniq, inv = torch.unique(idx.reshape(-1), return_inverse=True)
            return self.materialize(uniq.tolist())[inv.to(self.device)].view(*idx.shape, self.rows, self.cols)
        log.debug("unweight: %s indexed with %r: decoding every expert", self.name, type(idx).__name__)
        return self.materialize()[idx]

    def routed_bmm(self, x: Tensor) -> Tensor:
        """torch.bmm(x, W) for x [E, T, rows]: experts whose rows of x are all zero give zero
        rows without being decoded (their products are zero), the others decode one by one."""
        E, T = x.shape[0], x.shape[1]
        if E != self.num_experts or x.shape[2] != self.rows:
            raise RuntimeError(f"bmm of {tuple(x.shape)} with {self.name} {tuple(self.shape)}: shapes do not match")
        out = torch.zeros((E, T, self.cols), dtype=torch.promote_types(x.dtype, self.dtype), device=x.device)
        hit = (x.reshape(E, -1) != 0).any(dim=1).nonzero().reshape(-1).tolist()
        if torch.is_grad_enabled() and x.requires_grad:
            # mm(out=...) has no backward: the same products, stacked.
            hit = set(hit)
            return torch.stack([torch.mm(x[e], self._expert(e)) if e in hit else out[e] for e in range(E)])
        for e in hit:
            torch.mm(x[e], self._expert(e), out=out[e])
        return out

    _BMM = None  # the torch functions routed_bmm serves, filled on first use

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls._BMM is None:
            cls._BMM = {torch.bmm, torch.matmul, Tensor.bmm, Tensor.matmul, Tensor.__matmul__}
        if (func in cls._BMM and not kwargs and len(args) == 2 and isinstance(args[1], ExpertStack)
                and isinstance(args[0], Tensor) and args[0].dim() == 3):
            return args[1].routed_bmm(args[0])
        log.debug("unweight: an experts parameter used by %s: decoding every expert", getattr(func, "__name__", func))
        return super().__torch_function__(func, types, args, kwargs)


# ----------------------------------------------------------------------------- routed forward

ROUTED = "unweight"  # the experts implementation name routed_experts_forward is registered under


def _expert_linear(x: Tensor, w: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    # The products of transformers' own loops: F.linear(x, W) for [out, in] weights, x @ W for
    # [in, out]; a bias added afterwards in the output dtype, as batched_mm / grouped_mm do.
    out = x @ w if transposed else torch.nn.functional.linear(x, w)
    return out if bias is None else out.add_(bias)


def _routed_linear(param, e: int, x: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    """Expert e's projection of x: a fused kernel where the stack's policy measured one faster
    (ExpertStack.fused_linear; [out, in] weights only, the layout the kernels contract), else
    the expert decoded and multiplied as transformers' loops do (_expert_linear)."""
    if isinstance(param, ExpertStack) and not transposed:
        y = param.fused_linear(e, x)
        if y is not None:
            return y if bias is None else y.add_(bias)
    return _expert_linear(x, param[e], bias, transposed)


def routed_experts_forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """An experts forward for transformers' ``use_experts_implementation`` modules that reads
    one routed expert's weights at a time (``self.gate_up_proj[e]``) and computes what
    transformers' "batched_mm" forward computes.  On CUDA, an expert projection whose shape and
    batch the dispatch table measured faster in a fused kernel runs it on the compressed
    weights instead (the GEMM's error bound, not batched_mm's bits; runtime/policy.py).

    hidden_states [T, H]; top_k_index, top_k_weights [T, k] (ids >= num_experts: expert-parallel
    sentinels, weight 0).  Returns [T, H] in hidden_states' dtype.
    """
    num_top_k = top_k_index.size(-1)
    num_tokens, hidden_dim = hidden_states.size(0), hidden_states.size(-1)
    expert_ids = top_k_index.reshape(-1)  # S = T * k samples, token-major
    sample_weights = top_k_weights.reshape(-1)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    proj = None
    for e in torch.unique(expert_ids).tolist():
        if not 0 <= e < self.num_experts:
            continue  # a sentinel's sample weight is 0: its row stays 0, as batched_mm's 0 * proj
        rows = (expert_ids == e).nonzero().reshape(-1)
        y = _routed_linear(up, e, hidden_states[rows // num_top_k], None if up_bias is None else up_bias[e],
                           self.is_transposed)
        y = self._apply_gate(y) if self.has_gate else self.act_fn(y)
        y = _routed_linear(self.down_proj, e, y, self.down_proj_bias[e] if self.has_bias else None, self.is_transposed)
        if getattr(self, "has_post_expert_norm", False):  # transformers 5.17's experts have no such norm
            y = self.post_expert_norm(y)
        if proj is None:
            proj = y.new_zeros((expert_ids.numel(), y.shape[-1]))
        proj[rows] = y
    if proj is None:
        proj = hidden_states.new_zeros((expert_ids.numel(), hidden_dim))
    weighted = proj * sample_weights.unsqueeze(-1)
    return weighted.view(num_tokens, num_top_k, hidden_dim).sum(dim=1).to(hidden_states.dtype)


def use_routed_forward(model: nn.Module) -> str | None:
    """Switch a transformers model whose experts implementation takes every expert at once to
    ``routed_experts_forward``; "eager" (one expert at a time already) is kept.  Returns the
    implementation in use (None: the model has no experts implementation to set)."""
    impl = getattr(getattr(model, "config", None), "_experts_implementation", None)
    if impl in (None, "eager", ROUTED) or not hasattr(model, "set_experts_implementation"):
        return impl
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(ROUTED, routed_experts_forward)
    try:
        model.set_experts_implementation(ROUTED)
    except (ValueError, KeyError, AttributeError, RuntimeError) as e:
        log.info("unweight: experts implementation stays %s (%s); its forward decodes every expert", impl, e)
        return impl
    log.info("unweight: experts implementation %s -> %s (routed experts decode one at a time)", impl, ROUTED)
    return ROUTED


# ----------------------------------------------------------------------------- installation


def _install(mod: nn.Module, attr: str, stack: ExpertStack) -> None:
    del mod._parameters[attr]
    setattr(mod, attr, stack)


def is_experts_param(mod: nn.Module, attr: str, header: TensorHeader) -> bool:
    """A 3-D parameter an experts module indexes by expert: the stored stack fits it and its
    leading dimension is the module's ``num_experts`` (transformers' experts classes all have
    one).  Other 3-D weights (conv kernels) decode to dense at load instead."""
    w = mod._parameters.get(attr)
    return (w is not None and w.dim() == 3 and tuple(w.shape) == header.shape
            and getattr(mod, "num_experts", None) == header.stack)


def install_stack(mod_name: str, mod: nn.Module, attr: str, shapes: dict, header: TensorHeader) -> dict:
    """Replace parameter `attr` of experts module `mod` by an ExpertStack over a stacked
    checkpoint tensor (header; plane shapes {suffix: (shape, dtype)}), whose planes become
    buffers attr + suffix of `mod`."""
    register_planes(mod, attr, shapes)
    w = mod._parameters[attr]
    full = f"{mod_name}.{attr}" if mod_name else attr
    _install(mod, attr, ExpertStack(full, w.shape, w.dtype, [_Planes(mod, attr, header)]))
    return {"module": mod_name, "attr": attr, "created": [], "layout": "stacked"}


def install_fused(model: nn.Module, mod_name: str, attr: str, pieces: dict, n_sources: int, plane_path) -> dict:
    """Replace the fused parameter `attr` of experts module `mod_name` by an ExpertStack over
    per-expert checkpoint tensors.  pieces: {(source, expert): (checkpoint base, header, plane
    shapes)}; plane_path(base) -> (module path, attr) where the loader puts that tensor's planes."""
    mod = model.get_submodule(mod_name) if mod_name else model
    w = mod._parameters.get(attr)
    full = f"{mod_name}.{attr}" if mod_name else attr
    if w is None or w.dim() != 3:
        raise InputError(f"unweight: {full} is not a 3-D parameter; the experts stored for it cannot be placed")
    E = w.shape[0]
    experts = sorted({e for _, e in pieces})
    missing = [(i, e) for i in range(n_sources) for e in range(E) if (i, e) not in pieces]
    if experts != list(range(E)) or missing:
        raise InputError(f"unweight: checkpoint has experts {experts[0]}..{experts[-1]} ({len(pieces)} tensors) for "
                         f"{full}, which holds {E} experts of {n_sources} piece(s) each")
    sources, rows, created = [], 0, []
    for i in range(n_sources):
        hs = [pieces[(i, e)][1] for e in range(E)]
        if any(h.stack for h in hs) or len({(h.rows, h.cols) for h in hs}) != 1:
            raise InputError(f"unweight: the experts stored for {full} (piece {i}) are not matrices of one shape")
        rows += hs[0].rows
        src = []
        for e in range(E):
            base, _, shapes = pieces[(i, e)]
            path, leaf = plane_path(base)
            holder, made = ensure_holder(model, path)
            created += made
            register_planes(holder, leaf, shapes)
            src.append(_Planes(holder, leaf, hs[e]))
        sources.append(src)
    if (rows, hs[0].cols) != tuple(w.shape[1:]):
        raise InputError(f"unweight: the experts stored for {full} stack to [{E}, {rows}, {hs[0].cols}], the parameter "
                         f"is {list(w.shape)}")
    _install(mod, attr, ExpertStack(full, w.shape, w.dtype, sources))
    return {"module": mod_name, "attr": attr, "created": created, "layout": "per-expert"}


def expert_stacks(model: nn.Module) -> list:
    """(name, module, attr, ExpertStack) of every compressed experts parameter of a model."""
    out = []
    for n, m in model.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, ExpertStack):
                out.append((f"{n}.{k}" if n else k, m, k, v))
    return out


# ----------------------------------------------------------------------------- after loading


def add_index(stack: ExpertStack, policy=None) -> dict:
    """The checkpoint index (S = LOAD_CHK_INTERVAL) for every huffman tensor of a stack kept
    compressed on a GPU whose file has none: without it an expert's decode runs a thread per
    segment, a few hundred threads for a whole GPU.  Built on the GPU (ops.build_index, with
    the decoder the DispatchPolicy `policy` measured fastest for the stream as stored).
    Returns the decode tables it built, {plane attr: uint16 [4, 4096]}, for prepare_planes
    (the index leaves the code tables as they are)."""
    from .. import ops  # the ops layer: the device index
    luts = {}
    for p in stack.planes():
        h = p.header
        if h.encoding != C.ENC_HUFFMAN or h.chk_interval or p.device.type != "cuda" or not ops.cuda_kernels_built():
            continue
        err = scratch.error_counter(p.device)
        lut = _device_lut(p, err)
        indexed = ops.build_index(h, p.planes(), lut, err, variant=dispatch.decoder_variant(h, p.device, policy))
        if indexed is not None:
            p.replace(*indexed)
            luts[(id(p.module), p.attr)] = lut
    return luts


def _device_lut(p: _Planes, err: Tensor) -> Tensor:
    """A huffman tensor's CUDA decode tables uint16 [4, 4096] on its device (prepare_planes
    holds them; a load-time decode before it builds its own)."""
    from .. import ops  # the ops layer: CUDA decode tables
    return ops.build_lut(p.code_table(), p.header.exp_lo, p.header.exp_hi, err)


def prepare_planes(stack: ExpertStack, luts: dict | None = None) -> None:
    """Per-device tables a compressed stack needs: CUDA Huffman decode tables (those add_index
    returned for the same planes, `luts`, else built here), and for palette stacks each
    matrix's verbatim range with its block ids rebased to the matrix."""
    for p in stack.planes():
        h = p.header
        if hasattr(p.module, p.attr + "_lut"):
            delattr(p.module, p.attr + "_lut")
        if h.encoding == C.ENC_HUFFMAN and p.device.type == "cuda":
            lut = (luts or {}).get((id(p.module), p.attr))
            if lut is None:
                lut = _device_lut(p, scratch.error_counter(p.device))
            p.module.register_buffer(p.attr + "_lut", lut, persistent=False)
        if h.encoding == C.ENC_PALETTE and h.stack:
            p.rebase_verbatim()


def hold_paired(stack: ExpertStack, paired: bool | None = None) -> int:
    """Hold every palette tensor of the stack with its palette in paired order (True; None: on
    a CUDA device, the decode's cheaper lookup there) or as stored (False): _Planes.set_paired.
    Returns how many tensors hold the paired order."""
    n = 0
    for p in stack.planes():
        p.set_paired(p.device.type == "cuda" if paired is None else paired)
        n += p.paired() is not None
    return n


def transcode(stack: ExpertStack, target: str, policy=None) -> None:
    """Re-encode every tensor of the stack as `target` ("huffman" | "palette"), same grids (a
    load-time step).  Huffman -> palette runs on the planes' GPU when the CUDA kernels are
    built (ops.transcode_to_palette, decoding with the decoder the DispatchPolicy `policy`
    measured fastest for the matrices' shape), else with the CPU codec."""
    from .. import ops  # the ops layer: the device transcode
    hold_paired(stack, False)  # the codec reads the stored bytes
    for p in stack.planes():
        h = p.header
        if h.encoding_name == target:
            continue
        if target == "palette" and p.device.type == "cuda" and ops.cuda_kernels_built():
            err = scratch.error_counter(p.device)
            p.replace(*ops.transcode_to_palette(h, p.planes(), _device_lut(p, err), err,
                                                dispatch.decoder_variant(h, p.device, policy)))
            continue
        w = tc.decode(h, p.host_planes(), verify=False)
        enc = tc.encode(w, target, grid=(h.rows_per_group, h.cols_per_chunk))
        p.replace(enc.header, enc.planes)


def to_dense(model: nn.Module, mod: nn.Module, attr: str, stack: ExpertStack, created: list) -> None:
    """Decode the stack into an ordinary Parameter `attr` of `mod` and drop its planes."""
    w = stack.materialize()
    for p in stack.planes():
        p.remove()
    delattr(mod, attr)
    mod.register_parameter(attr, nn.Parameter(w, requires_grad=False))
    for name in sorted(created, key=lambda n: -n.count(".")):
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        if isinstance(owner._modules.get(child), PlaneHolder) and not any(True for _ in owner._modules[child].buffers()):
            del owner._modules[child]
