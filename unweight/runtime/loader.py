"""unweight.load and the model surgery behind it (shared with the transformers quantizer).

Flow (both ``unweight.load`` and ``AutoModel*.from_pretrained`` after ``import unweight``):

1. ``convert_model`` (before weights load, model on the meta device): every module whose
   weight is an encoded tensor of the checkpoint becomes a compressed module, found from the
   tensors alone (no per-architecture tables): exact ``nn.Linear`` -> CompressedLinear, exact
   ``nn.Embedding`` -> CompressedEmbedding, an output projection tied to a compressed weight
   and absent from the checkpoint -> CompressedLinear sharing the source's planes.  Anything
   else holding an encoded tensor (Conv1D, a subclass with its own forward, a bare
   Parameter...) gets the plane buffers attached and is decoded to a dense weight after
   loading; each such module is logged.
2. ``verify_checkpoint``: the load-time integrity check (see below).
3. transformers loads the plane tensors into the buffers by name (no renaming needed).
4. ``prepare`` (after loading): parses the loaded headers, applies the mode (dense decode,
   palette transcode), builds the CUDA decode tables and reserves the per-device scratch.

Integrity (the chosen policy): before any weight reaches the model, every header and plane is
validated (sizes, dtypes, offsets) and every encoded tensor is decoded once on the host with
its crc32 checked; every raw tensor's crc32 is checked against the one stored at compress
time.  A corrupt or truncated shard therefore fails the load with one FormatError /
ChecksumError line naming the tensor and file, never a wrong output.  Cost: one CPU decode of
the model (~0.5 s for SmolLM2-135M on 2 cores).  ``verify=False`` (or UNWEIGHT_VERIFY=0)
keeps the structural validation and skips the decode pass.

Modes:
    "huffman" / "palette": weights stay compressed on the device; a checkpoint in the other
        encoding is transcoded at load (on the GPU when the CUDA module is built, else with
        the CPU codec).
    "dense": decode once at load into ordinary nn.Linear / nn.Embedding (ties preserved).
    "auto": CPU: dense when the decoded encoded weights take <= 50 % of MemAvailable, else
        the checkpoint's encoding (decode-per-forward is only worth it when memory is short).
        CUDA: dense when everything fits in 80 % of free device memory; otherwise every
        compressed layer shape is timed (decode+F.linear vs dense F.linear, CUDA events,
        batch 1) and layers are densified greedily by slowdown-per-saved-byte while the
        budget lasts.
    A CUDA device without the compiled ``unweight._cuda`` module runs dense (one warning).
"""
from __future__ import annotations

import json
import logging
import os
import re
import warnings

import numpy as np
import torch
import torch.nn as nn

from ..codec import tensor_codec as tc
from ..format import constants as C
from ..format.checkpoint import CompressedCheckpoint
from ..format.errors import ChecksumError, FormatError, InputError
from ..format.header import TensorHeader
from . import dispatch
from .modules import CompressedEmbedding, CompressedLinear, CompressedWeightMixin, compressed_modules

log = logging.getLogger(__name__)

MODES = ("auto", "huffman", "palette", "dense")
_ST_TORCH = {"U8": torch.uint8, "U32": torch.uint32}
_WARNED = set()


def _warn_once(key: str, msg: str):
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, stacklevel=3)
        log.warning(msg)


def cuda_kernels_available() -> bool:
    from ..ops import cuda_module
    return cuda_module() is not None


# ------------------------------------------------------------------------ integrity


def verify_checkpoint(ck: CompressedCheckpoint, threads: int | None = None, decode: bool = True) -> dict:
    """Validate every encoded tensor (and, with decode, decode it with crc32 check) and
    crc32 every raw tensor that has a stored checksum.  Raises FormatError/ChecksumError."""
    threads = threads or tc.default_threads()
    crcs = ck.raw_checksums()
    n_enc = n_raw = 0
    for base in ck.encoded:
        where = ck.location(base)
        h = ck.header(base)
        planes = ck.planes(base)
        if decode:
            tc.decode(h, planes, threads, where=where, verify=True)
        else:
            tc.check_planes(h, planes, where)
        n_enc += 1
    for name in ck.raw:
        if name in crcs:
            got = tc._C.crc32(np.ascontiguousarray(ck.array(name)).reshape(-1).view(np.uint8), threads)
            if got != crcs[name]:
                raise ChecksumError(f"checksum mismatch in tensor {name!r} ({ck.file_of(name)})")
            n_raw += 1
    return {"encoded_checked": n_enc, "raw_checked": n_raw, "decoded": decode}


