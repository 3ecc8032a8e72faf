"""nn.Modules whose weight stays compressed: CompressedLinear and CompressedEmbedding.

The planes of the encoded weight are buffers named ``weight__hdr``, ``weight__sm``,
``weight__exp``/``weight__off`` (huffman) or ``weight__idx``/``weight__vpos``/``weight__vexp``
(palette), so a module's state-dict keys are exactly the checkpoint's plane names and
transformers' loader fills them with no renaming.  Planes are uint8/uint32 tensors on the
module's device; the weight is decoded per forward into the per-device scratch buffer
(runtime/dispatch.py), never kept decoded.  ``policy`` (a runtime.policy.DispatchPolicy, set
by runtime/prepare.py; None = always decode + F.linear) decides where a fused kernel runs.

A tied output projection (SmolLM2's lm_head = embed_tokens) is a CompressedLinear that owns
no planes: it reads its source embedding's buffers at every forward.  The source is held in
a plain list, not as a submodule, so state_dict() and .to() see the planes exactly once.

A palette CompressedLinear may hold its sm and idx buffers tile-major (``set_plane_order``,
ops/layout.py), the order the fused kernels stream fastest, and a palette module its palette
in paired order with idx rewritten to match (``set_palette_order``, ops.paired_palette: the
CUDA decode's cheaper lookup); everything that leaves the module (state_dict(),
host_planes()) is in file order whatever it holds, and a state-dict load, which writes
file-order bytes into the buffers, puts it back in file order.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.errors import FormatError, InputError
from ..format.header import TensorHeader
from ..ops import layout as ops_layout
from . import dispatch
from . import kernel_plan as kp
from .modes import check_plane_order
from .policy import resolve_plane_order
from .weights import EncodedWeight, hold_row_index


def plane_tensor(a) -> Tensor:
    """Torch tensor of a NumPy plane (uint8 / uint32), sharing memory when possible."""
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        a = a.copy()  # mmap views are read-only; torch needs writable storage
    return torch.from_numpy(a)


class LazyTensor:
    """Tensor-like stand-in for a weight that stays compressed (a compressed module's
    ``weight``, an experts parameter): ``shape``, ``dtype`` and ``device`` cost nothing; any
    other use (a tensor method, a torch function, indexing) gets the decoded tensor from
    ``materialize()``, a new tensor decoded at each use.  Code that only asks a weight where
    it lives (``embed_tokens.weight.device``) keeps working without a decode."""

    _is_hf_initialized = True  # transformers' weight init leaves it alone (its bytes come from the checkpoint)
    shape: torch.Size
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def materialize(self) -> Tensor:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx):
        return self.materialize()[idx]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def dense(a):
            if isinstance(a, LazyTensor):
                return a.materialize()
            if isinstance(a, (list, tuple)):
                return type(a)(dense(b) for b in a)
            return a
        return func(*dense(tuple(args)), **{k: dense(v) for k, v in (kwargs or {}).items()})

    def __getattr__(self, name: str):
        if name.startswith("_"):  # copy/pickle probes and private names are not tensor methods
            raise AttributeError(name)
        return getattr(self.materialize(), name)


class _LazyWeight(LazyTensor):
    """``module.weight`` of a compressed module: bf16 [rows, cols] on the planes' device."""

    def __init__(self, module: "CompressedWeightMixin"):
        self._module = module
        self.shape = torch.Size((module.n_rows, module.n_cols))
        self.dtype = torch.bfloat16

    @property
    def device(self) -> torch.device:
        return self._module.device

    def materialize(self) -> Tensor:
        return self._module.decode_weight()

    def __repr__(self) -> str:
        return f"compressed weight {list(self.shape)} ({self._module.encoding_name}, {self.device})"


