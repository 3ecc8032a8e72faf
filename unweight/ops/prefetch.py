"""L2 prefetch of whole weights (csrc/cuda/prefetch.cuh).

    torch.ops.unweight.prefetch_l2(planes)                                   CUDA
        planes: up to 4 tensors on one CUDA device (a palette weight's sm and idx, say) whose
        bytes are brought into L2 by a few CTAs on the current stream.  A hint: it reads and
        writes nothing, so it cannot change a result; runtime/prefetch.py runs it on a side
        stream while compute-light kernels run, so the next matmul's loads wait on L2.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from ..runtime import kernel_plan as plan
from . import _ext

__all__ = ["prefetch_l2"]


@torch.library.custom_op("unweight::prefetch_l2", mutates_args=())
def prefetch_l2(planes: List[Tensor]) -> None:
    raise NotImplementedError("unweight::prefetch_l2 has no kernel for this device")


@prefetch_l2.register_fake
def _(planes):
    return None


@prefetch_l2.register_kernel("cuda")
def _prefetch_l2_cuda(planes):
    if len(planes) > plan.PREFETCH_MAX_RANGES:
        raise ValueError(f"prefetch_l2: at most {plan.PREFETCH_MAX_RANGES} tensors")
    _ext.require_contiguous("prefetch_l2", *planes)
    if not planes:
        return
    with torch.cuda.device_of(planes[0]):
        _ext.cuda_module().prefetch_l2([_ext.ptr(t) for t in planes], [t.numel() * t.element_size() for t in planes],
                                       _ext.stream(planes[0]))
