"""ops/transcode.py: the device transcode's pass sequence (transcode_passes) run on the CPU
through the ops' host kernels, against the codec's transcode, byte for byte: matrices, stacks
decoded in groups, indexed streams, corrupt streams."""
import dataclasses

import numpy as np
import pytest
import torch

from ..cuda.helpers import all_bf16_patterns, make_weights
from unweight import ops
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.format.errors import FormatError
from unweight.ops import transcode
from unweight.runtime.modules import plane_tensor

NO_LUT = torch.empty(0, dtype=torch.uint16)


def _huffman(w: np.ndarray, chk_interval: int = 0):
    enc = tc.encode(w, "huffman", chk_interval=chk_interval)
    return enc.header, {s: plane_tensor(a) for s, a in enc.planes.items()}, enc.planes


def _same_as_codec(header, planes, host, **kw):
    err = torch.zeros(1, dtype=torch.int32)
    hp, pp = transcode.transcode_passes(header, planes, NO_LUT, err, **kw)
    want = tc.transcode_to_palette(header, host)
    assert hp.pack().tobytes() == want.header.pack().tobytes()
    assert set(pp) == set(want.planes)
    for s, a in want.planes.items():
        got = pp[s]
        assert tuple(got.shape) == a.shape, s
        assert got.numpy().tobytes() == np.ascontiguousarray(a).tobytes(), s
    assert pp[C.SUFFIX_SM] is planes[C.SUFFIX_SM]  # shared, not copied
    assert int(err) == 0
    return hp, pp


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (90, 200), (64, 4096), (33, 1090)])
def test_passes_match_the_codec_on_a_matrix(shape):
    _same_as_codec(*_huffman(make_weights(*shape, seed=shape[1])))


def test_passes_match_the_codec_on_every_bf16_pattern():
    # NaN payloads, infinities, subnormals, both zeros; most blocks verbatim
    hp, _ = _same_as_codec(*_huffman(all_bf16_patterns()))
    assert hp.num_verbatim > 1000


@pytest.mark.parametrize("chunk", [1, 2 * 40 * 72, 1 << 30])
def test_passes_match_the_codec_on_a_stack_in_groups(chunk):
    # chunk: one matrix per group (the histogram pass then decodes again), two, all at once
    w = np.stack([make_weights(40, 72, seed=e) for e in range(5)])
    w[3, 7, :] = 0x7F80  # a row of +Inf: verbatim blocks in a later group, ids past 2**16
    hp, pp = _same_as_codec(*_huffman(w), chunk_weights=chunk)
    assert hp.stack == 5 and hp.version_minor == C.MINOR_STACK
    assert tuple(pp[C.SUFFIX_IDX].shape) == (5, 40, 36)


def test_passes_read_the_checkpoint_index():
    # each matrix's decode takes its own segments' rows of the stack's __chk plane
    w = np.stack([make_weights(64, 256, seed=e) for e in range(3)])
    enc = tc.encode(w, "huffman", grid=(64, 256))
    enc = tc.with_index(enc.header, enc.planes, chk_interval=C.LOAD_CHK_INTERVAL)
    h, host = enc.header, enc.planes
    p = {s: plane_tensor(a) for s, a in host.items()}
    assert h.chk_interval and h.chk_cols > 1 and C.SUFFIX_CHK in p
    _same_as_codec(h, p, host, chunk_weights=64 * 256)


def test_the_device_passes_give_what_the_cpu_route_gives():
    h, p, _ = _huffman(make_weights(48, 96, seed=3))
    a = ops.transcode_to_palette(h, p, NO_LUT, torch.zeros(1, dtype=torch.int32))
    b = transcode.transcode_passes(h, p, NO_LUT, torch.zeros(1, dtype=torch.int32), variant=3)
    assert a[0].pack().tobytes() == b[0].pack().tobytes()
    for s in a[1]:
        assert a[1][s].numpy().tobytes() == b[1][s].numpy().tobytes(), s


def _scrambled(w: np.ndarray, seed: int):
    """(header, planes) of w's huffman encoding with its stream (slack excluded) scrambled."""
    h, p, _ = _huffman(w)
    exp = p[C.SUFFIX_EXP].clone()
    body = int(p[C.SUFFIX_OFF][-1])
    exp[:body] = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, body, dtype=np.uint8))
    return h, {**p, C.SUFFIX_EXP: exp}


