"""Model surgery: swap compressed modules in before weights load, check after loading.

``convert_model`` (model on the meta device) turns every module whose weight is an encoded
tensor of the checkpoint into a compressed module, found from the tensors alone (no
per-architecture tables): exact ``nn.Linear`` -> CompressedLinear, exact ``nn.Embedding`` ->
CompressedEmbedding, an output projection tied to a compressed weight and absent from the
checkpoint -> CompressedLinear sharing the source's planes.  Anything else holding an
encoded tensor (Conv1D, a subclass with its own forward, a bare Parameter...) gets the plane
buffers attached and is decoded to a dense weight after loading (``decode_fallbacks``).

Mixture-of-experts parameters (3-D, fused by transformers from per-expert checkpoint
tensors, or stored as a format-1.1 stack) become ExpertStack stand-ins whose experts decode one
at a time (runtime/experts.py).

``check_loading`` enforces that a model that loads is the original model: every stored
tensor consumed, no parameter left at its initial value (transformers only warns).
Name resolution applies what transformers' loader does to a checkpoint key of this model (its
conversion mapping's renamings, e.g. Mixtral's ``block_sparse_moe`` -> ``mlp``), then the one
renaming every transformers model shares: the base-model prefix (a BertModel checkpoint into
BertForMaskedLM and back).
"""
from __future__ import annotations

import logging
import re

import torch
import torch.nn as nn

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.checkpoint import CompressedCheckpoint
from ..format.errors import FormatError, InputError
from ..format.header import TensorHeader
from . import experts
from .modules import CompressedEmbedding, CompressedLinear
from .verify import piece_key

log = logging.getLogger(__name__)

_ST_TORCH = {"U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32}


def _plane_shapes(ck: CompressedCheckpoint, base: str) -> dict:
    out = {}
    for suf, stored in ck.encoded[base].items():
        dt, shape, _, _ = ck.info(stored)
        if dt not in _ST_TORCH:
            raise FormatError(f"plane {stored!r} ({ck.file_of(stored)}) has dtype {dt}, expected U8/U16/U32")
        out[suf] = (tuple(shape), _ST_TORCH[dt])
    return out


def set_module(model: nn.Module, name: str, new: nn.Module):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)



def prefixed_names(name: str, prefix: str) -> list:
    """Where a checkpoint name may live in a model: as is, under the base-model prefix, or
    without it (a BertModel checkpoint into BertForMaskedLM and back)."""
    cands = [name]
    if prefix:
        cands.append(f"{prefix}.{name}")
        if name.startswith(prefix + "."):
            cands.append(name[len(prefix) + 1:])
    return cands


def _resolver(model: nn.Module, ck_names: set):
    """checkpoint tensor name -> (module name, attribute) in this model, or None.

    Handles the only renaming every transformers model shares: the base-model prefix
    (a BertModel checkpoint into BertForMaskedLM and back)."""
    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "") or ""

    def resolve(name: str):
        for c in prefixed_names(name, prefix):
            mod, _, attr = c.rpartition(".")
            m = modules.get(mod)
            if m is not None and (attr in m._parameters or attr in m._buffers):
                return mod, attr
        return None

    return modules, resolve


def _plane_key(rename, ck: CompressedCheckpoint, base: str) -> str:
    """What transformers' loader renames encoded tensor `base`'s plane keys to, less the
    suffix; every plane of the tensor must land beside the others (InputError otherwise)."""
    keys = {}
    for suf, stored in ck.encoded[base].items():
        key, fusion = rename(stored)
        if fusion is not None or not key.endswith(suf):
            raise InputError(f"unweight: transformers would load plane {stored!r} ({ck.location(base)}) as "
                             f"{key!r}, away from its tensor's other planes; this model cannot load it compressed")
        keys[suf] = key[: -len(suf)]
    if len(set(keys.values())) != 1:
        raise InputError(f"unweight: transformers renames the planes of {base!r} ({ck.location(base)}) apart")
    return keys[C.SUFFIX_HDR]


