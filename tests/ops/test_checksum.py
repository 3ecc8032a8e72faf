"""ops.crc32_ranges: zlib's crc32 of a tensor's bytes, cut into equal ranges, on its device
(CPU here; the CUDA kernel's body is tested through the emulator in tests/cuda/test_crc_logic.py
and on a GPU in tests/cuda/test_kernels_gpu.py)."""
import zlib

import numpy as np
import pytest
import torch

from unweight import ops


def _crcs(t: torch.Tensor) -> list:
    return [int(c) for c in t.view(torch.int32).numpy().view(np.uint32)]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.int64])
def test_ranges_give_zlibs_crc32(dtype):
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, 255, (6, 10), generator=g).to(dtype)
    b = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    for ranges in (1, 2, 3, 6):
        n = len(b) // ranges
        out = ops.crc32_ranges(t, ranges)
        assert out.dtype == torch.uint32 and out.shape == (ranges,)
        assert _crcs(out) == [zlib.crc32(b[r * n:(r + 1) * n]) for r in range(ranges)]


def test_rows_of_a_bf16_matrix_and_the_whole():
    w = torch.randn(5, 7).to(torch.bfloat16)
    rows = _crcs(ops.crc32_ranges(w, 5))
    assert rows == [zlib.crc32(w[r].view(torch.uint8).numpy().tobytes()) for r in range(5)]
    assert _crcs(ops.crc32_ranges(w, 1)) == [zlib.crc32(w.view(torch.uint8).numpy().tobytes())]


def test_empty():
    assert _crcs(ops.crc32_ranges(torch.empty(0, dtype=torch.bfloat16), 0)) == []
    assert _crcs(ops.crc32_ranges(torch.empty(0, dtype=torch.uint8), 3)) == [0, 0, 0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="equal ranges"):
        ops.crc32_ranges(torch.zeros(10, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="contiguous"):
        ops.crc32_ranges(torch.zeros(4, 4, dtype=torch.uint8).t(), 1)


def test_fake_tensor_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        out = torch.ops.unweight.crc32_ranges(torch.empty(8, 4, dtype=torch.bfloat16), 8)
    assert out.shape == (8,) and out.dtype == torch.uint32
