"""The one checkpoint verifier: every encoded tensor decoded (or validated) against its stored
crc32, every raw tensor's bytes against the crc32 its shard records, and the checkpoint's own
records against each other.  Used by the offline tools, the transformers loader and the vLLM
plugin alike."""
from __future__ import annotations

import json
import os

import numpy as np

from ..format import constants as C
from ..format.checkpoint import CompressedCheckpoint
from ..format.errors import ChecksumError, FormatError
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
    got = {"files": sorted(os.path.basename(f.path) for f in ck.files), "encoded_tensors": len(ck.encoded),
           "raw_tensors": len(ck.raw), "output_bytes": sum(os.path.getsize(f.path) for f in ck.files)}
    if isinstance(rep.get("files"), list):
        rep["files"] = sorted(map(str, rep["files"]))  # an index may list shards in any order
    for key, have in got.items():
        if key in rep and rep[key] != have:
            raise FormatError(f"{p}: the report records {key} = {rep[key]}, the checkpoint has {have}")


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
            tc.decode_banded(h, planes, threads, where=where, keep=False, done=sm_release(ck, base, h))
        else:
            tc.check_planes(h, planes, where)
        ck.release_encoded(base)
        n_enc += 1
    for name in ck.raw:
        check_raw(ck, name, threads=threads)
        ck.release(name)
        n_raw += 1
    return {"encoded_checked": n_enc, "raw_checked": n_raw, "decoded": decode}
