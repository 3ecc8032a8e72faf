"""Whether a vLLM model's own loader rewrites a tensor that unweight keeps compressed.

vLLM's model classes read their weights through their own ``load_weights``, and some rewrite a
tensor on its way to its layer: GPT-2 transposes its Conv1D matrices, BLOOM reorders its fused
QKV rows, Llama 4 and Mistral-format checkpoints permute the rows of q and k for their rotary
layout, a few models cut a rank's block themselves.  Those rules are keyed on the tensor's name
(``...weight``), and a compressed tensor's planes travel under other names (``...weight__sm``),
so the planes would skip the rewrite: the layer would compute with the checkpoint's layout, not
the one the model expects.  A shape check catches a transposed non-square matrix, not a
permutation of rows.

loader_rewrites asks the loader itself, before the checkpoint is read: it calls the model's
``load_weights`` on stand-ins, one per kind of compressed tensor.  A stand-in is a tensor on the
meta device (no bytes) of the tensor's shape and dtype, under the tensor's own name; whatever
torch makes from it is a stand-in too, which remembers the operations.  For the call, each
compressed layer holds a stand-in parameter under each name its planes replace, whose
``weight_loader`` notes what reached it.  What reaches a layer is unchanged when it is a view of
the stand-in's storage with its shape, strides and offset, or an exact copy of it (vLLM's expert
loader, for one, adds an expert dimension and takes it away again); anything else (a transpose,
a permutation of rows, a rank's block, a cast, arithmetic) is a rewrite.

decode_rewritten then builds each linear layer holding a rewritten tensor as the BF16 layer
vLLM builds without unweight, before the load starts, so its tensors are decoded at load and
take the loader's path like the original's (Llama 4's q/k/v, a few percent of its weights).  A
layer that cannot be rebuilt so (experts, an embedding) stops the load with a one-line error
naming the tensor and the operations, as does a stand-in taken to another layer than the one
holding its planes.

Imports vLLM nowhere: the check needs only the model object.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...format import constants as C
from ...format.errors import InputError

log = logging.getLogger("vllm.unweight")

# Operations that only read a tensor's metadata (left out of the operations an error names).
_READS = frozenset({
    "shape", "dtype", "device", "ndim", "layout", "requires_grad", "names", "grad", "nbytes", "itemsize", "is_meta",
    "is_cuda", "is_cpu", "is_sparse", "is_quantized", "size", "dim", "numel", "nelement", "stride", "storage_offset",
    "is_contiguous", "is_floating_point", "element_size", "get_device", "__len__", "__repr__", "__format__"})
# Operations whose result holds the same values in the same places as their input, when its
# dtype and shape are the input's (a copy, not a view, so the geometry rule alone cannot tell).
_COPIES = frozenset({"clone", "contiguous", "detach", "data", "to", "cpu", "cuda", "requires_grad_"})
_MOVES = frozenset({"to", "cpu", "cuda"})


def _op_name(func) -> str:
    """A torch function's name; a property's (``.T``, ``.shape``) for its getter."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class StandIn(torch.Tensor):
    """A tensor on the meta device standing in for checkpoint tensor ``source``.

    ``root`` is a plain tensor holding the original's elements in their places: the one the
    first stand-in aliases, or an exact copy of it made on the way; ``ops`` names the operations
    that made this stand-in.  What is made from a stand-in by any torch operation is a stand-in
    too, so a loader's rewrite, however it is spelt, shows in what reaches the layer (see
    unchanged)."""

    source: str = ""
    root = None
    ops: tuple = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, StandIn)]
        name = _op_name(func)
        with torch._C.DisableTorchFunctionSubclass():
            try:
                out = func(*args, **kwargs)
            except (NotImplementedError, RuntimeError):
                # A move to a device (a meta tensor has no bytes to copy): the stand-in stays
                # where it is, cast where the move asks a dtype.
                if name not in _MOVES or not isinstance(args[0], StandIn):
                    raise
                dtype = next((a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.dtype)), None)
                out = args[0] if dtype is None else args[0].to(dtype)
        if not ins:
            return out
        first = ins[0]
        ops = first.ops if name in _READS else first.ops + (name,)
        copying = name in _COPIES and len(ins) == 1 and unchanged(first)
        leaves, spec = tree_flatten(out)
        made = []
        for o in leaves:
            if isinstance(o, torch.Tensor):
                plain = o
                o = o if isinstance(o, StandIn) else o.as_subclass(StandIn)
                o.source, o.root, o.ops = first.source, first.root, ops
                if (copying and not isinstance(plain, StandIn) and plain.dtype == first.root.dtype
                        and tuple(plain.shape) == tuple(first.root.shape)):
                    o.root = plain  # an exact copy: what is made from it is judged against it
            made.append(o)
        return tree_unflatten(made, spec)