class _Info:
    """Plain-int copy of the header fields a forward needs (cheap attribute reads, and
    constants under torch.compile)."""

    __slots__ = ("encoding", "n_rows", "n_cols", "rows_per_group", "cols_per_chunk", "exp_lo", "exp_hi",
                 "palette", "table_bytes", "chk_interval")

    def __init__(self, h: TensorHeader):
        self.encoding = int(h.encoding)
        self.n_rows, self.n_cols = int(h.rows), int(h.cols)
        self.rows_per_group, self.cols_per_chunk = int(h.rows_per_group), int(h.cols_per_chunk)
        self.exp_lo, self.exp_hi = int(h.exp_lo), int(h.exp_hi)
        self.palette = [int(b) for b in h.palette[: h.pal_size]]
        self.table_bytes = 0 if h.table is None else int(h.table.size)
        self.chk_interval = int(h.chk_interval)


def refuse_dtype_cast(fn) -> None:
    """Raise InputError when `fn` (the function nn.Module._apply maps over a module's tensors)
    changes a bfloat16 tensor's dtype: ``.to(torch.float32)``, ``.float()``, ``.half()``.

    Compressed weights are decoded to bfloat16, their stored dtype, so such a cast would
    convert the norms and biases around them and leave a model that is neither the original
    nor the original cast: different logits, or a dtype error deep in a later forward.
    Device moves pass (the probe is empty; a probe that fails is left to the real call)."""
    probe = torch.empty(0, dtype=torch.bfloat16)
    try:
        out = fn(probe)
    except Exception:  # noqa: BLE001 - e.g. a device this build lacks: the real move will say so
        return
    if isinstance(out, Tensor) and out.dtype != probe.dtype:
        raise InputError(f"a model with compressed weights computes in bfloat16, their stored dtype; casting it "
                         f"to {out.dtype} is not supported (load it with mode='dense' to cast it, or decompress "
                         "the checkpoint)")


