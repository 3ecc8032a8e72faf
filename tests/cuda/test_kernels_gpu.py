"""GPU tests of the CUDA kernels through the ops layer (``torch.ops.unweight.*``), against the
CPU codec, the NumPy reference decoder and cuBLAS.  Collected everywhere, skipped without a
CUDA GPU and the compiled ``unweight._cuda`` (marker ``cuda``)."""
import numpy as np
import pytest

from unweight.codec import tensor_codec as tc
from unweight.codec.reference import decode_reference
from unweight.format import constants as C
from unweight.format.errors import FormatError
from unweight.runtime import kernel_plan as kp

from .helpers import (EMULATION_ULPS, all_bf16_patterns, bf16_tensor, bf16_ulp_distance, bits, decode_op,
                      decode_poisoned, emulate_fused, encoded_weight, fused_op, fused_paths, fused_supported,
                      fused_vs_cublas, gather_op, graph_replays_bitwise, huffman_planes, make_weights,
                      programmatic, without_index)

torch = pytest.importorskip("torch")


def _gpu_ready() -> bool:
    try:
        from unweight import ops
        return ops.cuda_available()
    except ImportError:
        return False


pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA GPU and unweight._cuda")]

SHAPES = [(1, 1), (1, 63), (63, 65), (65, 64), (7, 4097), (4097, 7), (129, 256), (300, 520), (1024, 4096)]
ENCODINGS = ("huffman", "palette")


# The runtime's default decoders run in every test; a test or case marked `variant` runs a
# decoder or GEMM variant that is not the default (the GPU runbook runs those in a pytest
# process of their own, after the rest).
HUFF_CASES = [v if v == kp.HUFF_DEFAULT_VARIANT else pytest.param(v, marks=pytest.mark.variant)
              for v in sorted(kp.HUFF_VARIANTS.values())]


