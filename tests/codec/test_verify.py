"""The checkpoint verifier (unweight/codec/verify.py) checks what the CPU decoders cannot vouch
for: the Huffman checkpoint index (exactly, against the index rebuilt from the
decoded weights), every record of the format version, and a numbered shard set with a shard
missing."""
import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file

import unweight
from unweight import _C
from unweight.codec import tensor_codec as tc
from unweight.codec.huffman import canonical_codes
from unweight.codec.reference import decode_reference
from unweight.codec.shard import shard_planes
from unweight.codec.verify import check_index, check_records, decode_verified, verify_checkpoint
from unweight.format import constants as C
from unweight.format.checkpoint import CompressedCheckpoint
from unweight.format.errors import FormatError, InputError, VersionError

from ..conftest import bf16_gaussian

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"


def _golden_index_example():
    planes = {k[1:]: v for k, v in load_file(str(GOLDEN / "index_example_huffman.safetensors")).items()}
    return tc.encoded_header(planes, "w"), planes


def _indexed(rows=70, cols=256, S=64, grid=(16, 128), seed=0):
    """An indexed huffman tensor whose last row group is partial: (header, planes, weights)."""
    w = bf16_gaussian(np.random.default_rng(seed), (rows, cols))
    e = tc.encode(w, "huffman", grid=grid, chk_interval=S, threads=1)
    assert e.header.chk_interval == S and e.planes[C.SUFFIX_CHK].shape[1] > 0
    return e.header, e.planes, w


def _with_chk(planes, fix):
    p = dict(planes)
    p[C.SUFFIX_CHK] = planes[C.SUFFIX_CHK].copy()
    fix(p[C.SUFFIX_CHK])
    return p


def test_golden_index_example_passes_and_a_wrong_entry_is_named():
    h, planes = _golden_index_example()
    decode_verified(h, planes, threads=1, where="w")
    # FORMAT.md's worked example: row 0 of chunk 0 takes 29 bits; an index saying 30 is wrong
    # although it lies inside [S, 12 S] and inside the segment (the bounds check passes it).
    bad = _with_chk(planes, lambda c: c.__setitem__((0, 0), 30))
    tc.check_planes(h, bad, "w")
    with pytest.raises(FormatError, match=r"checkpoint index of w is wrong: segment 0 entry 0 is 30 bits, its chain "
                                          r"of 16 codes takes 29"):
        decode_verified(h, bad, threads=1, where="w")
    with pytest.raises(FormatError, match="checkpoint index is wrong"):
        decode_reference(bad[C.SUFFIX_HDR], bad)  # the reference decoder agrees


@pytest.mark.parametrize("band_bytes", [1, 5000, 64 << 20], ids=["band-per-group", "bands", "whole"])
@pytest.mark.parametrize("keep", [True, False])
def test_decode_verified_equals_decode_and_finds_every_wrong_entry(band_bytes, keep):
    h, planes, w = _indexed()
    got = decode_verified(h, planes, threads=2, band_bytes=band_bytes, keep=keep)
    if keep:
        np.testing.assert_array_equal(got, w)
    else:
        assert got is None
    used = np.argwhere(planes[C.SUFFIX_CHK] > 0)
    # The first and last used entry (the last is in the partial row group), each one bit off
    # either way: still within the bounds, so only the exact check can tell.
    for s, m in (used[0], used[-1]):
        for delta in (1, -1):
            bad = _with_chk(planes, lambda c: c.__setitem__((s, m), int(c[s, m]) + delta))
            tc.check_planes(h, bad)
            with pytest.raises(FormatError, match=rf"segment {s} entry {m} is"):
                decode_verified(h, bad, threads=2, band_bytes=band_bytes, keep=keep)


def test_index_the_loader_builds_is_what_the_verifier_rebuilds():
    w = bf16_gaussian(np.random.default_rng(3), (96, 512))
    plain = tc.encode(w, "huffman", grid=(32, 128), threads=1)
    loaded = tc.with_index(plain.header, plain.planes, threads=1, chk_interval=C.LOAD_CHK_INTERVAL)
    decode_verified(loaded.header, loaded.planes, threads=1)
    check_index(loaded.header, loaded.planes, w, threads=1)


def test_an_unused_entry_that_is_not_zero_is_refused():
    h, planes, _ = _indexed()
    rows = np.flatnonzero(tc.index_sizes(h) < h.chk_cols)  # segments of the partial row group
    bad = _with_chk(planes, lambda c: c.__setitem__((rows[0], h.chk_cols - 1), 1))
    with pytest.raises(FormatError):
        decode_verified(h, bad, threads=1)