def _env_verify(default: bool) -> bool:
    v = os.environ.get("UNWEIGHT_VERIFY")
    return default if v is None else v not in ("0", "false", "no")


# ------------------------------------------------------------------------ model surgery


def _plane_shapes(ck: CompressedCheckpoint, base: str) -> dict:
    out = {}
    for suf, stored in ck.encoded[base].items():
        dt, shape, _, _ = ck.info(stored)
        if dt not in _ST_TORCH:
            raise FormatError(f"plane {stored!r} ({ck.file_of(stored)}) has dtype {dt}, expected U8/U32")
        out[suf] = (tuple(shape), _ST_TORCH[dt])
    return out


def _set_module(model: nn.Module, name: str, new: nn.Module):
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


def convert_model(model: nn.Module, ck: CompressedCheckpoint) -> dict:
    """Replace (on the meta device) every module holding an encoded tensor; see module doc.

    Returns a report {"compressed": [...], "tied": [...], "dense_fallback": [...], "unmatched": [...]}
    which is also stored as model._unweight_plan.
    """
    modules, resolve = _resolver(model, set(ck.names()))
    report = {"compressed": [], "tied": [], "dense_fallback": [], "unmatched": []}
    replaced = {}  # module name -> compressed module
    ck_params = set()  # model param names present in the checkpoint (encoded or raw)
    for name in ck.raw:
        r = resolve(name)
        if r:
            ck_params.add(f"{r[0]}.{r[1]}" if r[0] else r[1])
    for base in ck.encoded:
        h = ck.header(base)
        shapes = _plane_shapes(ck, base)
        tc.check_planes(h, ck.planes(base), ck.location(base))  # mmap views: shapes + two offsets read
        r = resolve(base)
        if r is None:
            log.warning("unweight: encoded tensor %s matches no module of %s; it is not loaded", base,
                        type(model).__name__)
            report["unmatched"].append(base)
            continue
        mod_name, attr = r
        full = f"{mod_name}.{attr}" if mod_name else attr
        ck_params.add(full)
        mod = modules[mod_name]
        w = getattr(mod, attr)
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
        _set_module(model, mod_name, new)
        modules[mod_name] = new
        replaced[mod_name] = new
        report["compressed"].append(mod_name)

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
            _set_module(model, t_mod, new)
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


# ------------------------------------------------------------------------ after loading


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _decode_host(m: CompressedWeightMixin) -> np.ndarray:
    return tc.decode(m.owner().header, m.owner().host_planes(), verify=False)


def _dense_weight(m: CompressedWeightMixin) -> torch.Tensor:
    """Decoded bf16 [rows, cols] weight on m's device (device kernels when usable)."""
    dev = m.device
    if dev.type == "cpu" or (dev.type == "cuda" and cuda_kernels_available()):
        return m.decode_weight()
    return torch.from_numpy(_decode_host(m)).view(torch.bfloat16).to(dev)


def _to_dense(model: nn.Module, name: str, m: CompressedWeightMixin, dense_of: dict):
    if isinstance(m, CompressedEmbedding):
        new = nn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx, device="meta")
    else:
        new = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        if m.bias is not None:
            new.bias = m.bias
    src = m.owner()
    if m.is_tied and id(src) in dense_of:
        new.weight = dense_of[id(src)]  # keep the tie: one Parameter, two modules
    else:
        new.weight = nn.Parameter(_dense_weight(m), requires_grad=False)
        dense_of[id(src)] = new.weight
    _set_module(model, name, new)
    return new


