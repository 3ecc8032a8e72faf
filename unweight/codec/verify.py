"""The one checkpoint verifier: every encoded tensor decoded (or validated) against its stored
crc32 and, with a Huffman checkpoint index, that index against the one its decoded weights
give; every raw tensor's bytes against the crc32 its shard records; and the checkpoint's own
records against each other.  Used by the offline tools, the transformers loader and the vLLM
plugin alike."""
from __future__ import annotations

import json
import os

import numpy as np

from .. import _C
from ..format import constants as C
from ..format.checkpoint import CompressedCheckpoint
from ..format.errors import ChecksumError, FormatError
from ..format.header import TensorHeader
from ..format.quant_config import check_format_version
from . import tensor_codec as tc


def raw_crc32(arr: np.ndarray, threads: int | None = None) -> int:
    """crc32 (zlib's) of an array's bytes in C order; arr: any dtype and shape, host memory."""
    return int(tc._C.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8), threads or tc.default_threads()))


def check_raw(ck: CompressedCheckpoint, name: str, arr: np.ndarray | None = None, threads: int | None = None) -> None:
    """Check raw tensor `name` (its bytes: `arr`, else read from ck) against the crc32 its
    shard records.  FormatError when none is recorded (every raw tensor of a compressed
    checkpoint has one), ChecksumError on a mismatch."""
    crcs = ck.raw_checksums()
    if name not in crcs:
        raise FormatError(f"tensor {name!r} ({ck.file_of(name)}) has no stored checksum")
    if raw_crc32(ck.array(name) if arr is None else arr, threads) != crcs[name]:
        raise ChecksumError(f"checksum mismatch in tensor {name!r} ({ck.file_of(name)}): its bytes differ from the "
                            f"original")


def check_records(ck: CompressedCheckpoint) -> None:
    """Check the compress report (REPORT_NAME), when the folder has one, against the
    checkpoint: its shard list, tensor counts and output size.  The index's records are
    checked when ck is opened (CompressedCheckpoint); the report is a second, independent
    record of the same facts, so a folder that lost a shard disagrees with it too."""
    if not ck.folder:
        return
    p = os.path.join(ck.folder, C.REPORT_NAME)
    if not os.path.exists(p):
        return
    try:
        with open(p) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        raise FormatError(f"{p}: corrupt compress report (invalid JSON)") from None
    if not isinstance(rep, dict):
        raise FormatError(f"{p}: corrupt compress report")
    if "format_version" in rep:  # a version record like the config's and the shards': the same rule
        check_format_version(rep["format_version"], p)
    got = {"files": sorted(os.path.basename(f.path) for f in ck.files), "encoded_tensors": len(ck.encoded),
           "raw_tensors": len(ck.raw), "output_bytes": sum(os.path.getsize(f.path) for f in ck.files)}
    if isinstance(rep.get("files"), list):
        rep["files"] = sorted(map(str, rep["files"]))  # an index may list shards in any order
    for key, have in got.items():
        if key in rep and rep[key] != have:
            raise FormatError(f"{p}: the report records {key} = {rep[key]}, the checkpoint has {have}")


