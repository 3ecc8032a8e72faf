"""CPU tests of the fused Huffman GEMV/GEMM kernel's logic (no GPU needed; runs in CI).

* launch geometry (kernel_plan.py's hgemm_* mirror of csrc/cuda/kernel_plan.h): every segment
  of odd grids is owned by exactly one (CTA, thread), batch tiles and shared-memory sizes;
* kernel bodies: ``unweight._cuda.emulate_huffman_gemm`` runs the kernel's __host__ __device__
  bodies (x staging, per-thread segment decode + FMA, fixed-order chunk reduction) serially
  over the launch grid; its output must match an fp64 reference computed from the CPU-decoded
  weights within a bf16-derived bound, be deterministic and batch-invariant, and flag
  corrupt streams like the CPU codec does.
"""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import kernel_plan as kp

from .helpers import bf16_to_f64, make_weights

try:
    from unweight import _cuda
except ImportError:  # CUDA extension not built
    _cuda = None

needs_ext = pytest.mark.skipif(_cuda is None, reason="unweight._cuda not built")

# (N, K, (R, C)): odd N/K (1, 63, 65, 4097-ish) with small grids so there are many segments,
# partial last groups/chunks, a single chunk wider than a segment row, and the 16-byte
# sign/mantissa path (K % 16 == 0 and C % 16 == 0) as well as the byte path.
CASES = [
    (1, 1, (1, 1)),
    (1, 63, (1, 16)),
    (63, 65, (3, 7)),
    (65, 63, (4, 32)),
    (65, 64, (4, 32)),      # vector path, partial last group
    (7, 4097, (2, 512)),    # K not a multiple of the chunk: a 1-column last chunk
    (4097, 9, (64, 9)),     # many groups: several CTAs along x
    (33, 256, (2, 64)),     # vector path
    (130, 4096, (16, 512)),  # the writer's 8192-weight segments (vector path)
]