def test_a_corrupt_stream_is_an_error_not_planes():
    h, p = _scrambled(np.stack([make_weights(32, 64, seed=e) for e in range(2)]), 0)
    err = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(FormatError):
        transcode.transcode_passes(h, p, NO_LUT, err, chunk_weights=1)
    assert int(err) > 0


@pytest.mark.parametrize("cols", [1, 31, 32, 33, 200])
def test_host_palette_passes_mark_blocks_as_the_encoder_does(cols):
    rng = np.random.default_rng(cols)
    exps = rng.choice(np.array([118, 119, 120, 121, 122, 200], np.uint8), size=(9, cols), p=[.2, .2, .2, .2, .19, .01])
    palette = np.array([118, 119, 120, 121, 122], np.uint8)
    idx, vpos, vexp = transcode._palette_planes(torch.from_numpy(exps), palette)
    bpr = -(-cols // C.PAL_BLOCK)
    pad = np.zeros((9, bpr * C.PAL_BLOCK), np.uint8)
    pad[:, :cols] = exps
    blocks = pad.reshape(9 * bpr, C.PAL_BLOCK)
    miss = [b for b in range(9 * bpr) if (blocks[b][: min(C.PAL_BLOCK, cols)] == 200).any()]
    assert vpos.numpy().tolist() == miss
    assert np.array_equal(vexp.numpy(), blocks[miss])
    nib = np.searchsorted(palette, np.where(exps == 200, 118, exps)).astype(np.uint8)
    for b in miss:  # a verbatim block's indices are 0
        r, k = divmod(b, bpr)
        nib[r, k * C.PAL_BLOCK:(k + 1) * C.PAL_BLOCK] = 0
    nib = np.pad(nib, ((0, 0), (0, cols % 2)))
    assert np.array_equal(idx.numpy(), nib[:, 0::2] | (nib[:, 1::2] << 4))


def test_block_ids_past_two_to_the_31_keep_their_bits():
    v = torch.tensor([0, 5, 0x7FFFFFF0], dtype=torch.int64).to(torch.int32).view(torch.uint32)
    got = transcode._add_u32(v, 0x80000000)
    assert got.dtype == torch.uint32
    assert got.view(torch.int32).numpy().view(np.uint32).tolist() == [0x80000000, 0x80000005, 0xFFFFFFF0]


def _index_same_as_codec(w, S, grid=None, **kw):
    enc = tc.encode(w, "huffman", **({"grid": grid} if grid else {}))
    h, host = enc.header, enc.planes
    p = {s: plane_tensor(a) for s, a in host.items()}
    err = torch.zeros(1, dtype=torch.int32)
    got = transcode.build_index(h, p, NO_LUT, err, chk_interval=S, **kw)
    want = tc.with_index(h, host, chk_interval=S)
    if want.header is h:
        assert got is None
        return None
    hg, pg = got
    assert hg.pack().tobytes() == want.header.pack().tobytes()
    assert set(pg) == set(want.planes)
    for s, a in want.planes.items():
        assert tuple(pg[s].shape) == a.shape, s
        assert pg[s].numpy().tobytes() == np.ascontiguousarray(a).tobytes(), s
    assert pg[C.SUFFIX_EXP] is p[C.SUFFIX_EXP] and int(err) == 0
    return hg


@pytest.mark.parametrize("shape,grid", [((64, 4096), None), ((37, 1090), (8, 512)), ((33, 200), (16, 96)),
                                        ((300, 520), (64, 512))])
@pytest.mark.parametrize("S", [16, 256, 1024])
def test_device_index_is_the_codecs(shape, grid, S):
    # partial last row groups and column chunks; entries past a short segment's end are 0
    _index_same_as_codec(make_weights(*shape, seed=shape[0]), S, grid)


def test_device_index_in_bands_and_of_every_bf16_pattern():
    hg = _index_same_as_codec(all_bf16_patterns(), 16, (8, 128), band_weights=1)  # one row group per band
    assert hg.chk_interval == 16 and hg.chk_cols == 63


@pytest.mark.parametrize("band", [16 * 300, 2 * 40 * 300, 1 << 26])
def test_device_index_of_a_stack(band):
    # bands of a matrix's row groups; two matrices at once (each with a short last group: 40
    # rows in groups of 16); the whole stack at once
    w = np.stack([make_weights(40, 300, seed=e) for e in range(3)])
    hg = _index_same_as_codec(w, 64, (16, 150), band_weights=band)
    assert hg.stack == 3 and hg.version_minor == C.MINOR_CHK


def test_device_index_is_not_built_where_none_is_taken():
    w = make_weights(8, 64, seed=1)
    assert _index_same_as_codec(w, 1024, (4, 64)) is None  # segments of 256 weights: one chain each
    enc = tc.encode(w, "palette")
    p = {s: plane_tensor(a) for s, a in enc.planes.items()}
    assert transcode.build_index(enc.header, p, NO_LUT, torch.zeros(1, dtype=torch.int32)) is None


def test_device_index_of_a_corrupt_stream_is_an_error():
    h, p = _scrambled(make_weights(64, 512, seed=2), 1)
    err = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(FormatError):
        transcode.build_index(h, p, NO_LUT, err, chk_interval=64)
    assert int(err) > 0


@pytest.mark.parametrize("rows,cols", [((32, 96), None), (None, (256, 512)), ((16, 48), (0, 256))])
def test_device_index_of_a_tensor_parallel_shard(rows, cols):
    # a rank's shard: partial segments, a smaller n_max and fewer entries per row, crc32 0
    from unweight.codec import shard as sh
    enc = tc.encode(make_weights(96, 512, seed=5), "huffman", grid=(16, 128))
    h, host = sh.shard_planes(enc.header, enc.planes, rows=rows, cols=cols)
    p = {s: plane_tensor(np.ascontiguousarray(a)) for s, a in host.items()}
    hg, pg = transcode.build_index(h, p, NO_LUT, torch.zeros(1, dtype=torch.int32), chk_interval=64)
    want = tc.with_index(h, host, chk_interval=64)
    assert hg.pack().tobytes() == want.header.pack().tobytes() and hg.crc32 == 0
    assert pg[C.SUFFIX_CHK].numpy().tobytes() == want.planes[C.SUFFIX_CHK].tobytes()


def test_more_blocks_than_uint32_ids_is_refused():
    # refused before anything is decoded (the header alone says it): 65535 x 65536 x 1024 blocks
    h, p, _ = _huffman(make_weights(4, 32, seed=0))
    huge = dataclasses.replace(h, stack=65535, rows=65536, cols=32 * 1024)
    with pytest.raises(ValueError, match="uint32"):
        transcode.transcode_passes(huge, p, NO_LUT, torch.zeros(1, dtype=torch.int32))
    transcode._check_block_ids((1 << 32) - 1)


@pytest.mark.parametrize("chunk", [1, 2 * 24 * 100, 1 << 30])
def test_stack_encode_passes_are_the_codecs_stack_encoding(chunk):
    # BF16 experts -> one palette stack, a group of whole matrices on the device at a time
    w = np.stack([make_weights(24, 100, seed=e) for e in range(5)])
    w[3, 2, :40] = 0xFF80  # -Inf: verbatim blocks in a later group
    want = tc.encode(w, "palette", grid=tc.choose_grid(24, 100))
    for src in (torch.from_numpy(w), torch.from_numpy(w).view(torch.bfloat16)):
        hdr, got = transcode.encode_stack_passes(src, torch.device("cpu"), chunk)
        assert hdr.pack().tobytes() == dataclasses.replace(want.header, crc32=0).pack().tobytes()
        assert hdr.stack == 5 and tuple(got[C.SUFFIX_IDX].shape) == (5, 24, 50)
        for s in (C.SUFFIX_SM, C.SUFFIX_IDX, C.SUFFIX_VPOS, C.SUFFIX_VEXP):
            assert got[s].numpy().tobytes() == np.ascontiguousarray(want.planes[s]).tobytes(), s
    h2, p2 = transcode.encode_palette_stack(torch.from_numpy(w), "cpu")  # the codec's route
    assert h2.pack().tobytes() == hdr.pack().tobytes() and p2[C.SUFFIX_IDX].shape == got[C.SUFFIX_IDX].shape
    with pytest.raises(ValueError, match="E, rows, cols"):
        transcode.encode_palette_stack(torch.from_numpy(w[0]), "cpu")
