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


def test_self_test_passes_zlibs_crc32_and_fails_any_other():
    from unweight.ops import checksum
    assert checksum.self_test(torch.device("cpu"), ops.crc32_ranges)

    def one_off(data, ranges):  # right everywhere but one range of one call
        out = ops.crc32_ranges(data, ranges)
        if ranges == 8:
            out.view(torch.int32)[5] ^= 1 << 31
        return out
    assert not checksum.self_test(torch.device("cpu"), one_off)


@pytest.mark.parametrize("kernel_right", [True, False])
def test_a_device_whose_kernel_fails_its_self_test_hashes_on_the_host(monkeypatch, caplog, kernel_right):
    """The CUDA registration's choice, taken on CPU tensors: the device kernel where its
    self-test passed, else the host's zlib-equal crc32 with one warning per device; the
    checksums are right either way."""
    from unweight.ops import checksum
    calls = []

    def kernel(data, ranges):
        calls.append(ranges)
        out = ops.crc32_ranges(data, ranges)
        return out if kernel_right else out ^ 1
    monkeypatch.setattr(checksum, "kernel_crc32_ranges", kernel)
    monkeypatch.setattr(checksum, "_KERNEL_OK", {})
    t = torch.arange(4096, dtype=torch.int16)
    want = _crcs(ops.crc32_ranges(t, 4))
    for _ in range(2):
        assert _crcs(checksum._crc32_ranges_cuda(t, 4)) == want
    assert checksum.kernel_ok(torch.device("cpu")) is kernel_right
    assert calls == [r for _, _, r in checksum._SELF_TEST] + ([4, 4] if kernel_right else [])
    warned = [r for r in caplog.records if "self-test" in r.getMessage()]
    assert len(warned) == (0 if kernel_right else 1)
