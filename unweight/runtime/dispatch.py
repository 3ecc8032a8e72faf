"""The single dispatch point between compressed modules and the ops that run them.

CompressedLinear.forward -> linear(); CompressedEmbedding.forward -> embedding().  The
baseline is "decode into the per-device scratch buffer, then F.linear / F.embedding".  Fused
kernels (a later issue) plug in with register_linear_impl(): each registered function gets
(module, x) and returns the output, or None to pass; the first non-None answer wins, so a
fused palette GEMV can claim M <= 16 on CUDA and leave everything else to the baseline.

Scratch: ONE bf16 buffer per device, sized at load time (reserve_scratch) to the largest
decoded layer that will decode into it.  Every compressed module on that device decodes into
a prefix view of it and consumes it immediately, so forwards never allocate for weights and
CUDA-graph capture sees no allocation.  The consequence: forwards on one device must not run
concurrently from several host threads (CUDA work on one stream is ordered, so GPU overlap
is fine).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import ops  # noqa: F401  (registers torch.ops.unweight.*)
from ..format import constants as C

log = logging.getLogger(__name__)

_SCRATCH: dict[str, Tensor] = {}
_ERR: dict[str, Tensor] = {}
_LINEAR_IMPLS: list[Callable] = []
_EMBEDDING_IMPLS: list[Callable] = []


def _key(device) -> str:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return str(d)


def reserve_scratch(device, numel: int) -> Tensor:
    """Make the scratch buffer of `device` hold at least `numel` bf16 words; return it.

    Called at load time; it only ever grows (a second model on the same device shares it).
    """
    k = _key(device)
    buf = _SCRATCH.get(k)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(int(numel), dtype=torch.bfloat16, device=k)
        _SCRATCH[k] = buf
        log.info("unweight scratch on %s: %.1f MiB", k, buf.numel() * 2 / 2**20)
    return buf


def scratch_bytes(device) -> int:
    buf = _SCRATCH.get(_key(device))
    return 0 if buf is None else buf.numel() * 2


def release_scratch(device=None):
    """Drop the scratch buffer(s) (tests, or after unloading every compressed model)."""
    if device is None:
        _SCRATCH.clear()
    else:
        _SCRATCH.pop(_key(device), None)


def error_counter(device) -> Tensor:
    """int32 [1] counter on `device` that device-side decodes add data errors to."""
    k = _key(device)
    e = _ERR.get(k)
    if e is None:
        e = torch.zeros(1, dtype=torch.int32, device=k)
        _ERR[k] = e
    return e


def device_errors(device) -> int:
    """Data errors counted by device decodes so far (synchronizes; call outside forward)."""
    return int(error_counter(device).item())


def register_linear_impl(fn: Callable, first: bool = True):
    """Plug in a fused linear: fn(module, x) -> Tensor | None.  Returns fn (usable as decorator)."""
    if first:
        _LINEAR_IMPLS.insert(0, fn)
    else:
        _LINEAR_IMPLS.append(fn)
    return fn


def register_embedding_impl(fn: Callable):
    """Plug in a device gather: fn(module, ids) -> Tensor | None."""
    _EMBEDDING_IMPLS.insert(0, fn)
    return fn


def unregister_impl(fn: Callable):
    for lst in (_LINEAR_IMPLS, _EMBEDDING_IMPLS):
        while fn in lst:
            lst.remove(fn)


# ------------------------------------------------------------------------ decoding


def decode_into(m, out: Tensor) -> Tensor:
    """Decode module m's whole weight into out (bf16, >= rows*cols words, m's device).

    Returns the [rows, cols] view of out that now holds the weight.
    """
    w = out[: m.n_rows * m.n_cols].view(m.n_rows, m.n_cols)
    p = m.planes()
    err = error_counter(w.device)
    if m.encoding == C.ENC_HUFFMAN:
        torch.ops.unweight.decode_huffman(p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], m.code_table(),
                                          m.lut(), w, err, m.n_rows, m.n_cols, m.rows_per_group, m.cols_per_chunk,
                                          m.exp_lo, m.exp_hi)
    else:
        torch.ops.unweight.decode_palette(p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP], w,
                                          err, m.n_rows, m.n_cols, m.palette)
    return w


def decode_weight(m, device=None) -> Tensor:
    """The weight of m as a new bf16 [rows, cols] tensor (load-time dense conversion only)."""
    return decode_into(m, torch.empty(m.n_rows * m.n_cols, dtype=torch.bfloat16, device=device or m.device))


def _scratch_weight(m, device) -> Tensor:
    buf = _SCRATCH.get(_key(device))
    need = m.n_rows * m.n_cols
    if buf is None or buf.numel() < need:
        # Only reachable when a module was built outside unweight.load / from_pretrained (or
        # moved to another device afterwards): grow once, loudly, then stay allocation-free.
        log.info("unweight: scratch on %s grown to %d weights outside load (modules built by hand, or "
                 "a model moved after loading: call unweight.runtime.loader.prepare(model))", device, need)
        buf = reserve_scratch(device, need)
    return decode_into(m, buf)


def linear(m, x: Tensor) -> Tensor:
    """y = x @ W.T + b for a CompressedLinear m.  x: [..., cols] on m's device; y: [..., rows]."""
    for impl in _LINEAR_IMPLS:
        y = impl(m, x)
        if y is not None:
            return y
    w = _scratch_weight(m, x.device)
    b = m.bias
    if w.dtype != x.dtype:  # e.g. a model cast to fp32: same bits, converted copy
        w = w.to(x.dtype)
        b = None if b is None else b.to(x.dtype)
    return F.linear(x, w, b)


def embedding(m, ids: Tensor) -> Tensor:
    """Rows of a CompressedEmbedding m.  ids: int64/int32 [...] ; result bf16 [..., cols]."""
    for impl in _EMBEDDING_IMPLS:
        y = impl(m, ids)
        if y is not None:
            return y
    p = m.planes()
    if ids.device.type == "cpu":
        if m.encoding == C.ENC_HUFFMAN:
            flat = torch.ops.unweight.gather_rows_huffman(ids, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF],
                                                          m.code_table(), m.n_rows, m.n_cols, m.rows_per_group,
                                                          m.cols_per_chunk, m.exp_lo, m.exp_hi)
        else:
            flat = torch.ops.unweight.gather_rows_palette(ids, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], p[C.SUFFIX_VPOS],
                                                          p[C.SUFFIX_VEXP], m.n_rows, m.n_cols, m.palette)
        return flat.view(*ids.shape, m.n_cols)
    # Device without a row-gather kernel: finding the needed row groups would need the ids on
    # the host (a sync per forward), so decode the table into scratch and gather there.
    return F.embedding(ids, _scratch_weight(m, ids.device))


# Measured fused-kernel dispatch (unweight/runtime/tuning.py): on CUDA it runs a fused kernel
# only where the tuning table recorded it beating decode + cuBLAS; off CUDA it returns None,
# so CPU forwards stay decode + F.linear.  Appended behind (first=False) the impls callers
# register, so an explicit register_linear_impl still takes precedence.
from . import tuning as _tuning  # noqa: E402

register_linear_impl(_tuning.fused_linear, first=False)