def _x(M, K, seed):
    """bf16 bits [M, K] of N(0, 1) activations."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _encode(N, K, grid, seed=0, spread=True):
    w = make_weights(N, K, seed=seed, spread=spread)
    enc = tc.encode(w, "huffman", grid=grid)
    assert (enc.header.rows_per_group, enc.header.cols_per_chunk) == grid
    return w, enc


def _emulate(x, enc):
    h, p = enc.header, enc.planes
    return _cuda.emulate_huffman_gemm(x, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], h.rows_per_group,
                                      h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi)


def _bound(xf, wf, ref, chunk_width, n_chunks):
    """|y - ref| bound for fp32 serial FMA over a chunk (<= width roundings), n_chunks fp32
    adds, then one bf16 RNE: 2^-8 |ref| + (1 + 2^-8) (width + n_chunks) 2^-24 sum|x||w|."""
    scale = np.abs(xf) @ np.abs(wf).T
    gamma = (chunk_width + n_chunks + 1) * 2.0 ** -24
    return 2.0 ** -8 * np.abs(ref) + (1 + 2.0 ** -8) * gamma * scale + 1e-38


# ------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("N,K,grid", CASES)
def test_hgemm_units_cover_every_segment_once(N, K, grid):
    R, C_ = grid
    ng, nc = kp.cdiv(N, R), kp.cdiv(K, C_)
    seen = np.zeros((ng, nc), np.int32)
    for by in range(nc):
        for bx in range(kp.hgemm_grid_x(ng)):
            for tid in range(kp.HGEMM_THREADS):
                g, c = kp.hgemm_unit(bx, by, tid)
                assert c == by
                if g < ng:
                    seen[g, c] += 1
    assert (seen == 1).all()
    # the reduction's threads cover [M, N] once
    for M in (1, 3, 16):
        assert kp.hgemm_reduce_grid(M, N) * kp.HGEMM_REDUCE_THREADS >= M * N
        assert (kp.hgemm_reduce_grid(M, N) - 1) * kp.HGEMM_REDUCE_THREADS < M * N


def test_hgemm_tiles_and_smem():
    assert [kp.hgemm_mtile(M) for M in range(0, 18)] == [0, 1, 2, 4, 4] + [8] * 4 + [16] * 8 + [0]
    assert kp.HGEMM_LUT_BYTES == 4 * 4096 * 2
    assert kp.hgemm_smem_bytes(1, 1) == kp.HGEMM_LUT_BYTES + 16
    assert kp.hgemm_smem_bytes(512, 16) == kp.HGEMM_LUT_BYTES + 512 * 16 * 2
    # the widest writer chunk of the benchmark shapes (K = 28672 -> C = 3584) fits on sm_80 at M = 16
    R, C_ = tc.choose_grid(8192, 28672)
    assert kp.huffman_gemm_supported(16, 28672, C_)
    assert not kp.huffman_gemm_supported(17, 4096, 512)
    assert not kp.huffman_gemm_supported(16, 10 ** 6, 10 ** 6)  # one huge chunk: x does not fit
    assert kp.hgemm_workspace_elems(3, 10, 100, 30) == 4 * 3 * 10


@needs_ext
def test_cpp_hgemm_plan_matches_python():
    for name in ("HGEMM_THREADS", "HGEMM_MAX_M", "HGEMM_REDUCE_THREADS", "HGEMM_MAX_CHUNKS", "HGEMM_LUT_BYTES"):
        assert getattr(_cuda, name) == getattr(kp, name), name
    for M in range(0, 20):
        assert _cuda.plan_hgemm_mtile(M) == kp.hgemm_mtile(M)
    for n in (0, 1, 63, 64, 65, 4097, 10 ** 7):
        assert _cuda.plan_hgemm_grid_x(n) == kp.hgemm_grid_x(n)
        for M in (1, 16):
            assert _cuda.plan_hgemm_reduce_grid(M, n) == kp.hgemm_reduce_grid(M, n)
    for w in (1, 7, 512, 4097):
        for mt in (1, 2, 4, 8, 16):
            assert _cuda.plan_hgemm_smem_bytes(w, mt) == kp.hgemm_smem_bytes(w, mt)
    for bx, by, tid in ((0, 0, 0), (3, 2, 63), (7, 1, 5)):
        assert tuple(_cuda.plan_hgemm_unit(bx, by, tid)) == kp.hgemm_unit(bx, by, tid)


# ------------------------------------------------------------------------- kernel bodies
@needs_ext
@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("N,K,grid", CASES)
def test_emulated_huffman_gemm_matches_fp64_reference(M, N, K, grid):
    w, enc = _encode(N, K, grid, seed=N * 131 + K)
    wd = tc.decode(enc.header, enc.planes)  # the CPU codec's decode is the weight the kernel sees
    assert np.array_equal(wd, w)
    x = _x(M, K, seed=M + K)
    y, nerr = _emulate(x, enc)
    assert nerr == 0 and y.shape == (M, N) and y.dtype == np.uint16
    xf, wf = bf16_to_f64(x), bf16_to_f64(wd)
    ref = xf @ wf.T
    got = bf16_to_f64(y)
    assert np.isfinite(got).all()  # finite inputs: no NaN / Inf from the kernel
    cw, nc = min(grid[1], K), kp.cdiv(K, grid[1])
    assert np.all(np.abs(got - ref) <= _bound(xf, wf, ref, cw, nc))


@needs_ext
@pytest.mark.parametrize("M", range(1, 17))
def test_emulated_huffman_gemm_every_batch_size(M):
    """Each M runs the smallest tile >= M with zero-padded x: rows must not leak across."""
    w, enc = _encode(40, 96, (4, 32), seed=7)
    x = _x(M, 96, seed=100 + M)
    y, nerr = _emulate(x, enc)
    assert nerr == 0
    xf, wf = bf16_to_f64(x), bf16_to_f64(w)
    ref = xf @ wf.T
    assert np.all(np.abs(bf16_to_f64(y) - ref) <= _bound(xf, wf, ref, 32, 3))


@needs_ext
def test_emulated_huffman_gemm_is_deterministic_and_batch_invariant():
    w, enc = _encode(65, 200, (4, 48), seed=3)
    x = _x(16, 200, seed=5)
    ys = [_emulate(x, enc)[0] for _ in range(3)]
    assert all(np.array_equal(ys[0], y) for y in ys[1:])
    # a row's sums use only that row of x, in a fixed order: the same bits at any batch size
    for M in (1, 3, 8):
        assert np.array_equal(_emulate(np.ascontiguousarray(x[:M]), enc)[0], ys[0][:M])
    y1 = _emulate(np.ascontiguousarray(x[9:10]), enc)[0]
    assert np.array_equal(y1[0], ys[0][9])


@needs_ext
def test_emulated_huffman_gemm_special_weights():
    """Zeros, subnormals and a wide exponent spread (long codes) in W; exact small cases."""
    rng = np.random.default_rng(0)
    N, K = 33, 80
    f = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-30, 10, (N, K)))).astype(np.float32)
    f[rng.random((N, K)) < 0.1] = 0.0
    w = (f.view(np.uint32) >> 16).astype(np.uint16)
    w[0, :4] = [0x0001, 0x8001, 0x0000, 0x8000]  # subnormals, signed zeros
    enc = tc.encode(w, "huffman", grid=(2, 16))
    x = _x(4, K, seed=1)
    y, nerr = _emulate(x, enc)
    assert nerr == 0
    xf, wf = bf16_to_f64(x), bf16_to_f64(w)
    ref = xf @ wf.T
    got = bf16_to_f64(y)
    assert np.isfinite(got).all()
    assert np.all(np.abs(got - ref) <= _bound(xf, wf, ref, 16, 5))
    # one-hot x picks columns of W exactly (single nonzero product, exact in fp32 and bf16)
    for k in (0, 17, K - 1):
        e = np.zeros((1, K), np.uint16)
        e[0, k] = 0x3F80  # 1.0
        yk, _ = _emulate(e, enc)
        want = w[:, k].copy()
        want[want == 0x8000] = 0x0000  # 0 + (-0) * 1 = +0 in the fp32 accumulator
        assert np.array_equal(yk[0], want)


@needs_ext
def test_emulated_huffman_gemm_flags_corruption_like_the_cpu_codec():
    w, enc = _encode(65, 130, (4, 32), seed=11)
    h, p = enc.header, enc.planes
    x = _x(2, 130, seed=2)
    rng = np.random.default_rng(0)
    for _ in range(20):
        bad = p[C.SUFFIX_EXP].copy()
        pos = int(rng.integers(0, bad.size - C.STREAM_SLACK_BYTES))
        bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
        _, nerr = _cuda.emulate_huffman_gemm(x, p[C.SUFFIX_SM], bad, p[C.SUFFIX_OFF], h.rows_per_group,
                                             h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi)
        try:
            ref = np.empty_like(w)
            tc._C.huffman_decode(bad, p[C.SUFFIX_OFF], h.rows, h.cols, h.rows_per_group, h.cols_per_chunk, h.table,
                                 h.exp_lo, h.exp_hi, 0, h.n_groups, 0, h.n_chunks, p[C.SUFFIX_SM], ref, 1)
            cpu_ok = True
        except ValueError:
            cpu_ok = False
        assert (nerr == 0) == cpu_ok
    # offsets pointing past a truncated stream: counted, never read out of bounds
    off = p[C.SUFFIX_OFF].copy()
    off[-1] += 1000
    short = p[C.SUFFIX_EXP][: max(C.STREAM_SLACK_BYTES, p[C.SUFFIX_EXP].size // 2)].copy()
    _, nerr = _cuda.emulate_huffman_gemm(x, p[C.SUFFIX_SM], short, off, h.rows_per_group, h.cols_per_chunk,
                                         h.table, h.exp_lo, h.exp_hi)
    assert nerr >= 1


@needs_ext
def test_huffman_gemm_launcher_rejects_bad_arguments_without_a_gpu():
    with pytest.raises(RuntimeError, match="M <= 16"):
        _cuda.huffman_gemm(16, 8, 17, 16, 16, 64, 16, 4, 8, 1, 8, 16, 16, 16, 4, 16, 0)
    with pytest.raises(RuntimeError, match="column chunks"):
        _cuda.huffman_gemm(16, 70000, 1, 16, 16, 64, 16, 4, 70000, 1, 1, 16, 16, 16, 4, 16, 0)
    with pytest.raises(ValueError):  # null workspace pointer: refused by the binding
        _cuda.huffman_gemm(16, 8, 1, 16, 16, 64, 16, 4, 8, 1, 8, 16, 0, 16, 4, 16, 0)
    if _cuda.device_count() == 0:  # valid arguments, no device: an error, never a crash
        with pytest.raises(RuntimeError):
            _cuda.huffman_gemm(16, 8, 1, 16, 16, 64, 16, 4, 8, 1, 8, 16, 16, 16, 4, 16, 0)