def _transcode(m: CompressedWeightMixin, target: str):
    """Re-encode m's planes as `target` ("palette" or "huffman") on its device."""
    if target == m.encoding_name:
        return
    if target == "palette" and m.device.type == "cuda" and cuda_kernels_available():
        _transcode_palette_cuda(m)
        return
    w = _decode_host(m)
    h = m.header
    enc = tc.encode(w, target, grid=(h.rows_per_group, h.cols_per_chunk))
    m.replace_planes(enc.header, enc.planes)


def _transcode_palette_cuda(m: CompressedWeightMixin):
    """Huffman -> palette on the GPU: exponents-only decode, histogram, two encode passes."""
    from ..ops import _stream, cuda_module
    mod = cuda_module()
    p, h = m.planes(), m.header
    dev = m.device
    rows, cols = h.rows, h.cols
    st = _stream(p[C.SUFFIX_SM])
    err = dispatch.error_counter(dev)
    exps = torch.empty((rows, cols), dtype=torch.uint8, device=dev)
    mod.huffman_decode(p[C.SUFFIX_EXP].data_ptr(), p[C.SUFFIX_EXP].numel(), p[C.SUFFIX_OFF].data_ptr(), rows, cols,
                       h.rows_per_group, h.cols_per_chunk, m.lut().data_ptr(), 0, h.n_groups, 0, h.n_chunks,
                       p[C.SUFFIX_SM].data_ptr(), cols, exps.data_ptr(), cols, err.data_ptr(), st, True)
    hist = torch.zeros(256, dtype=torch.int64, device=dev)  # read as uint64 by the kernel
    mod.exp_histogram(exps.data_ptr(), exps.numel(), hist.data_ptr(), st)
    palette = tc.choose_palette(hist.cpu().numpy())
    bpr = -(-cols // C.PAL_BLOCK)
    idx = torch.empty((rows, (cols + 1) // 2), dtype=torch.uint8, device=dev)
    flags = torch.empty(rows * bpr, dtype=torch.uint8, device=dev)
    row_counts = torch.empty(rows, dtype=torch.int32, device=dev)
    row_offsets = torch.empty(rows + 1, dtype=torch.int32, device=dev)
    mod.palette_encode_pass1(exps.data_ptr(), rows, cols, bytes(palette.tobytes()), idx.data_ptr(), flags.data_ptr(),
                             row_counts.data_ptr(), row_offsets.data_ptr(), st)
    nv = int(row_offsets[rows].item())
    vpos = torch.empty(nv, dtype=torch.uint32, device=dev)
    vexp = torch.empty((nv, C.PAL_BLOCK), dtype=torch.uint8, device=dev)
    mod.palette_encode_pass2(exps.data_ptr(), rows, cols, flags.data_ptr(), row_offsets.data_ptr(), nv,
                             vpos.data_ptr() if nv else 0, vexp.data_ptr() if nv else 0, st)
    if dispatch.device_errors(dev):
        raise FormatError("device huffman decode reported corrupt segments during palette transcode")
    hdr = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=h.rows_per_group,
                       cols_per_chunk=h.cols_per_chunk, crc32=h.crc32, pal_size=len(palette), pal_block=C.PAL_BLOCK,
                       num_verbatim=nv, palette=bytes(palette.tobytes()).ljust(16, b"\0"))
    m.replace_planes(hdr, {C.SUFFIX_HDR: torch.from_numpy(hdr.pack()).to(dev), C.SUFFIX_SM: p[C.SUFFIX_SM],
                           C.SUFFIX_IDX: idx, C.SUFFIX_VPOS: vpos, C.SUFFIX_VEXP: vexp})


def _build_lut(m: CompressedWeightMixin):
    if m.is_tied or m.encoding != C.ENC_HUFFMAN or m.device.type != "cuda":
        return
    from ..ops import build_lut
    m.weight_lut = build_lut(m.code_table(), m.exp_lo, m.exp_hi, dispatch.error_counter(m.device))


def _time_cuda(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def _auto_modes(owners: list) -> dict:
    """{id(owner): "dense" | "compressed"} by the rule in the module docstring."""
    out = {}
    by_dev = {}
    for n, m in owners:
        by_dev.setdefault(m.device, []).append((n, m))
    for dev, items in by_dev.items():
        extra = sum(m.decoded_bytes() - m.held_bytes() for _, m in items)
        if dev.type == "cpu":
            choice = "dense" if sum(m.decoded_bytes() for _, m in items) <= 0.5 * _meminfo_available() else "compressed"
            out.update({id(m): choice for _, m in items})
            continue
        free, _total = torch.cuda.mem_get_info(dev)
        budget = 0.8 * free
        if extra <= budget:
            out.update({id(m): "dense" for _, m in items})
            continue
        # Time one layer per distinct shape/encoding: compressed forward vs dense forward.
        cost = {}
        for _, m in items:
            key = (m.n_rows, m.n_cols, m.encoding, type(m).__name__)
            if key in cost or isinstance(m, CompressedEmbedding):
                continue
            x = torch.randn(1, m.n_cols, dtype=torch.bfloat16, device=dev)
            w = m.decode_weight()
            t_c = _time_cuda(lambda: m(x))
            t_d = _time_cuda(lambda: torch.nn.functional.linear(x, w))
            del w
            cost[key] = max(0.0, t_c - t_d)
        ranked = sorted(items, key=lambda it: -cost.get((it[1].n_rows, it[1].n_cols, it[1].encoding,
                                                         type(it[1]).__name__), 0.0)
                        / max(1, it[1].decoded_bytes() - it[1].held_bytes()))
        for _, m in ranked:
            add = m.decoded_bytes() - m.held_bytes()
            if add <= budget and cost.get((m.n_rows, m.n_cols, m.encoding, type(m).__name__), 0.0) > 0:
                out[id(m)] = "dense"
                budget -= add
            else:
                out[id(m)] = "compressed"
    return out


def _decode_fallbacks(model: nn.Module, plan: dict):
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


def prepare(model: nn.Module, mode: str = "auto") -> dict:
    """Finish a model whose compressed modules hold loaded planes: validate, apply `mode`,
    build device tables, reserve scratch.  Returns the summary stored as model.unweight_info."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    plan = getattr(model, "_unweight_plan", {}) or {}
    _decode_fallbacks(model, plan)
    cms = compressed_modules(model)
    owners = [(n, m) for n, m in cms if not m.is_tied]
    for n, m in owners:
        m.check_loaded(n)
    if any(m.device.type == "cuda" for _, m in owners) and not cuda_kernels_available() and mode != "dense":
        _warn_once("nocuda", "unweight: the CUDA kernels (unweight._cuda) are not built; compressed modules on "
                   "the GPU are decoded to dense weights at load")
        mode = "dense"
    if any(m.device.type not in ("cpu", "cuda") for _, m in owners):
        bad = sorted({str(m.device) for _, m in owners if m.device.type not in ("cpu", "cuda")})
        if mode != "dense":
            log.warning("unweight: modules on %s run dense (no decode kernels there)", ", ".join(bad))
    # CUDA decode tables first: auto's timing and the on-device transcode decode through them.
    for _, m in owners:
        _build_lut(m)
    choice = {}
    auto = _auto_modes(owners) if mode == "auto" else {}
    for n, m in owners:
        if m.device.type not in ("cpu", "cuda"):
            choice[id(m)] = "dense"
        elif mode == "auto":
            choice[id(m)] = auto[id(m)]
        elif mode == "dense":
            choice[id(m)] = "dense"
        else:
            choice[id(m)] = mode
    dense_of = {}
    counts = {"dense": 0, "huffman": 0, "palette": 0}
    # Owners first so a tied module finds its source's dense Parameter.
    for n, m in sorted(cms, key=lambda it: it[1].is_tied):
        c = choice[id(m.owner())]
        if c == "dense":
            _to_dense(model, n, m, dense_of)
            counts["dense"] += 1
            continue
        if not m.is_tied and c in ("huffman", "palette"):
            _transcode(m, c)
            _build_lut(m)
        counts[m.encoding_name] += 1
    # Scratch: one per device, the largest decoded weight that decodes into it.
    need = {}
    for n, m in compressed_modules(model):
        if isinstance(m, CompressedEmbedding) and m.device.type == "cpu":
            continue  # CPU embeddings gather rows without the scratch
        k = str(m.device)
        need[k] = max(need.get(k, 0), m.n_rows * m.n_cols)
    for dev, numel in need.items():
        dispatch.reserve_scratch(dev, numel)
    remaining = compressed_modules(model)
    held = sum(m.held_bytes() for _, m in remaining)
    bf16 = sum(m.decoded_bytes() for _, m in remaining if not m.is_tied)
    info = {"mode": mode, "modules": counts, "held_bytes": held, "bf16_bytes": bf16,
            "ratio": held / bf16 if bf16 else None,
            "scratch_bytes": {d: dispatch.scratch_bytes(d) for d in need},
            "tied": plan.get("tied", []),
            "dense_fallback": [f"{fb['module']}.{fb['attr']} ({fb['type']})" for fb in plan.get("dense_fallback", [])],
            "unmatched": plan.get("unmatched", [])}
    model.unweight_info = info
    _guard_tie_weights(model)
    log.info("unweight: %s", json.dumps({k: v for k, v in info.items() if k != "tied"}))
    return info


def _guard_tie_weights(model: nn.Module) -> None:
    """Make later ``model.tie_weights()`` calls (lm-eval's HFLM makes one) keep the tie map
    pruned at load.  Recomputing it from the config would try to tie an lm_head to an
    embedding ``weight`` Parameter that no longer exists: those modules share compressed
    planes structurally instead."""
    orig = getattr(model, "tie_weights", None)
    if orig is None or getattr(orig, "_unweight_guard", False):
        return

    def tie_weights(*args, **kwargs):
        kwargs["recompute_mapping"] = False
        try:
            return orig(*args, **kwargs)
        except TypeError:  # transformers versions without recompute_mapping
            kwargs.pop("recompute_mapping")
            return orig(*args, **kwargs)

    tie_weights._unweight_guard = True
    model.tie_weights = tie_weights


# ------------------------------------------------------------------------ unweight.load


def _model_class(config):
    import transformers
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def load(path: str, device: str | torch.device | None = None, mode: str = "auto", *, model_class=None,
         verify: bool = True, **from_pretrained_kwargs):
    """Load an unweight checkpoint folder as a ready transformers model.

    path: folder written by ``unweight compress`` (config.json + safetensors shards).
    device: "cuda", "cuda:1", "cpu" (default: "cuda" when available, else "cpu"), or "auto"
        / a device_map dict, passed to from_pretrained as device_map.
    mode: "auto" | "huffman" | "palette" | "dense" (see this module's docstring).
    model_class: the transformers class to instantiate (default: config.architectures[0]
        when transformers has it, else AutoModel).
    verify: decode-and-checksum pass at load (structure is always validated).
    Returns the model in eval mode; model.unweight_info summarizes what was done.
    """
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    if not os.path.isdir(path):
        raise InputError(f"{path}: not a folder (unweight.load takes a compressed checkpoint folder)")
    from transformers import AutoConfig

    from .hf_quantizer import register
    register()
    # Fail on a corrupt/truncated folder with our one-line error before transformers opens it.
    CompressedCheckpoint(path).close()
    config = AutoConfig.from_pretrained(path)
    qc = getattr(config, "quantization_config", None)
    qc = dict(qc) if qc is not None else {}
    if qc.get("quant_method") != C.QUANT_METHOD:
        raise InputError(f"{path}: config.json has no unweight quantization_config (compress it with unweight)")
    qc.update(mode=mode, verify=verify)
    config.quantization_config = qc
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, torch.device):
        device = str(device)
    cls = model_class or _model_class(config)
    model = cls.from_pretrained(path, config=config, device_map=device, **from_pretrained_kwargs)
    model.eval()
    return model