def test_index_of_a_stack_is_checked_matrix_by_matrix():
    # Writers put no index on stacks, but readers accept one (FORMAT.md "Stacked tensors"): build
    # one from each matrix's index and let the reference decoder confirm it first.
    w = bf16_gaussian(np.random.default_rng(4), (2, 48, 128))
    e = tc.encode(w, "huffman", grid=(16, 128), threads=1)
    h = e.header
    h.chk_interval, h.version_minor = 64, C.MINOR_CHK
    lens = np.zeros((C.HUFF_NUM_CTX, 256), np.uint8)  # the stack's one table, widened
    lens[:, h.exp_lo:h.exp_hi + 1] = h.table
    codes = np.stack([canonical_codes(row) for row in lens])
    chk = np.concatenate([_C.huffman_encode_indexed(w[i], 16, 128, lens, codes, 1, 64)[2] for i in range(2)])
    planes = dict(e.planes, **{C.SUFFIX_HDR: h.pack(), C.SUFFIX_CHK: chk})
    np.testing.assert_array_equal(decode_reference(planes[C.SUFFIX_HDR], planes), w)
    np.testing.assert_array_equal(decode_verified(h, planes, threads=1), w)
    s = h.n_segments + 1  # matrix 1's second segment
    bad = _with_chk(planes, lambda c: c.__setitem__((s, 0), int(c[s, 0]) + 1))
    with pytest.raises(FormatError, match=rf"segment {s} entry 0"):
        decode_verified(h, bad, threads=1, where="stack")


@pytest.mark.parametrize("axis", ["rows", "cols"])
def test_check_index_of_a_tensor_parallel_shard(axis):
    h, planes, w = _indexed(rows=64, cols=512, grid=(16, 128))
    cut = {"rows": (16, 48)} if axis == "rows" else {"cols": (128, 384)}
    hs, ps = shard_planes(h, planes, **cut)
    part = w[16:48] if axis == "rows" else w[:, 128:384]
    check_index(hs, ps, tc.decode(hs, ps, threads=1, verify=False), threads=1)
    np.testing.assert_array_equal(tc.decode(hs, ps, threads=1, verify=False), part)
    bad = _with_chk(ps, lambda c: c.__setitem__((0, 0), int(c[0, 0]) + 1))
    with pytest.raises(FormatError, match="checkpoint index"):
        check_index(hs, bad, part, threads=1, where="shard")


# ------------------------------------------------------------------ whole checkpoints