class CompressedWeightMixin:
    """Shared plane handling of CompressedLinear / CompressedEmbedding (an nn.Module mixin)."""

    _tied: list  # [source module] for a tied module, [] otherwise

    def _apply(self, fn, recurse=True):
        refuse_dtype_cast(fn)
        self.__dict__.pop("_uw_encoded", None)  # (its planes may be the old device's: let them go)
        return super()._apply(fn, recurse)

    # -------------------------------------------------------------- construction
    def _init_planes(self, header: TensorHeader, shapes: dict | None = None, device=None,
                     planes: dict | None = None):
        """Register the plane buffers.  shapes: {suffix: (shape, torch dtype)} for empty (e.g.
        meta) buffers to be filled by a state-dict load; planes: {suffix: array/tensor}."""
        self._tied = []
        self._tiled = False  # sm and idx in file order (set_plane_order)
        self._pal_map = None  # idx and palette as stored (set_palette_order: (palette, nibble map))
        if not getattr(self, "_order_hooks", False):
            self._register_state_dict_hook(_file_order_state_dict)
            self._register_load_state_dict_pre_hook(_loading_file_order, with_module=True)
            self.register_load_state_dict_post_hook(_loaded_header)
            self._order_hooks = True
        self.__dict__.setdefault("policy", None)  # kept across replace_planes (a transcode)
        self.__dict__.pop("_uw_encoded", None)
        self.header = header
        self._info = _Info(header)
        self._suffixes = tc.planes_for(header)
        for suf in self._suffixes:
            if planes is not None:
                t = planes[suf] if isinstance(planes[suf], Tensor) else plane_tensor(planes[suf])
                t = t.to(device) if device is not None else t
            else:
                shape, dt = shapes[suf]
                t = torch.empty(shape, dtype=dt, device=device)
            self.register_buffer("weight" + suf, t, persistent=True)
        # Huffman decode tables for the CUDA kernels (built at prepare time); empty on CPU,
        # where the C++ codec builds its tables from the code lengths in the header.
        self.register_buffer("weight_lut", torch.empty(0, dtype=torch.uint16, device=device), persistent=False)

    def replace_planes(self, header: TensorHeader, planes: dict):
        """Swap in another encoding of the same weight (e.g. huffman -> palette transcode)."""
        if (header.rows, header.cols) != (self.n_rows, self.n_cols):
            raise ValueError("replace_planes: shape differs")
        device = self.device
        for suf in self._suffixes:
            delattr(self, "weight" + suf)
        delattr(self, "weight_lut")
        self._init_planes(header, planes=planes, device=device)

    # -------------------------------------------------------------- accessors
    def owner(self):
        return self._tied[0] if self._tied else self

    @property
    def is_tied(self) -> bool:
        return bool(self._tied)

    def planes(self) -> dict:
        o = self.owner()
        return {suf: getattr(o, "weight" + suf) for suf in o._suffixes}

    def code_table(self) -> Tensor:
        """Huffman code lengths uint8 [4, exp_hi-exp_lo+1]: a view into the header plane."""
        hdr = self.owner().weight__hdr
        return hdr[C.HEADER_BYTES:].view(C.HUFF_NUM_CTX, -1)

    def lut(self) -> Tensor:
        return self.owner().weight_lut

    @property
    def info(self) -> _Info:
        return self.owner()._info

    @property
    def encoding(self) -> int:
        return self.info.encoding

    @property
    def encoding_name(self) -> str:
        return {C.ENC_HUFFMAN: "huffman", C.ENC_PALETTE: "palette"}[self.encoding]

    @property
    def n_rows(self) -> int:
        return self.info.n_rows

    @property
    def n_cols(self) -> int:
        return self.info.n_cols

    @property
    def rows_per_group(self) -> int:
        return self.info.rows_per_group

    @property
    def cols_per_chunk(self) -> int:
        return self.info.cols_per_chunk

    @property
    def exp_lo(self) -> int:
        return self.info.exp_lo

    @property
    def exp_hi(self) -> int:
        return self.info.exp_hi

    @property
    def palette(self) -> list:
        return self.info.palette

    @property
    def device(self) -> torch.device:
        return self.owner().weight__sm.device

    def held_bytes(self) -> int:
        """Bytes of planes this module owns (0 for a tied module)."""
        if self._tied:
            return 0
        return sum(int(t.numel() * t.element_size()) for t in self.planes().values())

    def decoded_bytes(self) -> int:
        return self.n_rows * self.n_cols * 2

    def host_planes(self) -> dict:
        """{suffix: NumPy array} of the planes on the host, in file order (zero-copy on CPU
        when the module holds file order)."""
        out = {}
        for suf, t in _file_order(self.owner(), self.planes()).items():
            t = t.detach().cpu()
            out[suf] = t.numpy()
        return out

    @property
    def plane_order(self) -> str:
        """"tiled" when sm and idx are held tile-major, else "file"."""
        return "tiled" if self.owner()._tiled else "file"

    def can_tile(self) -> bool:
        """Whether set_plane_order("tiled") applies: a palette weight this module owns, of
        whole 16 x 64 tiles, read by matmuls only (not an embedding, whose row gather reads
        file order)."""
        return (isinstance(self, CompressedLinear) and not self._tied and self.encoding == C.ENC_PALETTE
                and kp.pal_tiled_ok(self.n_rows, self.n_cols))

    def set_plane_order(self, order: str) -> bool:
        """Hold sm and idx in `order` ("file", "tiled", or "auto": the order the module's
        dispatch policy measured faster for its shape and device, DispatchPolicy.plane_order),
        permuting them in place on their device (one plane's worth of temporary memory); True
        when the order changed.  A module that cannot tile (can_tile) stays in file order and
        "tiled" is a no-op."""
        check_plane_order(order, ValueError)
        if self._tied:  # the source's planes: its own order
            return False
        can = self.can_tile()
        order = resolve_plane_order(order if can else "file", getattr(self, "policy", None), self.n_rows, self.n_cols,
                                    self.device)
        want = order == "tiled" and can
        if want == self._tiled:
            return False
        sm, idx = self.weight__sm.data, self.weight__idx.data
        st, it = (ops_layout.tile_palette_planes if want else ops_layout.untile_palette_planes)(sm, idx)
        sm.copy_(st)
        idx.copy_(it)
        self._tiled = want
        return True

    @property
    def palette_order(self) -> str:
        """"paired" when the module holds its palette reordered and idx rewritten to match
        (set_palette_order), else "file"."""
        return "paired" if self.owner()._pal_map is not None else "file"

    def set_palette_order(self, order: str) -> bool:
        """Hold the palette in `order`: "paired" (ops.paired_palette: every index nibble of idx
        rewritten in place on its device, one plane's worth of temporary memory) or "file" (as
        stored); True when the order changed.  A huffman or tied module, or a palette that pairs
        as stored or cannot pair, stays as it is.  The weight's values do not change."""
        if order not in ("file", "paired"):
            raise ValueError(f"palette order {order!r}: choose 'file' or 'paired'")
        if self._tied or self.encoding != C.ENC_PALETTE or (order == "paired") == (self._pal_map is not None):
            return False
        idx = self.weight__idx.data
        if order == "file":
            idx.copy_(ops_layout.stored_index(idx, self._pal_map[1]))
            self._pal_map = None
            return True
        paired = ops_layout.pair_index(self._info.palette, idx)
        if paired is None:
            return False
        idx.copy_(paired[2])
        self._pal_map = paired[:2]
        return True

    def check_loaded(self, where: str = ""):
        """After a state-dict load: the header plane must parse and agree with the planes."""
        o = self.owner()
        hdr = TensorHeader.parse(o.weight__hdr.detach().cpu().numpy(), where)
        if (hdr.rows, hdr.cols, hdr.encoding) != (o.header.rows, o.header.cols, o.header.encoding):
            raise FormatError(f"loaded header of {where} differs from the checkpoint's")
        tc.check_planes(hdr, {s: _ShapeOnly(t) for s, t in o.planes().items()}, where)
        o.header, o._info = hdr, _Info(hdr)

    def encoded(self) -> EncodedWeight:
        """The weight as the ops take it (read-only: callers never change it).  Kept from the last
        call while it still describes the module, checked on every call: the same buffer objects
        (a .to(), a load with assign=True or replace_planes puts new ones in), the same header
        (a state-dict load re-reads it), plane order and palette order; built anew otherwise.
        Building it reads every plane through nn.Module.__getattr__, a tenth of a compressed
        layer's host time per forward, and builds a CUDA palette weight's verbatim row index
        (runtime.weights.hold_row_index: a device op, no host sync)."""
        o = self.owner()  # (held by the owner: a tied module shares it, and the owner's .to() drops it)
        bufs = o._buffers
        c = o.__dict__.get("_uw_encoded")
        if (c is not None and c[1] is o._info and c[2] == o._tiled and c[3] is o._pal_map
                and all(bufs.get(k) is t for k, t in c[4])):
            return c[0]
        i = o._info
        p = {suf: getattr(o, "weight" + suf) for suf in o._suffixes}
        pal = i.palette if o._pal_map is None else o._pal_map[0]
        w = EncodedWeight(i.encoding, i.n_rows, i.n_cols, i.rows_per_group, i.cols_per_chunk, i.exp_lo, i.exp_hi,
                          pal, p[C.SUFFIX_SM], exp=p.get(C.SUFFIX_EXP), off=p.get(C.SUFFIX_OFF),
                          table=o.code_table() if i.encoding == C.ENC_HUFFMAN else None, lut=o.weight_lut,
                          idx=p.get(C.SUFFIX_IDX), vpos=p.get(C.SUFFIX_VPOS), vexp=p.get(C.SUFFIX_VEXP),
                          chk=p.get(C.SUFFIX_CHK), chk_interval=i.chk_interval, tiled=o._tiled)
        hold_row_index(w)  # (built with the record, so it follows vpos: every rebuild builds it again)
        held = tuple((k, bufs.get(k)) for k in ["weight" + suf for suf in o._suffixes] + ["weight_lut"])  # (__hdr too)
        o.__dict__["_uw_encoded"] = (w, i, o._tiled, o._pal_map, held)
        return w

    def decode_weight(self) -> Tensor:
        """The weight as a new bf16 [rows, cols] tensor on the module's device (not cached)."""
        return dispatch.decode_new([self.encoded()], self.n_rows, self.n_cols, getattr(self, "policy", None))

    @property
    def weight(self) -> LazyTensor:
        """A stand-in for the dense weight (bf16 [rows, cols]): shape, dtype and device without
        decoding; anything else decodes it (see LazyTensor)."""
        return _LazyWeight(self)


