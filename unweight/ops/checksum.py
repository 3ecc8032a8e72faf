"""CRC-32 of tensors' bytes where they live (csrc/cuda/crc32.cuh on a GPU).

    torch.ops.unweight.crc32_ranges(data, ranges) -> Tensor                 CPU, CUDA
        data: a contiguous tensor of any dtype whose bytes (numel * element_size, C order)
        are cut into `ranges` equal consecutive ranges.  Returns uint32 [ranges] on data's
        device: each range's crc32 as zlib computes it (the checksum every tensor header
        stores).  CUDA: a memset and one launch on the current stream, no host sync, so a
        load checks what a GPU holds without copying it back; CPU: the C++ codec's crc32.

The device kernel exists because nothing in the dependency set computes a CRC on a GPU
(torch, cupy and numpy have none), and a load-time check of hundreds of GB per GPU should not
cross PCIe or wait on a host decode.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import _ext

__all__ = ["crc32_ranges"]

_TABLES: dict = {}  # device -> uint32 [16, 256] stride tables on it


def _table(device: torch.device) -> Tensor:
    t = _TABLES.get(device)
    if t is None:
        host = torch.from_numpy(np.ascontiguousarray(_ext.cuda_module().crc32_stride_table()).view(np.int32))
        t = _TABLES[device] = host.to(device).view(torch.uint32)
    return t


def _check(data: Tensor, ranges: int) -> int:
    if not data.is_contiguous():
        raise ValueError("crc32_ranges: data must be contiguous")
    nbytes = data.numel() * data.element_size()
    if ranges < 0 or (ranges == 0 and nbytes) or (ranges and nbytes % ranges):
        raise ValueError(f"crc32_ranges: {nbytes} bytes do not cut into {ranges} equal ranges")
    return nbytes // ranges if ranges else 0


@torch.library.custom_op("unweight::crc32_ranges", mutates_args=())
def crc32_ranges(data: Tensor, ranges: int) -> Tensor:
    raise NotImplementedError("unweight::crc32_ranges has no kernel for this device")


@crc32_ranges.register_fake
def _(data, ranges):
    return data.new_empty((ranges,), dtype=torch.uint32)


@crc32_ranges.register_kernel("cpu")
def _crc32_ranges_cpu(data, ranges):
    n = _check(data, ranges)
    b = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else np.zeros(0, np.uint8)
    out = np.array([_ext._C.crc32(b[r * n:(r + 1) * n], _ext.threads()) for r in range(ranges)], dtype=np.uint32)
    return torch.from_numpy(out.view(np.int32)).view(torch.uint32)


@crc32_ranges.register_kernel("cuda")
def _crc32_ranges_cuda(data, ranges):
    n = _check(data, ranges)
    out = torch.empty(ranges, dtype=torch.uint32, device=data.device)
    if ranges:
        with torch.cuda.device_of(data):
            _ext.cuda_module().crc32_ranges(_ext.ptr(data), n, ranges, _ext.ptr(_table(data.device)), _ext.ptr(out),
                                            _ext.stream(data))
    return out
