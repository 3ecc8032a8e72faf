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


def _corrupt_huffman():
    """A 128x512 huffman tensor whose exponent stream (slack excluded) is scrambled."""
    w = make_weights(128, 512, seed=1)
    enc = tc.encode(w, "huffman", segment_weights=512)
    planes = dict(enc.planes)
    bad = planes[C.SUFFIX_EXP].copy()
    bad[: bad.size - C.STREAM_SLACK_BYTES] ^= 0x5A
    planes[C.SUFFIX_EXP] = bad
    return enc, planes


def test_huffman_decode_reports_corruption():
    ops = _ops()
    enc, planes = _corrupt_huffman()
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


# ------------------------------------------------------------------ fused Huffman GEMV/GEMM
HGEMM_CASES = [(1, 8, None), (33, 264, None), (63, 65, (3, 7)), (7, 4097, (2, 512)), (1024, 4096, None),
               (4096, 1024, None), (4096, 14336, None), (300, 520, (4, 40))]


@pytest.mark.parametrize("M", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("N,K,grid", HGEMM_CASES)
def test_fused_huffman_gemm_accuracy_determinism_and_emulation(M, N, K, grid):
    ops = _ops()
    w = make_weights(N, K, seed=N + 3 * K)
    enc = tc.encode(w, "huffman", grid=grid) if grid else tc.encode(w, "huffman")
    g = ops.to_device(enc.planes)
    lut = ops.huffman_lut(enc.header, "cuda")
    xb = make_weights(M, K, seed=M, spread=False)
    x = torch.from_numpy(xb.view(np.int16)).cuda().view(torch.bfloat16)
    ref = bf16_to_f64(xb) @ bf16_to_f64(w).T
    y = ops.huffman_gemm(x, enc.header, g, lut=lut)
    got = y.float().cpu().numpy().astype(np.float64)
    assert np.isfinite(got).all()
    wt = torch.from_numpy(w.view(np.int16)).cuda().view(torch.bfloat16)
    y_cublas = (x @ wt.T).float().cpu().numpy().astype(np.float64)
    assert _err(got, ref) <= 2 * _err(y_cublas, ref) + 2.0 ** -18 * float(np.abs(ref).max())
    for _ in range(3):  # no race: repeated runs are bitwise equal
        assert torch.equal(ops.huffman_gemm(x, enc.header, g, lut=lut).view(torch.int16), y.view(torch.int16))
    # the device computes exactly what the host emulation of its bodies computes
    h, p = enc.header, enc.planes
    y_emu, nerr = _cuda.emulate_huffman_gemm(xb, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF],
                                             h.rows_per_group, h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi)
    assert nerr == 0 and np.array_equal(_bits(y), y_emu)


def test_fused_huffman_gemm_reports_corruption():
    ops = _ops()
    enc, planes = _corrupt_huffman()
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    with pytest.raises(FormatError):
        ops.huffman_gemm(x, enc.header, ops.to_device(planes))
    torch.cuda.synchronize()  # the context must still be healthy
    ops.huffman_gemm(x, enc.header, ops.to_device(enc.planes))


@pytest.mark.parametrize("enc_name", ["palette", "huffman"])
def test_tuned_dispatch_runs_fused_kernel_only_when_recorded_faster(enc_name, tmp_path, monkeypatch):
    from unweight.runtime import dispatch, loader, tuning
    from unweight.runtime.modules import CompressedLinear
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "tuning.json"))
    tuning.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 768).to(torch.bfloat16).cuda()
    torch.nn.init.normal_(lin.weight, std=0.02)
    cl = CompressedLinear.from_linear(lin, enc_name)
    loader._build_lut(cl)
    x = torch.randn(2, 3, 1024, dtype=torch.bfloat16, device="cuda")
    base = torch.nn.functional.linear(x, cl.decode_weight(), cl.bias)
    assert torch.equal(cl(x), base)  # no measurement: decode + cuBLAS, bitwise
    fused = "palette_gemm" if enc_name == "palette" else "huffman_gemm"
    t = tuning.TuningTable()
    t.record(tuning.device_name("cuda"), 768, 1024, enc_name, 6, {"decode_cublas": 1.0, fused: 0.5})  # M = 2 * 3
    t.save(tuning.default_cache_path())
    tuning.reset()
    from unweight.runtime import cuda_ops
    calls = []
    real = getattr(cuda_ops, fused)
    monkeypatch.setattr(cuda_ops, fused, lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        y = cl(x)
        assert calls, "the recorded win did not route to the fused kernel"
        assert y.shape == base.shape and y.dtype == torch.bfloat16
        ref = x.double() @ lin.weight.double().T + lin.bias.double()
        assert float((y.double() - ref).abs().max()) <= 2 * float((base.double() - ref).abs().max()) + 1e-3
        assert dispatch.device_errors("cuda") == 0
    finally:
        tuning.reset()