def _file_order(owner, planes: dict) -> dict:
    """{suffix: tensor} of `owner`'s planes with sm and idx in file order (new tensors where
    the module holds them tile-major or its index rewritten for a paired palette)."""
    if not owner._tiled and owner._pal_map is None:
        return planes
    sm, idx = planes[C.SUFFIX_SM], planes[C.SUFFIX_IDX]
    if owner._tiled:
        sm, idx = ops_layout.untile_palette_planes(sm, idx)
    if owner._pal_map is not None:  # a byte-wise map: it commutes with the tiling's byte moves
        idx = ops_layout.stored_index(idx, owner._pal_map[1])
    return {**planes, C.SUFFIX_SM: sm, C.SUFFIX_IDX: idx}


def _file_order_state_dict(module, state_dict, prefix, local_metadata):
    """state_dict() hook: the checkpoint's bytes, whatever order the module holds."""
    if getattr(module, "_tiled", False) or getattr(module, "_pal_map", None) is not None:
        keys = {s: prefix + "weight" + s for s in (C.SUFFIX_SM, C.SUFFIX_IDX)}
        planes = _file_order(module, {s: state_dict[k] for s, k in keys.items()})
        for s, k in keys.items():
            state_dict[k] = planes[s]
    return state_dict


def _loading_file_order(module, state_dict, prefix, *args):
    """load_state_dict() pre-hook: the load copies file-order bytes into the buffers (and into
    a sibling group's stacked planes, which the group then no longer describes)."""
    if prefix + "weight" + C.SUFFIX_SM in state_dict:
        module._tiled = False
        module._pal_map = None
        group = module.__dict__.get("_uw_group")
        if group is not None:
            group.dissolve()