def convert_model(model: nn.Module, ck: CompressedCheckpoint) -> dict:
    """Replace (on the meta device) every module holding an encoded tensor; see module doc.

    An encoded tensor that resolves to no parameter of the model fails with InputError (one
    line naming it): a model that loads must be the original model.
    Returns a report {"compressed": [...], "tied": [...], "dense_fallback": [...], "experts":
    [each experts parameter: its module, attr, layout, and the checkpoint names it is made of:
    "base" (a stack) or "bases" {(piece, expert): name}], "ignored": [checkpoint names the
    model's _keys_to_ignore_on_load_unexpected drop]} which is also stored as model._unweight_plan.
    """
    rename = experts.hf_renamer(model)
    modules, resolve = _resolver(model, set(ck.names()))
    prefix = getattr(model, "base_model_prefix", "") or ""
    report = {"compressed": [], "tied": [], "dense_fallback": [], "experts": [], "ignored": [], "locations": {}}
    replaced = {}  # module name -> compressed module
    ck_params = set()  # model param names present in the checkpoint (encoded or raw)
    raw_fused = {}  # fused experts parameter (transformers' name) -> a raw checkpoint tensor fused into it
    for name in ck.raw:
        key, fusion = rename(name)
        if fusion is not None:  # transformers fuses it itself
            raw_fused.setdefault(fusion.target, name)
            continue
        r = resolve(key)
        if r:
            ck_params.add(f"{r[0]}.{r[1]}" if r[0] else r[1])
    fused = {}  # fused experts parameter (transformers' name) -> {"n": sources, "pieces": {(source, expert): ...}}
    # Checkpoint tensors the model's own loader drops (DeepSeek-V3's multi-token-prediction
    # layer, model.layers.61): transformers skips their plane keys by the same patterns.
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    for base in ck.encoded:
        if any(p.search(base) for p in ignored):
            report["ignored"].append(base)
            continue
        h = ck.header(base)
        shapes = _plane_shapes(ck, base)
        tc.check_planes(h, ck.planes(base), ck.location(base))  # mmap views: shapes + two offsets read
        key, fusion = rename(base)
        pkey = _plane_key(rename, ck, base)
        if fusion is not None and not fusion.supported:
            raise InputError(f"unweight: transformers loads checkpoint tensor {base!r} ({ck.location(base)}) through "
                             f"[{fusion.ops}], which compressed experts cannot follow; decompress the checkpoint to "
                             f"load this model")
        if fusion is not None:
            g = fused.setdefault(fusion.target, {"n": fusion.n_sources, "pieces": {}})
            g["pieces"][(fusion.source, fusion.expert)] = (base, h, shapes, pkey)
            continue
        if key != pkey:
            raise InputError(f"unweight: transformers would load checkpoint tensor {base!r} ({ck.location(base)}) as "
                             f"{key!r} but its planes as {pkey!r}; this model cannot load it compressed")
        r = resolve(key)
        if r is None:
            raise InputError(f"unweight: checkpoint tensor {base!r} ({ck.location(base)}) has no place in "
                             f"{type(model).__name__}: no parameter or buffer of that name")
        mod_name, attr = r
        full = f"{mod_name}.{attr}" if mod_name else attr
        ck_params.add(full)
        report["locations"][full] = ck.location(base)
        mod = modules[mod_name]
        w = getattr(mod, attr)
        if h.stack and tuple(w.shape) != h.shape:
            # A stack decodes to its own shape; viewing it as another would scramble it.
            raise InputError(f"unweight: checkpoint tensor {ck.location(base)} is {list(h.shape)}, the model's "
                             f"{full} is {list(w.shape)}")
        if h.stack and experts.is_experts_param(mod, attr, h):
            report["experts"].append(dict(experts.install_stack(mod_name, mod, attr, shapes, h), base=base))
            continue
        fits = attr == "weight" and tuple(w.shape) == (h.rows, h.cols)
        if fits and type(mod) is nn.Linear:
            new = CompressedLinear(h, shapes, bias=mod.bias, device="meta")
        elif fits and type(mod) is nn.Embedding and mod.max_norm is None:
            new = CompressedEmbedding(h, shapes, padding_idx=mod.padding_idx, device="meta")
        else:
            # Not a module we can run compressed: carry the planes on it, decode after load.
            for suf, (shp, dt) in shapes.items():
                mod.register_buffer(attr + suf, torch.empty(shp, dtype=dt, device="meta"), persistent=True)
            report["dense_fallback"].append({"module": mod_name, "attr": attr, "type": type(mod).__name__,
                                             "header": h})
            log.info("unweight: %s (%s.%s) cannot run compressed; it will be decoded to a dense weight at load",
                     full, type(mod).__name__, attr)
            continue
        set_module(model, mod_name, new)
        modules[mod_name] = new
        replaced[mod_name] = new
        report["compressed"].append(mod_name)

    for target, g in fused.items():
        r = resolve(target)
        if r is None:
            raise InputError(f"unweight: transformers fuses checkpoint experts into {target!r}, which "
                             f"{type(model).__name__} does not have")
        if target in raw_fused:
            raise InputError(f"unweight: {target} is fused from compressed and raw experts ({raw_fused[target]!r} is "
                             f"raw); compressed experts need every piece encoded")
        mod_name, attr = r
        full = f"{mod_name}.{attr}" if mod_name else attr

        def plane_path(base, _t=target, _f=full, _g=g):
            # The loader adds or strips the base-model prefix of a key the way it does for the
            # fused parameter itself; the holders go where it will look.
            pkey = next(p for b, _, _, p in _g["pieces"].values() if b == base)
            if _f != _t and prefix:
                pkey = f"{prefix}.{pkey}" if _f == f"{prefix}.{_t}" else pkey.removeprefix(prefix + ".")
            path, _, leaf = pkey.rpartition(".")
            return path, leaf

        pieces = {k: v[:3] for k, v in g["pieces"].items()}
        for (source, expert), (base, *_) in g["pieces"].items():
            report["locations"][piece_key(full, source, expert)] = ck.location(base)
        report["experts"].append(dict(experts.install_fused(model, mod_name, attr, pieces, g["n"], plane_path),
                                      bases={k: v[0] for k, v in pieces.items()}))
        ck_params.add(full)

    # Ties: an output projection tied to a compressed weight and absent from the checkpoint
    # shares the source's planes.  Every tie touching a replaced module leaves transformers'
    # tie map (its params no longer exist; the sharing is structural now).
    tied_map = dict(getattr(model, "all_tied_weights_keys", None) or {})
    for target, source in tied_map.items():
        t_mod, _, t_attr = target.rpartition(".")
        s_mod, _, s_attr = source.rpartition(".")
        if s_mod not in replaced and t_mod not in replaced:
            continue
        model.all_tied_weights_keys.pop(target, None)
        tgt = modules.get(t_mod)
        src = replaced.get(s_mod)
        if (src is not None and t_attr == "weight" and s_attr == "weight" and target not in ck_params
                and type(tgt) is nn.Linear and tuple(tgt.weight.shape) == (src.n_rows, src.n_cols)):
            new = CompressedLinear.tied_to(src, bias=tgt.bias)
            set_module(model, t_mod, new)
            modules[t_mod] = new
            report["tied"].append({"module": t_mod, "source": s_mod})
        elif t_mod not in replaced:
            log.warning("unweight: %s is tied to %s, which is stored compressed, but %s cannot share its planes; "
                        "it is left untied", target, source, type(tgt).__name__)

    # Dense fallbacks lose their original weight from the checkpoint: keep transformers from
    # reporting it missing (it is decoded into place after loading).
    if report["dense_fallback"]:
        pats = set(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
        for fb in report["dense_fallback"]:
            full = f"{fb['module']}.{fb['attr']}" if fb["module"] else fb["attr"]
            pats.add("^" + re.escape(full) + "$")
        model._keys_to_ignore_on_load_missing = sorted(pats)
    model._unweight_plan = report
    return report


def decode_fallbacks(model: nn.Module, plan: dict) -> None:
    """After loading: decode the planes carried by modules that cannot run compressed (see
    convert_model) into their dense weight, checksum-verified."""
    for fb in plan.get("dense_fallback", []):
        mod = model.get_submodule(fb["module"]) if fb["module"] else model
        attr, h = fb["attr"], fb["header"]
        planes = {suf: getattr(mod, attr + suf).detach().cpu().numpy() for suf in tc.planes_for(h)}
        where = f"{fb['module']}.{attr}"
        h = TensorHeader.parse(planes[C.SUFFIX_HDR], where)
        w = torch.from_numpy(tc.decode(h, planes, where=where, verify=True)).view(torch.bfloat16)
        dev = getattr(mod, attr + C.SUFFIX_SM).device
        old = getattr(mod, attr, None)
        w = w.view(old.shape) if old is not None and old.numel() == w.numel() else w
        for suf in tc.planes_for(h):
            delattr(mod, attr + suf)
        setattr(mod, attr, nn.Parameter(w.to(dev), requires_grad=False))
    if plan.get("dense_fallback") and hasattr(model, "tie_weights"):
        try:
            model.tie_weights(recompute_mapping=False)
        except (AttributeError, TypeError) as e:  # models without transformers' tie API
            log.debug("tie_weights after dense fallback: %s", e)


def check_loading(model: nn.Module, missing, unexpected) -> None:
    """Fail with one InputError line when transformers reported checkpoint tensors it could not
    place (unexpected) or model parameters it left at their initial values (missing), after
    the model's own ignore rules were applied."""
    missing, unexpected = sorted(missing or ()), sorted(unexpected or ())
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise InputError(f"unweight: checkpoint tensor {unexpected[0]!r}{more} has no place in "
                         f"{type(model).__name__}; the model would not be the original")
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"unweight: {type(model).__name__} parameter {missing[0]!r}{more} is not in the "
                         f"checkpoint and would be left at its initial value")


def capture_loading_info(model: nn.Module) -> None:
    """Record transformers' final missing/unexpected keys on the model (model._unweight_loading)
    and refuse a partial load there (check_loading).  transformers 5 hands its loading report
    to ``_adjust_missing_and_unexpected_keys`` and otherwise only logs it."""
    orig = getattr(model, "_adjust_missing_and_unexpected_keys", None)
    if orig is None:
        return

    def adjust(loading_info, *args, **kwargs):
        out = orig(loading_info, *args, **kwargs)
        missing = set(getattr(loading_info, "missing_keys", ()) or ())
        unexpected = set(getattr(loading_info, "unexpected_keys", ()) or ())
        model._unweight_loading = (missing, unexpected)
        if missing or unexpected:
            # Refused here, not after loading: transformers logs its loading report (a
            # multi-line warning table of these keys) right after this call, even when it
            # raises, so the keys leave the report and the refusal's one line says it all.
            for keys in (loading_info.missing_keys, loading_info.unexpected_keys):
                keys.clear()
            check_loading(model, missing, unexpected)
        return out

    model._adjust_missing_and_unexpected_keys = adjust