def unchanged(t: torch.Tensor) -> bool:
    """True when stand-in `t` holds the original's elements in their places: a view of its
    root's storage with the root's dtype, shape, strides and offset (so
    ``w.unsqueeze(0).unbind()[0]`` and ``w.clone()`` are unchanged; ``w.t()``, a row
    permutation, a rank's block, a cast or any arithmetic are not)."""
    if not isinstance(t, StandIn) or t.root is None:
        return False
    r = t.root
    with torch._C.DisableTorchFunctionSubclass():
        return (t.dtype == r.dtype and tuple(t.shape) == tuple(r.shape) and tuple(t.stride()) == tuple(r.stride())
                and t.storage_offset() == r.storage_offset() and torch._C._is_alias_of(t, r))


def stand_in(name: str, shape: tuple) -> StandIn:
    """A BF16 stand-in of `shape` on the meta device for checkpoint tensor `name`."""
    root = torch.empty(tuple(shape), dtype=torch.bfloat16, device="meta")
    t = root.as_subclass(StandIn)
    t.source, t.root, t.ops = name, root, ()
    return t


def _kind(name: str) -> str:
    """A name with its numbered components after the first starred: the layer's number kept, an
    expert's not."""
    parts = name.split(".")
    nums = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join("*" if i in nums[1:] else p for i, p in enumerate(parts))


def one_per_kind(names: Iterable[str]) -> list[str]:
    """The first of each kind of name (_kind), so a model of 60 layers of 384 experts is asked
    about each layer's projections and one expert's, not about every expert."""
    seen, out = set(), []
    for n in sorted(names, key=lambda s: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in s.split(".")]):
        key = _kind(n)
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


def _stand_in_parameters(model: nn.Module, reached: dict) -> list[tuple[nn.Module, str]]:
    """Register, on each layer of `model` that holds planes, an empty meta parameter under each
    name its planes replace (``weight`` beside ``weight__hdr``, ``w13_weight`` beside
    ``w13_weight__hdr``), whose weight_loader notes in `reached` {source: (layer, param name,
    ops, changed)} the first stand-in that comes to it.  Returns [(layer, name)] to remove."""
    added = []
    for layer in model.modules():
        for pname in list(layer._parameters):
            if not pname.endswith(C.SUFFIX_HDR):
                continue
            stem = pname[:-len(C.SUFFIX_HDR)]
            if stem in layer._parameters or hasattr(layer, stem):
                continue

            def note(param, loaded_weight, *args, _layer=layer, _stem=stem, **kwargs):
                if isinstance(loaded_weight, StandIn):
                    reached.setdefault(loaded_weight.source,
                                      (_layer, _stem, loaded_weight.ops, not unchanged(loaded_weight)))
                return True  # (FusedMoE's loaders ask return_success)
            p = nn.Parameter(torch.empty(0, dtype=torch.bfloat16, device="meta"), requires_grad=False)
            p.weight_loader = note
            layer.register_parameter(stem, p)
            added.append((layer, stem))
    return added


def _ask(load_weights: Callable, probes: list[tuple[str, StandIn]], reached: dict) -> None:
    """load_weights over all probes at once; where it raises (a loader may call what a meta
    tensor cannot do, .item() say), again over each probe that did not reach a layer, alone."""
    try:
        load_weights(iter(probes))
        return
    except Exception as e:  # noqa: BLE001 - a loader's own complaint about a stand-in
        log.debug("unweight: the loader stopped on the stand-ins (%s: %s); asking one by one", type(e).__name__, e)
    for name, t in probes:
        if name in reached:
            continue
        try:
            load_weights(iter([(name, t)]))
        except Exception as e:  # noqa: BLE001
            log.debug("unweight: the loader stopped on %s's stand-in (%s: %s)", name, type(e).__name__, e)