def _loaded_header(module, incompatible_keys):
    """load_state_dict() post-hook: the module decodes with the header it now holds.  A header
    plane of the same size may carry another palette or verbatim count than the one the module
    was built with (another checkpoint of the same shapes, or a stacked sibling's re-encoding)."""
    if not module._tied and module.weight__hdr.device.type != "meta":
        module.check_loaded()


class _ShapeOnly:
    """dtype/shape stand-in so tc.check_planes validates device tensors without copying them."""

    _NP = {torch.uint8: np.dtype(np.uint8), torch.uint16: np.dtype(np.uint16), torch.uint32: np.dtype(np.uint32)}

    def __init__(self, t: Tensor):
        self.t = t
        self.dtype = self._NP.get(t.dtype, np.dtype(np.float64))
        self.shape = tuple(t.shape)
        self.ndim = t.dim()
        self.size = t.numel()

    def __getitem__(self, i):
        # Only the huffman offsets' first/last entries are read (two scalars).  A uint32 plane
        # is read through its int32 view: torch's uint32 support on CUDA is partial.
        t = self.t.view(torch.int32) if self.t.dtype == torch.uint32 else self.t
        return int(t[i].item()) & (0xFFFFFFFF if self.t.dtype == torch.uint32 else -1)


class CompressedLinear(CompressedWeightMixin, nn.Module):
    """Drop-in for nn.Linear(in_features=K, out_features=N) with a compressed [N, K] weight.

    forward: x [..., K] (bf16; other float dtypes get a cast copy of the weight) on the planes'
    device -> [..., N], via unweight.runtime.dispatch.linear.
    """

    def __init__(self, header: TensorHeader, shapes: dict | None = None, bias: Tensor | None = None,
                 device=None, planes: dict | None = None):
        super().__init__()
        self._init_planes(header, shapes, device, planes)
        self.in_features, self.out_features = header.cols, header.rows
        if bias is not None and not isinstance(bias, nn.Parameter):
            bias = nn.Parameter(bias, requires_grad=False)
        self.bias = bias

    @classmethod
    def tied_to(cls, source: "CompressedEmbedding", bias: Tensor | None = None) -> "CompressedLinear":
        """An output projection sharing `source`'s planes (no copy, no decoded weight)."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m._tied = [source]
        m.policy = None
        m.in_features, m.out_features = source.n_cols, source.n_rows
        m.bias = bias
        return m

    @classmethod
    def from_linear(cls, lin: nn.Linear, encoding: str = "huffman", **kw) -> "CompressedLinear":
        """Encode a bf16 nn.Linear (tests, benchmarks).  Planes land on lin's device."""
        w = lin.weight.detach().to(torch.bfloat16).cpu().contiguous().view(torch.uint16).numpy()
        enc = tc.encode(w, encoding, **kw)
        bias = None if lin.bias is None else nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
        return cls(enc.header, bias=bias, device=lin.weight.device, planes=enc.planes)

    def forward(self, x: Tensor) -> Tensor:
        pf = self.__dict__.get("_uw_prefetch")  # runtime/prefetch.py: told of each matmul launched
        group = self.__dict__.get("_uw_group")  # stacked with its siblings (runtime/siblings.py)
        if group is not None:
            y = group.forward(self, x)
            if y is not None:
                if pf is not None and group.launched:
                    pf.after(group)
                return y
        y = dispatch.linear([self.encoded()], x, self.bias, self.n_rows, self.n_cols, self.policy)
        if pf is not None:
            pf.after(self)
        return y

    def to_dense(self) -> nn.Linear:
        """An nn.Linear holding the decoded weight (dense mode)."""
        w = self.decode_weight()
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = nn.Parameter(w, requires_grad=False)
        if self.bias is not None:
            lin.bias = self.bias
        return lin

    def extra_repr(self) -> str:
        tied = ", tied" if self._tied else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"encoding={self.encoding_name}{tied}")


