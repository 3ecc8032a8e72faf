"""GPU tests of the unweight._cuda kernels against the CPU codec (skipped without a GPU)."""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.format.errors import FormatError

from .helpers import bf16_to_f64, make_weights

torch = pytest.importorskip("torch")
try:
    from unweight import _cuda
except ImportError:
    _cuda = None

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_cuda is None or not torch.cuda.is_available() or _cuda.device_count() == 0,
                       reason="needs a CUDA GPU and unweight._cuda"),
]

SHAPES = [(1, 1), (1, 63), (63, 65), (65, 64), (7, 4097), (129, 256), (300, 520), (1024, 4096)]


def _ops():
    from unweight.runtime import cuda_ops
    return cuda_ops


def _bits(t):
    return t.view(torch.int16).cpu().numpy().view(np.uint16)


@pytest.mark.parametrize("shape", SHAPES)
def test_huffman_decode_bitwise(shape):
    ops = _ops()
    w = make_weights(*shape, seed=shape[0] + shape[1])
    enc = tc.encode(w, "huffman", segment_weights=512)
    g = ops.to_device(enc.planes)
    assert np.array_equal(_bits(ops.decode_huffman(enc.header, g)), w)
    h = enc.header
    g0, c0 = h.n_groups // 2, h.n_chunks // 2
    sub = ops.decode_huffman(h, g, groups=(g0, h.n_groups), chunks=(c0, h.n_chunks))
    assert np.array_equal(_bits(sub), w[g0 * h.rows_per_group:, c0 * h.cols_per_chunk:])


def test_huffman_decode_reports_corruption():
    ops = _ops()
    w = make_weights(128, 512, seed=1)
    enc = tc.encode(w, "huffman", segment_weights=512)
    planes = dict(enc.planes)
    bad = planes[C.SUFFIX_EXP].copy()
    bad[: bad.size - C.STREAM_SLACK_BYTES] ^= 0x5A
    planes[C.SUFFIX_EXP] = bad
    with pytest.raises(FormatError):
        ops.decode_huffman(enc.header, ops.to_device(planes))
    torch.cuda.synchronize()  # the context must still be healthy
    assert np.array_equal(_bits(ops.decode_huffman(enc.header, ops.to_device(enc.planes))), w)


@pytest.mark.parametrize("shape", SHAPES)
def test_palette_decode_bitwise(shape):
    ops = _ops()
    w = make_weights(*shape, seed=3 * shape[0] + shape[1])
    enc = tc.encode(w, "palette")
    g = ops.to_device(enc.planes)
    h = enc.header
    assert np.array_equal(_bits(ops.decode_palette(h, g)), w)
    r0, k0 = h.rows // 3, (h.cols // 16) * 8
    assert np.array_equal(_bits(ops.decode_palette(h, g, rows=(r0, h.rows), cols=(k0, h.cols))), w[r0:, k0:])


@pytest.mark.parametrize("shape", SHAPES)
def test_transcode_bitwise(shape):
    ops = _ops()
    w = make_weights(*shape, seed=shape[1])
    enc = tc.encode(w, "huffman")
    hdr, g = ops.transcode_to_palette(enc.header, ops.to_device(enc.planes))
    ref = tc.transcode_to_palette(enc.header, enc.planes)
    assert hdr.palette == ref.header.palette and hdr.num_verbatim == ref.header.num_verbatim
    assert np.array_equal(g[C.SUFFIX_IDX].cpu().numpy(), ref.planes[C.SUFFIX_IDX])
    assert np.array_equal(g[C.SUFFIX_VPOS].cpu().numpy().view(np.uint32), ref.planes[C.SUFFIX_VPOS])
    assert np.array_equal(g[C.SUFFIX_VEXP].cpu().numpy(), ref.planes[C.SUFFIX_VEXP])
    assert np.array_equal(hdr.pack(), ref.header.pack())


def _err(y, ref):
    return float(np.abs(y - ref).max())


@pytest.mark.parametrize("M", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("NK", [(1, 8), (33, 264), (1024, 4096), (4096, 1024)])
def test_fused_gemm_accuracy_and_determinism(M, NK):
    ops = _ops()
    N, K = NK
    w = make_weights(N, K, seed=N + K)
    enc = tc.encode(w, "palette")
    g = ops.to_device(enc.planes)
    xb = make_weights(M, K, seed=M, spread=False)
    x = torch.from_numpy(xb.view(np.int16)).cuda().view(torch.bfloat16)
    ref = bf16_to_f64(xb) @ bf16_to_f64(w).T
    y = ops.palette_gemm(x, enc.header, g)
    wt = torch.from_numpy(w.view(np.int16)).cuda().view(torch.bfloat16)
    y_cublas = (x @ wt.T).float().cpu().numpy().astype(np.float64)
    got = y.float().cpu().numpy().astype(np.float64)
    # 2x cuBLAS' own error, with a floor of 1/1000 bf16 ulp of the largest output for exact cases
    assert _err(got, ref) <= 2 * _err(y_cublas, ref) + 2.0 ** -18 * float(np.abs(ref).max())
    for _ in range(3):
        assert torch.equal(ops.palette_gemm(x, enc.header, g).view(torch.int16), y.view(torch.int16))