def loader_rewrites(model: nn.Module, owners: dict[str, nn.Module], shapes: dict[str, tuple],
                    skip: Iterable[str] = ()) -> dict[str, tuple]:
    """{checkpoint name: operations} of the compressed tensors `model`'s load_weights would
    rewrite on their way to their layers (every name of a kind whose stand-in came changed);
    InputError where it would take one to another layer than the one holding its planes.

    owners: {checkpoint name: the layer whose unweight method takes its planes}; shapes: {name:
    its shape as stored}; skip: names this rank does not read (other ranks' experts), not asked.
    The model is left as it was: the stand-in parameters are removed, and nothing else is
    written (a stand-in holds no bytes).  A name whose stand-in reached no layer counts as
    unchanged: the loader skipped it or stopped on it, and does the same to its planes, which
    the missing-plane check then names."""
    load_weights = getattr(model, "load_weights", None)
    skip = set(skip)
    names = one_per_kind(n for n in owners if n not in skip and n in shapes)
    if load_weights is None or not names:
        return {}
    t0 = time.perf_counter()
    reached: dict = {}
    added = _stand_in_parameters(model, reached)
    try:
        _ask(load_weights, [(n, stand_in(n, shapes[n])) for n in names], reached)
    finally:
        for layer, stem in added:
            del layer._parameters[stem]
    paths = {id(m): p for p, m in model.named_modules()}
    arch = type(model).__name__
    changed = {}
    for n in names:
        if n not in reached:
            continue
        layer, _, ops, rewritten = reached[n]
        if rewritten:
            changed[_kind(n)] = ops
        elif layer is not owners[n]:
            raise InputError(f"vLLM's loader of {arch} takes {n} to {paths.get(id(layer), '?')}, not to "
                             f"{paths.get(id(owners[n]), '?')}, the layer that holds its planes: serve this "
                             "checkpoint with --load-format unweight (every weight decoded to BF16 at load)")
    got = sum(1 for n in names if n in reached)
    log.info("unweight: %s's loader asked about %d kinds of compressed tensor: %d rewritten on the way to their "
             "layers, %d unchanged, %d skipped (%.2f s)", arch, len(names), len(changed), got - len(changed),
             len(names) - got, time.perf_counter() - t0)
    return {n: changed[_kind(n)] for n in owners if _kind(n) in changed}


def decode_rewritten(model: nn.Module, owners: dict[str, nn.Module], shapes: dict[str, tuple],
                     decode_layer: Callable[[nn.Module, str], bool], skip: Iterable[str] = ()) -> dict[str, str]:
    """Build every layer holding a tensor that `model`'s loader rewrites (loader_rewrites) as the
    BF16 layer vLLM builds without unweight: decode_layer(layer, reason) does it and says True,
    so the layer's tensors are decoded at load and take the loader's path like the original's.
    Where it says False (a layer kind that cannot be rebuilt: experts, an embedding), InputError
    naming the tensor and the rewrite.  Returns {layer path: reason} of the layers rebuilt."""
    rewritten = loader_rewrites(model, owners, shapes, skip)
    paths = {id(m): p for p, m in model.named_modules()}
    arch = type(model).__name__
    done: dict[str, str] = {}
    for n, ops in rewritten.items():
        layer = owners[n]
        path = paths.get(id(layer), "?")
        if path in done:
            continue
        reason = f"vLLM's loader of {arch} rewrites {n.rsplit('.', 2)[-2]} at load ({', '.join(ops)})"
        if not decode_layer(layer, reason):
            raise InputError(f"vLLM's loader of {arch} rewrites {n} on its way to {path} ({', '.join(ops)}); "
                             "unweight can neither hold this layer compressed nor build it as a BF16 one: serve "
                             "this checkpoint with --load-format unweight (every weight decoded to BF16 at load)")
        done[path] = reason
    if done:
        log.info("unweight: %d layers decoded to BF16 at load, which %s's loader rewrites", len(done), arch)
    return done