def _err():
    return torch.zeros(1, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("enc_name", ENCODINGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_bitwise(shape, enc_name):
    w = make_weights(*shape, seed=shape[0] * 7 + shape[1])
    enc = tc.encode(w, enc_name, segment_weights=512)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    for got in decode_poisoned(ew, err):
        assert np.array_equal(got, w)
    if w.size <= 1 << 18:
        assert np.array_equal(decode_reference(enc.planes[C.SUFFIX_HDR], enc.planes), w)
    assert int(err.item()) == 0


@pytest.mark.parametrize("enc_name", ENCODINGS)
def test_decode_all_bf16_patterns(enc_name):
    w = all_bf16_patterns()
    enc = tc.encode(w, enc_name)
    err = _err()
    for got in decode_poisoned(encoded_weight(enc, "cuda", err), err):
        assert np.array_equal(got, w)
    assert int(err.item()) == 0


def test_decode_exponents_only():
    w = make_weights(130, 260, seed=5)
    enc = tc.encode(w, "huffman", segment_weights=512)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    out = torch.empty(w.shape, dtype=torch.uint8, device="cuda")
    torch.ops.unweight.decode_huffman(ew.sm, ew.exp, ew.off, ew.table, ew.lut, out, err, ew.rows, ew.cols,
                                      ew.rows_per_group, ew.cols_per_chunk, ew.exp_lo, ew.exp_hi)
    assert np.array_equal(out.cpu().numpy(), ((w >> 7) & 0xFF).astype(np.uint8))


@pytest.mark.parametrize("shape", SHAPES)
def test_transcode_bitwise(shape):
    from unweight import ops
    w = make_weights(*shape, seed=shape[1])
    enc = tc.encode(w, "huffman")
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    planes = huffman_planes(enc, ew)
    hdr, g = ops.transcode_to_palette(enc.header, planes, ew.lut, err)
    ref = tc.transcode_to_palette(enc.header, enc.planes)
    assert np.array_equal(hdr.pack(), ref.header.pack())
    for s in (C.SUFFIX_IDX, C.SUFFIX_VEXP):
        assert np.array_equal(g[s].cpu().numpy(), ref.planes[s])
    assert np.array_equal(g[C.SUFFIX_VPOS].view(torch.int32).cpu().numpy().view(np.uint32), ref.planes[C.SUFFIX_VPOS])


@pytest.mark.parametrize("chunk", [200 * 520, 1 << 30])
def test_transcode_of_a_stack_bitwise(chunk):
    # an expert stack, indexed: matrix by matrix (the histogram pass decodes again) or at once
    from unweight import ops
    from .helpers import device_lut, device_planes
    w = np.stack([make_weights(200, 520, seed=e) for e in range(4)])
    w[2, 5, :] = 0x7F80
    enc = tc.encode(w, "huffman", grid=(64, 512))
    enc = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
    err = _err()
    _, lut = device_lut(enc.header, "cuda", err)
    hdr, g = ops.transcode_to_palette(enc.header, device_planes(enc.planes, "cuda"), lut, err, chunk_weights=chunk)
    ref = tc.transcode_to_palette(enc.header, enc.planes)
    assert np.array_equal(hdr.pack(), ref.header.pack()) and hdr.stack == 4
    for s in (C.SUFFIX_IDX, C.SUFFIX_VEXP):
        assert np.array_equal(g[s].cpu().numpy(), ref.planes[s])
    assert np.array_equal(g[C.SUFFIX_VPOS].view(torch.int32).cpu().numpy().view(np.uint32), ref.planes[C.SUFFIX_VPOS])
    assert int(err.item()) == 0


@pytest.mark.parametrize("stack", [0, 3])
def test_index_built_on_the_device_is_the_host_codecs(stack):
    # a matrix with a partial last row group and column chunk, and a stack
    from unweight import ops
    from .helpers import device_lut, device_planes
    w = make_weights(300, 1090, seed=9) if not stack else np.stack([make_weights(96, 520, seed=e) for e in range(3)])
    enc = tc.encode(w, "huffman", grid=(64, 512))
    err = _err()
    _, lut = device_lut(enc.header, "cuda", err)
    hdr, got = ops.build_index(enc.header, device_planes(enc.planes, "cuda"), lut, err)
    want = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
    assert np.array_equal(hdr.pack(), want.header.pack())
    assert got[C.SUFFIX_CHK].cpu().numpy().tobytes() == want.planes[C.SUFFIX_CHK].tobytes()
    assert int(err.item()) == 0


@pytest.mark.parametrize("chunk", [96 * 520, 1 << 30])
def test_stack_encode_on_the_device_is_the_codecs(chunk):
    # BF16 experts -> one palette stack (expert slots at load): a matrix at a time, or at once
    import dataclasses

    from unweight.ops import transcode
    w = np.stack([make_weights(96, 520, seed=e) for e in range(3)])
    w[1, 4, :64] = 0xFF80
    hdr, got = transcode.encode_palette_stack(torch.from_numpy(w), "cuda", chunk)
    want = tc.encode(w, "palette", grid=tc.choose_grid(96, 520))
    assert np.array_equal(hdr.pack(), dataclasses.replace(want.header, crc32=0).pack())
    for s in (C.SUFFIX_SM, C.SUFFIX_IDX, C.SUFFIX_VEXP):
        assert np.array_equal(got[s].cpu().numpy(), want.planes[s]), s
    vpos = got[C.SUFFIX_VPOS].view(torch.int32).cpu().numpy().view(np.uint32)
    assert np.array_equal(vpos, want.planes[C.SUFFIX_VPOS])


def _corrupt_huffman():
    """(original bits, encoded, corrupt planes): a 128x512 huffman tensor whose exponent stream
    (slack excluded) is scrambled."""
    w = make_weights(128, 512, seed=1)
    enc = tc.encode(w, "huffman", segment_weights=512)
    planes = dict(enc.planes)
    bad = planes[C.SUFFIX_EXP].copy()
    bad[: bad.size - C.STREAM_SLACK_BYTES] ^= 0x5A
    planes[C.SUFFIX_EXP] = bad
    return w, enc, planes


def test_huffman_decode_reports_corruption():
    w, enc, planes = _corrupt_huffman()
    err = _err()
    bad = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", err)
    out = torch.empty((bad.rows, bad.cols), dtype=torch.bfloat16, device="cuda")
    decode_op(bad, out, err)
    assert int(err.item()) > 0
    torch.cuda.synchronize()  # the context must still be healthy
    good = _err()
    for got in decode_poisoned(encoded_weight(enc, "cuda", good), good):
        assert np.array_equal(got, w)
    assert int(good.item()) == 0


def test_palette_decode_reports_bad_index():
    w = make_weights(64, 256, seed=2)
    enc = tc.encode(w, "palette")
    if enc.header.pal_size == 16:
        pytest.skip("every nibble is a valid index when the palette is full")
    planes = dict(enc.planes)
    planes[C.SUFFIX_IDX] = np.full_like(planes[C.SUFFIX_IDX], 0xFF)
    err = _err()
    bad = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", err)
    decode_poisoned(bad, err)
    assert int(err.item()) > 0


def _need_fused(enc_name):
    if enc_name not in fused_paths():
        pytest.skip(f"this build has no fused {enc_name} kernel")


@pytest.mark.parametrize("M", [1, 2, 3, 8, 16, 64])
@pytest.mark.parametrize("enc_name", ENCODINGS)
@pytest.mark.parametrize("NK", [(1, 64), (33, 256), (63, 512), (1024, 4096), (4096, 1024)])
def test_fused_accuracy_and_determinism(M, enc_name, NK):
    _need_fused(enc_name)
    N, K = NK
    w = make_weights(N, K, seed=N + 3 * K)
    enc = tc.encode(w, enc_name)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    if not fused_supported(ew, M):
        pytest.skip(f"the fused {enc_name} kernel does not take M={M}, K={K}")
    x = bf16_tensor(make_weights(M, K, seed=M, spread=False), "cuda")
    r = fused_vs_cublas(ew, x, w, err)
    assert r["passed"], r


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("enc_name", ENCODINGS)
def test_fused_matches_host_emulation(M, enc_name):
    _need_fused(enc_name)
    w = make_weights(300, 512, seed=11)
    enc = tc.encode(w, enc_name, grid=(4, 64))
    ew = encoded_weight(enc, "cuda", _err())
    xb = make_weights(M, 512, seed=M, spread=False)
    y = bits(fused_op(ew, bf16_tensor(xb, "cuda")))
    d = bf16_ulp_distance(y, emulate_fused(enc, xb, "cuda"))
    assert int(d.max()) <= EMULATION_ULPS and (d > 0).mean() < 0.01, (int(d.max()), int((d > 0).sum()))


@pytest.mark.variant
@pytest.mark.parametrize("M", [1, 16, 64, 130])
@pytest.mark.parametrize("NK", [(63, 192), (300, 320), (1024, 4096), (4096, 1024)])
def test_wide_stage_palette_gemm_gives_the_same_bits(M, NK):
    """The two-tile-stage kernel runs the same mma sequence: bit for bit the one-tile kernel's
    result on the device, odd tile counts per split included (K = 192, 320)."""
    from unweight.runtime.tuning_table import PALETTE_GEMM, PALETTE_GEMM_WIDE
    N, K = NK
    w = make_weights(N, K, seed=N + K)
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", _err())
    x = bf16_tensor(make_weights(M, K, seed=M, spread=False), "cuda")
    y1, y2 = fused_op(ew, x, None, PALETTE_GEMM), fused_op(ew, x, None, PALETTE_GEMM_WIDE)
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))