class CompressedEmbedding(CompressedWeightMixin, nn.Module):
    """Drop-in for nn.Embedding(N, K) with a compressed [N, K] table.

    forward: integer ids [...] -> bf16 [..., K].  On CPU only the row groups holding the
    requested ids are decoded (tensor_codec.decode_rows semantics).
    """

    def __init__(self, header: TensorHeader, shapes: dict | None = None, padding_idx: int | None = None,
                 device=None, planes: dict | None = None):
        super().__init__()
        self._init_planes(header, shapes, device, planes)
        self.num_embeddings, self.embedding_dim = header.rows, header.cols
        self.padding_idx = padding_idx

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, encoding: str = "huffman", **kw) -> "CompressedEmbedding":
        w = emb.weight.detach().to(torch.bfloat16).cpu().contiguous().view(torch.uint16).numpy()
        enc = tc.encode(w, encoding, **kw)
        return cls(enc.header, padding_idx=emb.padding_idx, device=emb.weight.device, planes=enc.planes)

    def forward(self, ids: Tensor) -> Tensor:
        return dispatch.embedding([self.encoded()], ids, self.n_rows, self.n_cols)

    def to_dense(self) -> nn.Embedding:
        w = self.decode_weight()
        emb = nn.Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx, device="meta")
        emb.weight = nn.Parameter(w, requires_grad=False)
        return emb

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, encoding={self.encoding_name}"


def compressed_modules(model: nn.Module):
    """(name, module) of every compressed module of a model, tied ones included."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, CompressedWeightMixin)]
