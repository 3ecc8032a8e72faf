"""CRC-32 of tensors' bytes where they live (csrc/cuda/crc32.cuh on a GPU).

    torch.ops.unweight.crc32_ranges(data, ranges) -> Tensor                 CPU, CUDA
        data: a contiguous tensor of any dtype whose bytes (numel * element_size, C order)
        are cut into `ranges` equal consecutive ranges.  Returns uint32 [ranges] on data's
        device: each range's crc32 as zlib computes it (the checksum every tensor header
        stores).  CUDA: a memset and one launch on the current stream, no host sync, so a
        load checks what a GPU holds without copying it back; CPU: the C++ codec's crc32.

    kernel_ok(device) -> bool
        Whether the device kernel gives zlib's crc32s on `device`: a self-test run once per
        device and process, at its first crc32_ranges (odd offsets and lengths, ranges inside
        and across the kernel's 32 KiB pieces, against zlib on the host; one sync).  Where it
        fails, crc32_ranges on that device copies the bytes to the host and hashes them there,
        with one warning: slower, never a wrong checksum, so a kernel fault cannot pass for a
        corrupt checkpoint or hide one.

    kernel_crc32_ranges(data, ranges) -> Tensor
        crc32_ranges through the device kernel whatever its self-test said (the GPU checks).

The device kernel exists because nothing in the dependency set computes a CRC on a GPU
(torch, cupy and numpy have none), and a load-time check of hundreds of GB per GPU should not
cross PCIe or wait on a host decode.
"""
from __future__ import annotations

import logging
import zlib

import numpy as np
import torch
from torch import Tensor

from . import _ext

__all__ = ["crc32_ranges", "kernel_ok", "kernel_crc32_ranges", "self_test"]

log = logging.getLogger(__name__)

_TABLES: dict = {}  # device -> uint32 [16, 256] stride tables on it
_KERNEL_OK: dict = {}  # device -> whether the device kernel passed its self-test there

# The self-test's (first byte, bytes per range, ranges) over a fixed buffer: ranges inside one
# 32 KiB piece, across pieces and strides, at odd starts and lengths, and many small ones.
_SELF_TEST = ((5, 70001, 3), (0, 65536 * 3, 1), (16, 32768, 4), (3, 125, 8), (1, 1, 33), (0, 0, 0))
_SELF_TEST_BYTES = 5 + 3 * 70001 + 1


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


def _host(data: Tensor, ranges: int) -> Tensor:
    """crc32_ranges of a device tensor hashed on the host, returned on its device."""
    return _crc32_ranges_cpu(data.cpu(), ranges).to(data.device)


def kernel_crc32_ranges(data: Tensor, ranges: int) -> Tensor:
    """crc32_ranges of a CUDA tensor through the device kernel (never the host fallback)."""
    n = _check(data, ranges)
    out = torch.empty(ranges, dtype=torch.uint32, device=data.device)
    if ranges:
        with torch.cuda.device_of(data):
            _ext.cuda_module().crc32_ranges(_ext.ptr(data), n, ranges, _ext.ptr(_table(data.device)), _ext.ptr(out),
                                            _ext.stream(data))
    return out


def self_test(device: torch.device, hash_ranges=None) -> bool:
    """Whether hash_ranges(data, ranges) (default: the device kernel) gives zlib's crc32 of
    every range of _SELF_TEST over a fixed pseudo-random buffer (with runs of 0x00 and 0xFF)
    placed on `device`.  One host sync."""
    hash_ranges = hash_ranges or kernel_crc32_ranges
    raw = np.random.default_rng(0x0C2C32).integers(0, 256, _SELF_TEST_BYTES, dtype=np.uint8)
    raw[40000:90000] = 0xFF
    raw[120000:121000] = 0
    buf = torch.from_numpy(raw).to(device)
    got, want = [], []
    for first, n, ranges in _SELF_TEST:
        got.append(hash_ranges(buf[first:first + n * ranges], ranges))
        want += [zlib.crc32(raw[first + r * n:first + (r + 1) * n].tobytes()) for r in range(ranges)]
    host = torch.cat([g.view(torch.int32) for g in got]).cpu().numpy().view(np.uint32)
    return [int(c) for c in host] == want


def kernel_ok(device: torch.device) -> bool:
    """Whether the device kernel passed its self-test on `device` (run at the first ask)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ok = _KERNEL_OK.get(device)
    if ok is None:
        ok = _KERNEL_OK[device] = self_test(device)
        if not ok:
            log.warning("unweight: the CUDA crc32 kernel gave checksums other than zlib's on %s (its self-test); "
                        "load checks hash that device's weights on the host", device)
    return ok


@crc32_ranges.register_kernel("cuda")
def _crc32_ranges_cuda(data, ranges):
    _check(data, ranges)
    return kernel_crc32_ranges(data, ranges) if kernel_ok(data.device) else _host(data, ranges)
