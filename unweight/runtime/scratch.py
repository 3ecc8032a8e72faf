"""Per-device scratch memory and the device error counters.

Scratch: ONE bf16 buffer per device, sized at load time (reserve) to the largest decoded
weight that decodes into it, one fp32 workspace per device for the fused kernel's partial
sums, and one int32 buffer of arrival counters the fused kernel keeps at zero between
launches.  Every compressed layer on a device decodes into a prefix view of the buffer and
consumes it at once, so forwards never allocate for weights and CUDA-graph capture sees no
allocation.  The consequence: forwards on one device must not run concurrently from several
host threads or streams (work on one CUDA stream is ordered, so GPU overlap is fine).

Error counters: int32 [1] per device that the CUDA decoders add data errors to (they cannot
raise without a host sync).  ``check_device_errors`` reads one back outside the forward.
"""
from __future__ import annotations

import logging

import torch
from torch import Tensor

from ..format.errors import FormatError

log = logging.getLogger(__name__)

_WEIGHTS: dict[str, Tensor] = {}
_WORKSPACE: dict[str, Tensor] = {}
_COUNTERS: dict[str, Tensor] = {}
_ERR: dict[str, Tensor] = {}


_KEYS: dict = {}


def device_key(device) -> str:
    """Canonical name of a device ("cuda" resolved to "cuda:<current>").  Remembered per device
    (every forward asks, with the tensor's own torch.device) except a bare "cuda", whose
    meaning follows the current device."""
    k = _KEYS.get(device)
    if k is not None:
        return k
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return str(torch.device("cuda", torch.cuda.current_device()))
    k = _KEYS[device] = str(d)
    return k


def _grow(store: dict, device, numel: int, dtype, what: str | None, zeros: bool = False) -> Tensor:
    """The buffer of `store` for `device`, replaced by a new one of `numel` elements (zeroed
    with `zeros`) when missing or smaller; `what` names it in the log line (None: no line)."""
    k = device_key(device)
    buf = store.get(k)
    if buf is None or buf.numel() < numel:
        # A normal tensor even when first asked for under torch.inference_mode(): it outlives
        # that forward, and writing into an inference tensor outside the mode raises.
        with torch.inference_mode(False):
            buf = (torch.zeros if zeros else torch.empty)(int(numel), dtype=dtype, device=k)
        store[k] = buf
        if what:
            log.info("unweight %s on %s: %.1f MiB", what, k, buf.numel() * buf.element_size() / 2**20)
    return buf


def reserve(device, numel: int) -> Tensor:
    """Make the bf16 scratch of `device` hold at least `numel` weights; return it (load time;
    it only grows, and every model on the device shares it)."""
    return _grow(_WEIGHTS, device, numel, torch.bfloat16, "scratch")


def reserve_workspace(device, numel: int) -> Tensor:
    """Make the fp32 fused-kernel workspace of `device` hold at least `numel` floats."""
    return _grow(_WORKSPACE, device, numel, torch.float32, "workspace")


def weights(device, numel: int) -> Tensor:
    """A bf16 view of >= numel words of the device's scratch (grown, with a log line, only
    for modules built outside the loader, which reserves at load)."""
    buf = _WEIGHTS.get(device_key(device))
    if buf is None or buf.numel() < numel:
        log.info("unweight: scratch on %s grown to %d weights outside load (modules built by hand or moved after "
                 "loading: call unweight.runtime.prepare.prepare(model))", device, numel)
        buf = reserve(device, numel)
    return buf


def workspace(device, numel: int) -> Tensor:
    """The fp32 workspace of `device`, at least `numel` floats (grown when smaller)."""
    buf = _WORKSPACE.get(device_key(device))
    if buf is None or buf.numel() < numel:
        buf = reserve_workspace(device, numel)
    return buf


def counters(device, numel: int) -> Tensor:
    """int32 [>= numel] zeros on `device` for the fused kernel's arrival counters (a launch
    leaves them zero; grown as a new zeroed buffer when smaller)."""
    buf = _COUNTERS.get(device_key(device))
    if buf is None or buf.numel() < numel:
        buf = _grow(_COUNTERS, device, max(int(numel), 1024), torch.int32, None, zeros=True)
    return buf


def scratch_bytes(device) -> int:
    k = device_key(device)
    return sum(int(s[k].numel() * s[k].element_size()) for s in (_WEIGHTS, _WORKSPACE) if k in s)


def release(device=None) -> None:
    """Drop the scratch buffers (of one device, or all) after unloading compressed models."""
    for store in (_WEIGHTS, _WORKSPACE, _COUNTERS):
        if device is None:
            store.clear()
        else:
            store.pop(device_key(device), None)


def error_counter(device) -> Tensor:
    """int32 [1] counter on `device` that device-side decodes add data errors to."""
    return _grow(_ERR, device, 1, torch.int32, None, zeros=True)


def device_errors(device) -> int:
    """Data errors counted on `device` so far (synchronizes: call outside forwards)."""
    return int(error_counter(device).item())


def reset_device_errors(device) -> None:
    """Zero the device's error counter (after a reported error has been dealt with)."""
    error_counter(device).zero_()


def check_device_errors(device, where: str = "") -> None:
    """Raise FormatError when a device decode counted corrupt data (synchronizes)."""
    n = device_errors(device)
    if n:
        raise FormatError(f"{where + ': ' if where else ''}{n} corrupt segment(s) or block(s) found by the decoders "
                          f"on {device_key(device)} (memory corrupted after load?)")