def index_rows(h: TensorHeader, w: np.ndarray, lens: np.ndarray, threads: int) -> np.ndarray:
    """The ``__chk`` rows of the segments of decoded rows w (uint16 [n, K], host; whole row
    groups starting on a group boundary), as the encoder writes them (``_C.huffman_index``
    sums the code lengths of w's weights; the index is a function of those alone): uint16
    [n_chunks, ceil(n / R), h.chk_cols], unused entries 0."""
    R, ng = h.rows_per_group, -(-w.shape[0] // h.rows_per_group)
    chk = _C.huffman_index(np.ascontiguousarray(w), R, h.cols_per_chunk, lens, threads, h.chk_interval)
    out = np.zeros((h.n_chunks, ng, h.chk_cols), np.uint16)  # a short last group needs fewer columns
    out[:, :, :chk.shape[1]] = chk.reshape(h.n_chunks, ng, chk.shape[1])
    return out


def _compare_index(h: TensorHeader, stored: np.ndarray, rebuilt: np.ndarray, where: str, first: int = 0) -> None:
    """FormatError naming the first segment whose stored ``__chk`` row (stored: uint16
    [n_seg, P] of one matrix) differs from the rebuilt one (same shape); first: the stream
    number of the matrix's segment 0 (a stack's matrix e starts at e * n_seg)."""
    bad = np.flatnonzero((stored != rebuilt).any(axis=1))
    if bad.size:
        s = int(bad[0])
        m = int(np.flatnonzero(stored[s] != rebuilt[s])[0])
        raise FormatError(f"checkpoint index of {where or 'the tensor'} is wrong: segment {first + s} entry {m} is "
                          f"{int(stored[s, m])} bits, its chain of {h.chk_interval} codes takes {int(rebuilt[s, m])}")


def check_index(h: TensorHeader, planes: dict, w: np.ndarray, threads: int | None = None, where: str = "") -> None:
    """Check a huffman tensor's stored ``__chk`` index exactly against its decoded weights w
    (uint16 [N, K], a stack [E, N, K]; host memory): byte for byte the index the encoder
    builds from them.  The CPU decoders ignore the index, so their output and crc32 cannot
    vouch for it, while the GPU decoders start chains at its checkpoints.  No-op for tensors
    without one."""
    if h.encoding != C.ENC_HUFFMAN or not h.chk_interval:
        return
    threads = threads or tc.default_threads()
    lens = tc.index_lens(h)
    stored, n = planes[C.SUFFIX_CHK], h.n_segments
    for e, m in enumerate(w if h.stack else [w]):
        rebuilt = index_rows(h, m, lens, threads).reshape(n, h.chk_cols)
        _compare_index(h, np.asarray(stored[e * n:(e + 1) * n]), rebuilt, where, e * n)


def decode_verified(h: TensorHeader, planes: dict, threads: int | None = None, where: str = "",
                    band_bytes: int = 64 << 20, keep: bool = True, done=None) -> np.ndarray | None:
    """tc.decode_banded (crc32 checked, a band of row groups at a time; keep / done as there),
    which for a huffman tensor with a ``__chk`` index also checks the index exactly
    (check_index), a band at a time: uint16 [N, K] (a stack [E, N, K]) on the host when keep,
    else None.  FormatError / ChecksumError naming `where`."""
    if h.encoding != C.ENC_HUFFMAN or not h.chk_interval:
        return tc.decode_banded(h, planes, threads, where, band_bytes, keep, done)
    threads = threads or tc.default_threads()
    if h.stack:  # stacks decode whole (as in tc.decode_banded)
        out = tc.decode(h, planes, threads, where, verify=True)
        check_index(h, planes, out, threads, where)
        return out if keep else None
    lens = tc.index_lens(h)
    R = h.rows_per_group
    rebuilt = np.zeros((h.n_chunks, h.n_groups, h.chk_cols), np.uint16)  # chunk-major: s = c * n_groups + g

    def each(r0, r1, band):
        rebuilt[:, r0 // R:-(-r1 // R)] = index_rows(h, band, lens, threads)

    out = tc.decode_banded(h, planes, threads, where, band_bytes, keep, done, each)
    _compare_index(h, np.asarray(planes[C.SUFFIX_CHK]), rebuilt.reshape(h.n_segments, h.chk_cols), where)
    return out


def sm_release(ck: CompressedCheckpoint, base: str, h):
    """done(r0, r1) for tc.decode_banded: drop the decoded rows' ``__sm`` pages of the map."""
    name, row = ck.encoded[base][C.SUFFIX_SM], h.cols
    return lambda r0, r1: ck.release(name, r0 * row, r1 * row)


def verify_checkpoint(ck: CompressedCheckpoint, threads: int | None = None, decode: bool = True) -> dict:
    """Validate every encoded tensor (with decode: decode it and check its crc32), check every
    raw tensor's crc32 and the checkpoint's records.  Raises FormatError / ChecksumError (one
    line naming tensor and file).  Returns {"encoded_checked", "raw_checked", "decoded"}."""
    threads = threads or tc.default_threads()
    check_records(ck)
    n_enc = n_raw = 0
    for base in ck.encoded:
        where = ck.location(base)
        h = ck.header(base)
        planes = ck.planes(base)
        if decode:  # a band at a time: memory holds one band of output, not the tensor
            decode_verified(h, planes, threads, where=where, keep=False, done=sm_release(ck, base, h))
        else:
            tc.check_planes(h, planes, where)
        ck.release_encoded(base)
        n_enc += 1
    for name in ck.raw:
        check_raw(ck, name, threads=threads)
        ck.release(name)
        n_raw += 1
    return {"encoded_checked": n_enc, "raw_checked": n_raw, "decoded": decode}