@pytest.mark.variant
@pytest.mark.parametrize("M", [1, 8, 9, 16, 33, 64, 65, 130, 256])
@pytest.mark.parametrize("NK", [(63, 192), (300, 320), (1024, 4096), (4096, 1024)])
def test_shared_x_palette_gemm_gives_the_same_bits(M, NK):
    """x copied once per CTA into shared memory feeds the mma the values each warp loaded
    itself: bit for bit the one-tile kernel's result, past-M rows and last row blocks included."""
    from unweight.runtime.tuning_table import PALETTE_GEMM, PALETTE_GEMM_XS
    N, K = NK
    w = make_weights(N, K, seed=N + 3 * K)
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", _err())
    x = bf16_tensor(make_weights(M, K, seed=M + 1, spread=False), "cuda")
    y1, y2 = fused_op(ew, x, None, PALETTE_GEMM), fused_op(ew, x, None, PALETTE_GEMM_XS)
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))


@pytest.mark.variant
@pytest.mark.parametrize("NK", [(63, 192), (300, 320), (9, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_accuracy_determinism_and_batch_invariance(NK):
    """The GEMV at batch 1..4: within 2x cuBLAS's error against FP64, repeats bit for bit, and a
    batch row's bits the same at every batch size (its sums use only its own x row)."""
    from unweight.runtime.tuning_table import PALETTE_GEMV
    N, K = NK
    w = make_weights(N, K, seed=N + 5 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    x4 = bf16_tensor(make_weights(4, K, seed=N, spread=False), "cuda")
    y4 = fused_op(ew, x4, None, PALETTE_GEMV)
    assert torch.equal(fused_op(ew, x4, None, PALETTE_GEMV).view(torch.int16), y4.view(torch.int16))
    for M in (1, 2, 3):
        y = fused_op(ew, x4[:M].contiguous(), None, PALETTE_GEMV)
        assert torch.equal(y.view(torch.int16), y4[:M].view(torch.int16))
    assert fused_vs_cublas(ew, x4, w, err, PALETTE_GEMV)["passed"]
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("path", ["palette_gemv_deep", "palette_gemv_staged"])
@pytest.mark.parametrize("NK", [(63, 192), (9, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_variants_give_the_gemv_bits(NK, path):
    """The deep and staged GEMVs (more loads in flight) at batch 1..4: the default GEMV's bits."""
    from unweight.runtime.tuning_table import PALETTE_GEMV
    N, K = NK
    w = make_weights(N, K, seed=N + 3 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    x4 = bf16_tensor(make_weights(4, K, seed=N + 1, spread=False), "cuda")
    for M in (1, 2, 3, 4):
        x = x4[:M].contiguous()
        assert torch.equal(fused_op(ew, x, None, path).view(torch.int16),
                           fused_op(ew, x, None, PALETTE_GEMV).view(torch.int16))
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("NK", [(63, 192), (40, 1088), (9, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_mma_accuracy_determinism_and_batch_invariance(NK):
    """The tensor-core GEMV at batch 1..32: within 2x cuBLAS's error against FP64, repeats bit
    for bit, and a batch row's bits the same at every batch size (mma output columns are
    independent)."""
    from unweight.runtime.tuning_table import PALETTE_GEMV_MMA as P
    N, K = NK
    w = make_weights(N, K, seed=N + 7 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    x32 = bf16_tensor(make_weights(32, K, seed=N + 2, spread=False), "cuda")
    y32 = fused_op(ew, x32, None, P)
    assert torch.equal(fused_op(ew, x32, None, P).view(torch.int16), y32.view(torch.int16))
    for M in (1, 2, 5, 8, 9, 15, 16, 17, 31):
        y = fused_op(ew, x32[:M].contiguous(), None, P)
        assert torch.equal(y.view(torch.int16), y32[:M].view(torch.int16)), M
        assert fused_vs_cublas(ew, x32[:M].contiguous(), w, err, P)["passed"], M
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("path", ["palette_gemv_mma_staged", "palette_gemv_mma_prefetch"])
@pytest.mark.parametrize("NK", [(63, 192), (40, 1088), (9, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_mma_feeds_give_the_mma_bits(NK, path):
    """The staged tensor-core GEMV (loads through cp.async into per-warp rings, past 48 KB of
    shared memory) and the prefetching one (L2 bulk prefetches ahead of its loads) at batch
    1..32: the register-direct tensor-core GEMV's bits."""
    from unweight.runtime.tuning_table import PALETTE_GEMV_MMA
    N, K = NK
    w = make_weights(N, K, seed=N + 9 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    x32 = bf16_tensor(make_weights(32, K, seed=N + 4, spread=False), "cuda")
    for M in (1, 2, 8, 9, 16, 17, 32):
        x = x32[:M].contiguous()
        assert torch.equal(fused_op(ew, x, None, path).view(torch.int16),
                           fused_op(ew, x, None, PALETTE_GEMV_MMA).view(torch.int16)), M
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("NK", [(16, 64), (48, 1088), (64, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_mma_bulk_gives_the_mma_bits(NK):
    """The bulk-copy tensor-core GEMV (cp.async.bulk into per-warp rings on mbarriers; sm_90+)
    on tile-major planes at batch 1..32: the register-direct tensor-core GEMV's bits on the
    file-order planes; refused on file-order planes."""
    from unweight.ops.layout import tile_palette_planes
    from unweight.runtime.tuning_table import PALETTE_GEMV_MMA, PALETTE_GEMV_MMA_BULK
    from unweight.runtime.weights import EncodedWeight
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("cp.async.bulk needs sm_90")
    N, K = NK
    w = make_weights(N, K, seed=N + 5 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    sm, idx = tile_palette_planes(ew.sm, ew.idx)
    et = EncodedWeight(ew.encoding, ew.rows, ew.cols, ew.rows_per_group, ew.cols_per_chunk, ew.exp_lo, ew.exp_hi,
                       list(ew.palette), sm, idx=idx, vpos=ew.vpos, vexp=ew.vexp, tiled=True)
    x32 = bf16_tensor(make_weights(32, K, seed=N + 6, spread=False), "cuda")
    for M in (1, 2, 8, 9, 16, 17, 32):
        x = x32[:M].contiguous()
        assert torch.equal(fused_op(et, x, None, PALETTE_GEMV_MMA_BULK).view(torch.int16),
                           fused_op(ew, x, None, PALETTE_GEMV_MMA).view(torch.int16)), M
    with pytest.raises(RuntimeError, match="tile-major"):
        fused_op(ew, x32[:1].contiguous(), None, PALETTE_GEMV_MMA_BULK)
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("NK", [(63, 192), (40, 1088), (9, 4160), (1024, 4096), (4096, 1024), (128, 14336)])
def test_palette_gemv_mma_queue_gives_the_mma_bits_and_leaves_its_counters_zero(NK):
    """The queued tensor-core GEMV (units from a queue on a persistent grid): at 1 to 8 units per
    tile the register-direct GEMV's bits at that many parts (at 3, 5, 6 and 7 its CTAs are one
    tile's warps), at batch 1..32, in file
    order and tile-major; the planned units within the bound's reach of cuBLAS (the dispatch
    path); its counters zero after every launch and after CUDA-graph replays, which repeat its
    bits."""
    from unweight.ops.layout import tile_palette_planes
    from unweight.runtime import kernel_plan as kp
    from unweight.runtime.tuning_table import PALETTE_GEMV_MMA_QUEUE
    from unweight.runtime.weights import EncodedWeight
    N, K = NK
    w = make_weights(N, K, seed=N + 9 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    sm, idx = tile_palette_planes(ew.sm, ew.idx) if N % 16 == 0 else (None, None)
    et = None if sm is None else EncodedWeight(ew.encoding, N, K, ew.rows_per_group, ew.cols_per_chunk, ew.exp_lo,
                                               ew.exp_hi, list(ew.palette), sm, idx=idx, vpos=ew.vpos, vexp=ew.vexp,
                                               tiled=True)
    x32 = bf16_tensor(make_weights(32, K, seed=N + 8, spread=False), "cuda")
    cnt = torch.zeros(kp.pgemv_mma_queue_counters(N), dtype=torch.int32, device="cuda")
    steps = kp.cdiv(K, kp.PGEMV_MMA_COLS)
    for units in (u for u in range(1, kp.PGEMV_MAX_PARTS + 1) if u <= steps):
        ws = torch.zeros(max(1, kp.pgemv_mma_queue_workspace(N, units, 32)), device="cuda")
        for M in (1, 2, 9, 17, 32):
            x = x32[:M].contiguous()
            want = torch.ops.unweight.palette_gemv(x, ew.sm, ew.idx, ew.vpos, ew.vexp, N, K, ew.palette, units,
                                                   kp.PGEMV_VARIANT_MMA)
            for q in (ew, et) if et is not None else (ew,):
                got = torch.ops.unweight.palette_gemv_queue(x, q.sm, q.idx, q.vpos, q.vexp, ws, cnt, N, K, q.palette,
                                                            units, q.tiled)
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (units, M, q.tiled)
                assert int(cnt.abs().sum().item()) == 0
    x1 = x32[:1].contiguous()
    y0 = fused_op(ew, x1, None, PALETTE_GEMV_MMA_QUEUE)
    assert graph_replays_bitwise(lambda: fused_op(ew, x1, None, PALETTE_GEMV_MMA_QUEUE), y0)
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("path", ["palette_gemv_mma", "palette_gemv_mma_queue"])
def test_programmatic_launch_gives_the_same_bits_along_a_chain(path):
    """Programmatic dependent launch on (sm_90+): a chain of tensor-core GEMVs, each reading the
    one before's output, with a PyTorch op between every other pair, gives the bits it gives
    with it off, eagerly and replayed in a CUDA graph."""
    N = 1024
    err = _err()
    ws = [encoded_weight(tc.encode(make_weights(N, N, seed=i), "palette"), "cuda", err) for i in range(3)]
    x0 = bf16_tensor(make_weights(9, N, seed=4, spread=False), "cuda")

    def chain():
        y = x0
        for i, q in enumerate(ws * 3):
            y = fused_op(q, y, None, path)
            if i % 2:
                y = y * 0.5
        return y
    with programmatic(False):
        want = chain()
    with programmatic(True):
        assert torch.equal(chain().view(torch.int16), want.view(torch.int16))
        assert graph_replays_bitwise(chain, want)
    assert int(err.item()) == 0


@pytest.mark.parametrize("NK", [(48, 1088), (1024, 4096)])
def test_paired_palette_order_gives_the_stored_orders_bits(NK):
    """A writer-order palette that does not pair, held as the GPU loaders hold it
    (runtime.weights.hold_paired: reordered, idx rewritten): the decode gives the original
    weights and every fused path the stored order's bits at batch 1..32, tile-major too."""
    from unweight.ops.layout import palette_pairs, tile_palette_planes
    from unweight.runtime import tuning_table as tt
    from unweight.runtime.weights import EncodedWeight, hold_paired
    N, K = NK
    w = make_weights(N, K, seed=3 * N + K)
    err = _err()
    enc = tc.encode(w, "palette")
    ew = encoded_weight(enc, "cuda", err)
    ep = hold_paired(encoded_weight(enc, "cuda", err))
    if palette_pairs(ew.palette) or not palette_pairs(ep.palette):
        pytest.skip("the writer's palette pairs as stored, or cannot pair")
    out = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
    decode_op(ep, out, err)
    assert np.array_equal(bits(out), w)
    sm, idx = tile_palette_planes(ep.sm, ep.idx)
    et = EncodedWeight(ep.encoding, N, K, ep.rows_per_group, ep.cols_per_chunk, ep.exp_lo, ep.exp_hi, list(ep.palette),
                       sm, idx=idx, vpos=ep.vpos, vexp=ep.vexp, tiled=True)
    x32 = bf16_tensor(make_weights(32, K, seed=N + 7, spread=False), "cuda")
    for M in (1, 4, 16, 32):
        x = x32[:M].contiguous()
        for path in tt.candidates("palette" + tt.TILED, M, K):
            want = fused_op(ew, x, None, path if path not in tt.TILED_ONLY else tt.PALETTE_GEMV_MMA)
            for q in ((ep, et) if path not in tt.TILED_ONLY else (et,)):
                if path in tt.TILED_ONLY and torch.cuda.get_device_capability()[0] < 9:
                    continue
                assert torch.equal(fused_op(q, x, None, path).view(torch.int16), want.view(torch.int16)), (M, path)
    assert int(err.item()) == 0


def test_fused_huffman_reports_corruption():
    _need_fused("huffman")
    from unweight.runtime import scratch
    _, enc, planes = _corrupt_huffman()
    bad = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", _err())
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    before = scratch.device_errors("cuda")
    fused_op(bad, x)
    assert scratch.device_errors("cuda") > before
    torch.cuda.synchronize()  # the context must still be healthy
    before = scratch.device_errors("cuda")
    fused_op(encoded_weight(enc, "cuda", _err()), x)
    assert scratch.device_errors("cuda") == before


@pytest.mark.parametrize("enc_name", ENCODINGS)
def test_measured_dispatch_runs_fused_kernel_only_when_recorded_faster(enc_name, tmp_path):
    _need_fused(enc_name)
    from unweight.runtime import dispatch, scratch
    from unweight.runtime.modules import CompressedLinear
    from unweight.runtime.policy import DispatchPolicy
    from unweight.runtime.prepare import prepare_module
    from unweight.runtime.tuning_table import TuningTable
    torch.manual_seed(0)
    errors_before = scratch.device_errors("cuda")
    lin = torch.nn.Linear(1024, 768).to(torch.bfloat16).cuda()
    torch.nn.init.normal_(lin.weight, std=0.02)
    cl = CompressedLinear.from_linear(lin, enc_name)
    prepare_module(cl, DispatchPolicy(None))
    x = torch.randn(2, 3, 1024, dtype=torch.bfloat16, device="cuda")
    base = torch.nn.functional.linear(x, cl.decode_weight(), cl.bias)
    assert torch.equal(cl(x), base)  # no measurement: decode + cuBLAS, bitwise
    fused = fused_paths()[enc_name]
    t = TuningTable()
    t.record(torch.cuda.get_device_name(0), 768, 1024, enc_name, 6, {"decode_cublas": 1.0, fused: 0.5})  # M = 2*3
    policy = DispatchPolicy(t)
    assert policy.linear_path(cl.encoded(), 6, x.device) == fused
    cl.policy = policy
    y = cl(x)
    assert y.shape == base.shape and y.dtype == torch.bfloat16
    ref = x.double() @ lin.weight.double().T + lin.bias.double()
    assert float((y.double() - ref).abs().max()) <= 2 * float((base.double() - ref).abs().max()) + 1e-3
    y_direct = dispatch.fused(cl.encoded(), x.reshape(6, 1024), fused) + lin.bias
    assert torch.equal(y.reshape(6, 768), y_direct)
    assert scratch.device_errors("cuda") == errors_before


def test_palette_modules_hold_the_verbatim_row_index_and_it_gives_the_search_bits():
    """A CUDA palette module's encoded weight carries its verbatim list's row index
    (runtime.weights.hold_row_index: ops.verbatim_rows of its vpos), rebuilt with the record,
    and every fused palette path gives the same bits with it as with the kernels' search."""
    _need_fused("palette")
    from unweight import ops
    from unweight.runtime import dispatch
    from unweight.runtime.modules import CompressedLinear
    torch.manual_seed(1)
    lin = torch.nn.Linear(1088, 300, bias=False).to(torch.bfloat16).cuda()
    torch.nn.init.normal_(lin.weight, std=0.02)
    with torch.no_grad():
        lin.weight[::7, ::5] *= 2.0 ** -20  # outliers below the palette: verbatim blocks in most rows
    cl = CompressedLinear.from_linear(lin, "palette")
    w = cl.encoded()
    assert w.vpos.numel() > 0 and w.vrow is not None
    assert torch.equal(w.vrow, ops.verbatim_rows(w.vpos, w.rows, w.cols))
    bare = encoded_weight(tc.Encoded(cl.header, {s: t.cpu().numpy() for s, t in cl.planes().items()}, {}), "cuda")
    bare.vrow = None
    from unweight.runtime.tuning_table import FUSED
    for path in FUSED:
        for M in (1, 3, 9):
            x = torch.randn(M, 1088, dtype=torch.bfloat16, device="cuda")
            try:
                want = dispatch.fused(bare, x, path)
            except (ValueError, RuntimeError):
                continue  # a path that does not take this batch or shape
            assert torch.equal(dispatch.fused(w, x, path).view(torch.int16), want.view(torch.int16)), (path, M)


def test_zero_size_problems_launch_nothing():
    err = _err()
    for shape in ((0, 5), (5, 0), (0, 0)):
        out = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        e8 = torch.empty(0, dtype=torch.uint8, device="cuda")
        e32 = torch.empty(0, dtype=torch.uint32, device="cuda")
        torch.ops.unweight.decode_huffman(e8, e8, e32, e8, torch.empty(0, dtype=torch.uint16, device="cuda"), out,
                                          err, shape[0], shape[1], 16, 512, 0, 0)
        torch.ops.unweight.decode_palette(e8, e8, e32, e8, out, err, shape[0], shape[1], [120])
    torch.cuda.synchronize()
    assert int(err.item()) == 0


def test_format_error_raised_by_transcode_of_corrupt_tensor():
    from unweight import ops
    _, enc, planes = _corrupt_huffman()
    err = _err()
    bad = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", err)
    dev = huffman_planes(tc.Encoded(enc.header, planes, {}), bad)
    with pytest.raises(FormatError):
        ops.transcode_to_palette(enc.header, dev, bad.lut, err)


# ------------------------------------------------------------------ checkpoint index, row gather
@pytest.mark.parametrize("S", [16, 1024])
@pytest.mark.parametrize("shape", [(1, 1), (63, 65), (7, 4097), (4097, 65), (1024, 4096)])
def test_chain_decode_with_and_without_index(shape, S):
    w = make_weights(*shape, seed=shape[0] + shape[1])
    enc = tc.encode(w, "huffman", chk_interval=S)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    for variant in (ew, without_index(ew)):
        for got in decode_poisoned(variant, err):
            assert np.array_equal(got, w)
    assert int(err.item()) == 0


@pytest.mark.parametrize("shape", [(63, 65), (96, 4096), (1024, 4096)])
@pytest.mark.parametrize("variant", HUFF_CASES)
def test_decoder_variants_bitwise(shape, variant):
    """Every decoder variant, bit for bit, BF16 and exponent bytes, with the index (S = 256, as
    the loaders add it) and without (vector shapes run the variant asked for, the others the
    scalar reader)."""
    w = make_weights(*shape, seed=shape[0] + shape[1])
    enc = tc.encode(w, "huffman", chk_interval=256)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    for cut in (ew, without_index(ew)):
        for got in decode_poisoned(cut, err, variant):
            assert np.array_equal(got, w)
        exps = torch.empty((ew.rows, ew.cols), dtype=torch.uint8, device="cuda")
        decode_op(cut, exps, err, variant)
        assert np.array_equal(exps.cpu().numpy(), ((w >> 7) & 0xFF).astype(np.uint8))
    assert int(err.item()) == 0


@pytest.mark.variant
@pytest.mark.parametrize("shape", [(33, 4096), (300, 520), (4097, 64), (1024, 4096), (7, 4100)])
def test_wide_palette_decode_bitwise(shape):
    """The wide palette decode (four 8-weight chunks per thread) and VEC8 write the same bits,
    verbatim blocks patched; a shape whose width is not a multiple of 8 runs VEC8."""
    w = make_weights(*shape, seed=shape[0] * 5 + shape[1])
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    for variant in (kp.PAL_VARIANT_VEC8, kp.PAL_VARIANT_WIDE):
        for got in decode_poisoned(ew, err, variant):
            assert np.array_equal(got, w)
    assert int(err.item()) == 0


@pytest.mark.parametrize("variant", HUFF_CASES)
def test_every_decoder_variant_counts_corruption(variant):
    w, enc, planes = _corrupt_huffman()
    err = _err()
    bad = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", err)
    decode_op(bad, torch.empty((bad.rows, bad.cols), dtype=torch.bfloat16, device="cuda"), err, variant)
    assert int(err.item()) >= 1


def test_chain_decode_counts_a_wrong_checkpoint():
    w = make_weights(256, 1024, seed=11)
    enc = tc.encode(w, "huffman", chk_interval=64)
    planes = dict(enc.planes)
    chk = planes[C.SUFFIX_CHK].copy()
    chk[0, 0] += 1  # inside every bound: only a decoder that starts there sees it
    planes[C.SUFFIX_CHK] = chk
    err = _err()
    ew = encoded_weight(tc.Encoded(enc.header, planes, {}), "cuda", err)
    decode_op(ew, torch.empty((ew.rows, ew.cols), dtype=torch.bfloat16, device="cuda"), err)
    assert int(err.item()) >= 1


@pytest.mark.parametrize("enc_name", ENCODINGS)
@pytest.mark.parametrize("shape", [(1, 1), (300, 65), (4097, 4096), (65, 4097)])
def test_gather_rows_bitwise(shape, enc_name):
    w = make_weights(*shape, seed=shape[0] * 3 + shape[1])
    enc = tc.encode(w, enc_name)
    err = _err()
    ew = encoded_weight(enc, "cuda", err)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, shape[0], size=(3, 17))).cuda()
    for variant in ((ew, without_index(ew)) if enc_name == "huffman" else (ew,)):
        got = gather_op(variant, ids, err)
        assert np.array_equal(bits(got), w[ids.reshape(-1).cpu().numpy()])
    assert int(err.item()) == 0
    bad = torch.tensor([0, shape[0], -1], device="cuda")
    got = bits(gather_op(ew, bad, err))
    assert int(err.item()) == 2 and np.array_equal(got[0], w[0]) and not got[1:].any()


@pytest.mark.parametrize("enc_name", ENCODINGS)
def test_embedding_gathers_on_the_device(enc_name):
    """dispatch.embedding on CUDA: rows from the gather kernels, vocab padding zero, and no
    decode of the table into scratch."""
    from unweight.runtime import dispatch, scratch
    w1, w2 = make_weights(500, 256, seed=1), make_weights(300, 256, seed=2)
    err = scratch.error_counter("cuda")
    p1 = encoded_weight(tc.encode(w1, enc_name), "cuda", err)
    p2 = encoded_weight(tc.encode(w2, enc_name), "cuda", err)
    table = np.concatenate([w1, w2, np.zeros((16, 256), np.uint16)])
    ids = torch.tensor([[0, 499, 500, 799], [800, 815, 7, 650]], device="cuda")
    before = int(err.item())
    got = dispatch.embedding([p1, p2], ids, 816, 256)
    assert np.array_equal(bits(got).reshape(-1, 256), table[ids.reshape(-1).cpu().numpy()])
    assert int(err.item()) == before
    ids1 = torch.tensor([[0, 499], [7, 250]], device="cuda")  # rows of the first table only
    single = dispatch.embedding([p1], ids1, 500, 256)
    assert np.array_equal(bits(single).reshape(-1, 256), w1[ids1.reshape(-1).cpu().numpy()])


# The wgmma GEMM last in this file: a fault in a kernel's first device run poisons the process,
# and the tests after it would fail with it.
def _sm90() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.variant
def test_wgmma_layouts_match_the_emulator():
    """One warpgroup's wgmma with A in registers and B in shared memory, every element placed by
    the PTX ISA's formulas: the device's D is the emulator's, bit for bit on small integers
    (exact sums)."""
    if not _sm90():
        pytest.skip("wgmma needs an sm_90 GPU")
    from unweight import _cuda
    from unweight.ops import _ext
    for n in (8, 64, 128):
        A = ((np.arange(64 * 16).reshape(64, 16) % 23 - 11).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        B = ((np.arange(16 * n).reshape(16, n) % 19 - 9).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        err, want = _cuda.emu_selftest_wgmma(0, A, B)
        assert err is None
        dA, dB = (torch.from_numpy(v.view(np.int16)).cuda() for v in (A, B))
        dD = torch.full((64, n), float("nan"), dtype=torch.float32, device="cuda")
        _cuda.selftest_wgmma(n, _ext.ptr(dA), _ext.ptr(dB), _ext.ptr(dD), _ext.stream(dD))
        assert np.array_equal(dD.cpu().numpy(), want)


@pytest.mark.variant
@pytest.mark.parametrize("M", [1, 9, 33, 64, 65, 128, 130, 256])
@pytest.mark.parametrize("NK", [(63, 192), (300, 320), (1024, 4096), (4096, 1024)])
def test_wgmma_palette_gemm_is_accurate_and_repeatable(M, NK):
    """The wgmma GEMM: within 2x cuBLAS's error against FP64 and the same bits run twice (its
    rounding inside a k16 step is the hardware's, so it is not held to the mma.sync bits)."""
    if not _sm90():
        pytest.skip("wgmma needs an sm_90 GPU")
    from unweight.runtime.tuning_table import PALETTE_GEMM_WG
    N, K = NK
    w = make_weights(N, K, seed=N + 7 * K)
    err = _err()
    ew = encoded_weight(tc.encode(w, "palette"), "cuda", err)
    x = bf16_tensor(make_weights(M, K, seed=M + 2, spread=False), "cuda")
    y = fused_op(ew, x, None, PALETTE_GEMM_WG)
    assert torch.equal(fused_op(ew, x, None, PALETTE_GEMM_WG).view(torch.int16), y.view(torch.int16))
    assert fused_vs_cublas(ew, x, w, err, PALETTE_GEMM_WG)["passed"]
    assert int(err.item()) == 0


@pytest.mark.parametrize("offset", [0, 1, 7, 16])
@pytest.mark.parametrize("nbytes", [1, 17, 512, 4097, kp.CRC_PIECE_BYTES + 3, (1 << 22) + 5])
def test_crc32_ranges_give_zlibs_crc32(offset, nbytes):
    """The kernel itself (ops.crc32_ranges would hash on the host were its self-test to fail)."""
    import zlib

    from unweight.ops import checksum
    ranges = 3
    host = np.random.default_rng(nbytes + offset).integers(0, 256, size=offset + nbytes * ranges, dtype=np.uint8)
    dev = torch.from_numpy(host).cuda()[offset:]  # a view that starts off a 16-byte word
    got = checksum.kernel_crc32_ranges(dev, ranges).view(torch.int32).cpu().numpy().view(np.uint32)
    want = [zlib.crc32(host[offset + r * nbytes:offset + (r + 1) * nbytes].tobytes()) for r in range(ranges)]
    assert [int(c) for c in got] == want


def test_the_loaders_self_test_passes_every_fused_path_the_table_picks_here():
    """runtime/selftest.py on the real kernels: no path the shipped table picks on this GPU is
    taken out (a run on a GPU the table never measured checks nothing)."""
    from unweight.runtime import policy as policies
    from unweight.runtime import selftest
    res = selftest.check_fused_paths(policies.measured(), torch.device("cuda"))
    assert [k for k, r in res.items() if not r["passed"]] == []


def test_the_loaders_self_test_passes_the_row_gathers():
    from unweight.runtime import dispatch, selftest
    assert selftest.check_gather(torch.device("cuda"), again=True) == {"palette": True, "huffman": True}
    assert not dispatch.gather_faulty(torch.device("cuda"), "palette")


def test_the_loaders_self_test_passes_the_expert_slot_kernels():
    from unweight.runtime import selftest
    assert selftest.check_slots(torch.device("cuda"), again=True) == {"decode": True, "gemv": True}
    assert selftest.slots_ok(torch.device("cuda"), "decode") and selftest.slots_ok(torch.device("cuda"), "gemv")


def test_crc32_kernel_passes_its_self_test():
    from unweight.ops import checksum
    assert checksum.self_test(torch.device("cuda")) and checksum.kernel_ok(torch.device("cuda"))


def test_crc32_of_every_row_of_a_large_matrix():
    import zlib

    from unweight.ops import checksum
    w = bf16_tensor(make_weights(4097, 1029, seed=3), "cuda")
    got = checksum.kernel_crc32_ranges(w, 4097).view(torch.int32).cpu().numpy().view(np.uint32)
    assert [int(c) for c in got] == [zlib.crc32(r.tobytes()) for r in bits(w)]


@pytest.mark.parametrize("enc_name", ENCODINGS)
def test_held_check_names_a_weight_changed_on_the_device(enc_name):
    """runtime/verify.py on the GPU: a module's planes decoded into the scratch and hashed there
    pass, and a bit flipped in the device copy fails with the module named."""
    from unweight.format.errors import ChecksumError
    from unweight.runtime import scratch
    from unweight.runtime.modules import CompressedLinear
    from unweight.runtime.prepare import prepare_module
    from unweight.runtime.verify import HeldCheck
    lin = torch.nn.Linear(1029, 300, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(bf16_tensor(make_weights(300, 1029, seed=9), "cuda"))
    m = CompressedLinear.from_linear(lin, enc_name)
    prepare_module(m)
    scratch.reset_device_errors("cuda")
    check = HeldCheck()
    check.module("layer.weight", m)
    assert check.finish() == 1
    m.weight__sm.view(-1)[12345] ^= 4
    check.module("layer.weight", m)
    with pytest.raises(ChecksumError, match="layer.weight"):
        check.finish()
