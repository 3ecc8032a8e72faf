"""The one holder of the native extension handles and of raw device pointers, and of the
direct callers of the ops' kernels (``direct``; ops/run.py).

``unweight._C`` (C++ CPU codec, always built) takes NumPy arrays; ``unweight._cuda`` (CUDA
kernels, built when nvcc was found) takes integer device pointers and an integer stream, so
it has no libtorch ABI dependency.  Only modules of ``unweight.ops`` import this file: every
other layer reaches the kernels through the ``torch.ops.unweight.*`` ops.
"""
from __future__ import annotations

import contextlib
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


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # in torch's CUDA builds
_RAW_CHECKED: dict = {}  # device index -> whether the raw handle matched the Stream's there


def stream(t: Tensor) -> int:
    """The current CUDA stream of t's device as an integer handle: the raw handle inductor
    reads too, where torch has it (no Stream object made per launch), else through a Stream.
    The raw handle is compared with the Stream's once per device and used only if they agree."""
    idx = t.device.index
    if _RAW_STREAM is not None and idx is not None:
        ok = _RAW_CHECKED.get(idx)
        if ok is None:
            try:
                ok = int(_RAW_STREAM(idx)) == int(torch.cuda.current_stream(idx).cuda_stream)
            except (RuntimeError, TypeError):
                ok = False
            _RAW_CHECKED[idx] = ok
            if not ok:
                log.info("unweight: torch's raw stream handle disagrees with its Stream on cuda:%d; using the Stream",
                         idx)
        if ok:
            return int(_RAW_STREAM(idx))
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


def vrow_ptr(name: str, vrow: Tensor | None, ref: Tensor, n: int) -> int:
    """The device pointer of a verbatim row index (ops.verbatim_rows: uint32, n entries,
    contiguous, on ref's device) for a kernel, or 0 for none (the kernel then searches vpos)."""
    if vrow is None:
        return 0
    if vrow.dtype != torch.uint32 or vrow.numel() != n or not vrow.is_contiguous():
        raise ValueError(f"{name}: vrow must be a contiguous uint32 row index of {n} entries (ops.verbatim_rows), "
                         f"got {vrow.dtype} {tuple(vrow.shape)}")
    same_device(name, ref, vrow)
    return ptr(vrow)


# What direct_ok asks torch; where a torch lacks one of these, every call takes the op.
_PROBES = (getattr(torch._C, "_len_torch_dispatch_stack", None), getattr(torch._C, "_get_tracing_state", None),
           getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None),
           getattr(torch, "_is_functional_tensor", None), getattr(torch.autograd, "_profiler_enabled", None),
           getattr(torch.autograd.graph, "increment_version", None))
_PROBED = all(p is not None for p in _PROBES)
_DIRECT = {"on": _PROBED}
if not _PROBED:
    log.info("unweight: this torch lacks what the direct kernel calls check; every op goes through the dispatcher")


@contextlib.contextmanager
def direct_calls(on: bool):
    """Within it, the direct kernel calls (direct) are on or off process-wide (off: every call
    goes through torch's dispatcher, as scripts/bench_host.py compares); the setting before
    comes back after.  On by default, where torch has every probe."""
    prev = _DIRECT["on"]
    _DIRECT["on"] = bool(on) and _PROBED
    try:
        yield
    finally:
        _DIRECT["on"] = prev


def direct_ok(x: Tensor) -> bool:
    """Whether an op called on x may run its kernel directly rather than through torch's
    dispatcher: x is a plain tensor (no FakeTensor, FunctionalTensor or other subclass, no
    functorch or functionalization wrapper) that autograd does not track, and no dispatch mode
    (FakeTensorMode, FlopCounterMode, ...), profiler or torch.jit.trace is on to see the op.  Outside a
    torch.compile trace only (the caller checks that first)."""
    return (type(x) is Tensor and not (x.requires_grad and torch.is_grad_enabled())
            and not torch._C._len_torch_dispatch_stack() and not torch.autograd._profiler_enabled()
            and torch._C._get_tracing_state() is None
            and not torch._C._functorch.is_functorch_wrapped_tensor(x) and not torch._is_functional_tensor(x))


def direct(op, **kernels):
    """A caller of the custom op `op` (torch.ops.unweight.<name>) that, in eager mode, runs the
    kernel registered for its first tensor argument's device type (kernels: {"cuda": fn,
    "cpu": fn}, the very functions registered with op.register_kernel) without the
    dispatcher, and bumps the version counter of each argument the op writes, as the
    dispatcher does; under a compile trace, fake tensors, a dispatch mode, autograd or the
    profiler (direct_ok), or for another device, it calls the op.  The same kernel runs either
    way, so the results are the same bits.

    Why: a torch.library custom op passes through the dispatcher's Python layers (autograd,
    ADInplaceOrView, the backend wrapper) on every call: ~17 us for an op that writes no
    argument and ~70 us for one that does (torch's fill_defaults, quadratic in the number of
    arguments) on a 2-core box, against ~3 us for a C++ op; a compressed layer's forward calls
    one or two."""
    schema = op.default._schema
    writes = [(i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    bump = _PROBES[-1]  # torch.autograd.graph.increment_version (direct calls are off without it)

    def call(*args, **kwargs):
        if _DIRECT["on"] and not torch.compiler.is_compiling():
            x = args[0] if isinstance(args[0], Tensor) else next(iter(args[0]), None)  # (a list of planes)
            fn = kernels.get(x.device.type) if isinstance(x, Tensor) else None
            # every tensor argument plain (a DTensor or other subclass among the planes: the op)
            if fn is not None and direct_ok(x) and all(type(a) is Tensor for a in args
                                                       if isinstance(a, Tensor) and a is not x):
                out = fn(*args, **kwargs)
                for i, name in writes:
                    t = args[i] if i < len(args) else kwargs.get(name)
                    if isinstance(t, Tensor):
                        bump(t)
                return out
        return op(*args, **kwargs)
    call.__name__ = call.__qualname__ = f"direct_{schema.name.split('::')[-1]}"
    call.op, call.kernels = op, dict(kernels)
    return call