def _tensor_offsets(path):
    """{name: (begin, end)} absolute byte ranges of a safetensors file's tensors."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in hdr.items()
            if k != "__metadata__"}


def _flip(path, pos, bit=1):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ bit]))


def test_verify_refuses_a_checkpoint_whose_stored_index_has_a_flipped_bit(tiny_model, tmp_path):
    src, _ = tiny_model
    out = str(tmp_path / "c")
    unweight.compress(src, out, index=True, progress=False)
    shard = os.path.join(out, "model.safetensors")
    chk = sorted(k for k in _tensor_offsets(shard) if k.endswith(C.SUFFIX_CHK))
    assert chk
    for name in chk:
        bad = str(tmp_path / ("bad-" + name))
        shutil.copytree(out, bad)
        _flip(os.path.join(bad, "model.safetensors"), _tensor_offsets(shard)[name][0])  # entry 0's low bit
        base = name[: -len(C.SUFFIX_CHK)]
        with pytest.raises(FormatError, match=rf"checkpoint index of {base} .* is wrong"):
            unweight.verify(bad)
        ck = CompressedCheckpoint(bad)  # the loaders' verify-at-load is the same call
        try:
            with pytest.raises(FormatError, match="checkpoint index"):
                verify_checkpoint(ck, threads=1)
            verify_checkpoint(ck, threads=1, decode=False)  # structure only: a bounds-valid index passes
        finally:
            ck.close()
    unweight.verify(out)


@pytest.mark.parametrize("version", ["2.0", "0.9", None])
def test_report_format_version_follows_the_version_rule(tiny_model, tmp_path, version):
    src, _ = tiny_model
    out = str(tmp_path / "c")
    unweight.compress(src, out, progress=False)
    p = os.path.join(out, C.REPORT_NAME)
    rep = json.load(open(p))
    rep["format_version"] = version
    json.dump(rep, open(p, "w"))
    ck = CompressedCheckpoint(out)
    try:
        with pytest.raises(VersionError, match=rf"{C.REPORT_NAME}: unsupported unweight format version"):
            check_records(ck)
    finally:
        ck.close()
    rep["format_version"] = f"{C.VERSION_MAJOR}.99"  # any minor of a known major
    json.dump(rep, open(p, "w"))
    unweight.verify(out)


@pytest.mark.parametrize("where", ["shard", "index", "config"])
@pytest.mark.parametrize("version", ["2.0", "9.9"])
def test_every_version_record_is_checked_by_every_command(tiny_model, tmp_path, where, version):
    src, _ = tiny_model
    out = str(tmp_path / "c")
    unweight.compress(src, out, max_shard_size="200KB", progress=False)
    _set_version(out, where, version)
    for run in (lambda: unweight.verify(out), lambda: unweight.inspect(out),
                lambda: unweight.decompress(out, str(tmp_path / "d"), progress=False)):
        with pytest.raises(VersionError, match=rf"unsupported unweight format version {version} .*upgrade unweight"):
            run()
    assert not os.path.exists(tmp_path / "d")


def _set_version(folder, where, version):
    if where == "config":
        p = os.path.join(folder, "config.json")
        cfg = json.load(open(p))
        cfg["quantization_config"]["format_version"] = version
        json.dump(cfg, open(p, "w"))
    elif where == "index":
        p = os.path.join(folder, C.INDEX_NAME)
        idx = json.load(open(p))
        idx["metadata"]["unweight"]["format_version"] = version
        json.dump(idx, open(p, "w"))
    else:  # the last shard's __metadata__, rewritten in place (same length: sizes stay true)
        shard = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))[-1]
        p = os.path.join(folder, shard)
        b = bytearray(open(p, "rb").read())
        n = struct.unpack("<Q", b[:8])[0]
        old = f'"unweight_format_version":"{C.FORMAT_VERSION}"'.encode()
        i = bytes(b[8:8 + n]).find(old)
        assert i >= 0 and len(version) == len(C.FORMAT_VERSION)
        b[8 + i:8 + i + len(old)] = f'"unweight_format_version":"{version}"'.encode()
        open(p, "wb").write(b)


def test_a_lost_numbered_shard_is_refused_without_index_and_report(tiny_model, tmp_path):
    src, tensors = tiny_model
    out = str(tmp_path / "c")
    r = unweight.compress(src, out, max_shard_size="200KB", progress=False)
    assert len(r["files"]) >= 2
    total = len(r["files"])
    lost = f"model-00002-of-{total:05d}.safetensors"
    for f in (C.INDEX_NAME, C.REPORT_NAME, lost):
        os.remove(os.path.join(out, f))
    for run in (lambda: unweight.verify(out), lambda: unweight.inspect(out),
                lambda: unweight.decompress(out, str(tmp_path / "d"), progress=False)):
        with pytest.raises(InputError, match=rf"shard {lost} is missing"):
            run()
    assert not os.path.exists(tmp_path / "d")


@pytest.mark.parametrize("shape,grid,S", [((70, 256), (16, 128), 64), ((33, 100), (8, 64), 16),
                                         ((5, 4097), (4, 4097), 4096), ((64, 96), (64, 96), 16),
                                         ((3, 7), (2, 7), 16), ((130, 520), (32, 256), 1024)])
def test_index_builder_equals_the_encoders_index(shape, grid, S):
    # _C.huffman_index (no stream written) against the index the encoder writes beside its
    # stream: odd widths, partial row groups and chunks, S past a row and past a segment.
    w = bf16_gaussian(np.random.default_rng(sum(shape)), shape)
    w.ravel()[::97] = np.arange(w.ravel()[::97].size, dtype=np.uint16) * 613  # rare exponents, long codes
    plain = tc.encode(w, "huffman", grid=grid, threads=1)
    lens = tc.index_lens(plain.header)
    codes = np.stack([canonical_codes(row) for row in lens])
    _, _, want = _C.huffman_encode_indexed(w, *grid, lens, codes, 1, S)
    for threads in (1, 3):
        got = _C.huffman_index(w, *grid, lens, threads, S)
        assert got.dtype == np.uint16 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # with_index builds its plane this way: byte for byte what an indexed encode writes
    idx = tc.with_index(plain.header, plain.planes, threads=2, chk_interval=S)
    full = tc.encode(w, "huffman", grid=grid, chk_interval=S, threads=1)
    assert idx.header.pack().tobytes() == full.header.pack().tobytes()
    assert idx.planes.keys() == full.planes.keys()
    for k in full.planes:
        assert np.asarray(idx.planes[k]).tobytes() == np.asarray(full.planes[k]).tobytes(), k
    with pytest.raises(ValueError, match="checkpoint interval"):
        _C.huffman_index(w, *grid, lens, 1, 24)
