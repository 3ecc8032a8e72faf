"""The one holder of the native extension handles and of raw device pointers.

``unweight._C`` (C++ CPU codec, always built) takes NumPy arrays; ``unweight._cuda`` (CUDA
kernels, built when nvcc was found) takes integer device pointers and an integer stream, so
it has no libtorch ABI dependency.  Only modules of ``unweight.ops`` import this file: every
other layer reaches the kernels through the ``torch.ops.unweight.*`` ops.
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor

from .. import _C  # noqa: F401  (re-exported: the CPU codec)

log = logging.getLogger(__name__)

_STATE: dict = {}


def cuda_module():
    """The compiled ``unweight._cuda`` module, or None when it is not built (cached)."""
    if "mod" not in _STATE:
        try:
            from .. import _cuda  # type: ignore[attr-defined]
            _STATE["mod"] = _cuda
        except ImportError as e:
            log.debug("unweight._cuda not importable: %s", e)
            _STATE["mod"] = None
    return _STATE["mod"]


def cuda_kernels_built() -> bool:
    """True when the CUDA extension was built (a GPU need not be present)."""
    return cuda_module() is not None


def cuda_available() -> bool:
    """True when the CUDA extension is built and torch sees a CUDA device."""
    mod = cuda_module()
    return mod is not None and torch.cuda.is_available() and mod.device_count() > 0


def threads() -> int:
    """CPU codec threads: the user's torch thread setting, so torch.set_num_threads(1) keeps
    the codec on one core too."""
    return max(1, torch.get_num_threads())


def np_view(t: Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a CPU tensor; bf16 is viewed as uint16 (bits, no conversion)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.uint16)
    return t.numpy()


def ptr(t: Tensor) -> int:
    """Device address of t's first element (0 for an empty tensor: the launchers take null
    for empty optional planes)."""
    return t.data_ptr() if t.numel() else 0


def stream(t: Tensor) -> int:
    """The current CUDA stream of t's device as an integer handle."""
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def require_rowmajor(t: Tensor, name: str, rows: int | None = None, cols: int | None = None) -> None:
    """Raise ValueError unless t is a row-major 2-D tensor with unit column stride (any row
    stride >= cols) and, when given, the expected shape."""
    if t.dim() != 2 or (t.numel() and t.stride(1) != 1) or (t.size(0) > 1 and t.stride(0) < t.size(1)):
        raise ValueError(f"{name} must be a row-major 2-D tensor, got shape {tuple(t.shape)} "
                         f"strides {tuple(t.stride())}")
    if rows is not None and t.size(0) != rows or cols is not None and t.size(1) != cols:
        raise ValueError(f"{name} must be [{rows}, {cols}], got {tuple(t.shape)}")


def require_contiguous(name: str, *ts: Tensor) -> None:
    for t in ts:
        if not t.is_contiguous():
            raise ValueError(f"{name}: planes must be contiguous (got strides {tuple(t.stride())})")


def same_device(name: str, ref: Tensor, *ts: Tensor) -> None:
    for t in ts:
        if t.numel() and t.device != ref.device:
            raise ValueError(f"{name}: tensors on {t.device} and {ref.device}")
