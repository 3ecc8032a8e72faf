"""The one checkpoint verifier: every encoded tensor decoded (or validated) and every raw
tensor's stored crc32 checked.  Used by the offline tools, the transformers loader and the
vLLM plugin alike."""
from __future__ import annotations

import numpy as np

from ..format.checkpoint import CompressedCheckpoint
from ..format.errors import ChecksumError
from . import tensor_codec as tc


def raw_crc32(arr: np.ndarray, threads: int | None = None) -> int:
    """crc32 (zlib's) of an array's bytes in C order."""
    return int(tc._C.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8), threads or tc.default_threads()))


def verify_checkpoint(ck: CompressedCheckpoint, threads: int | None = None, decode: bool = True) -> dict:
    """Validate every encoded tensor (with decode: decode it and check its crc32) and crc32
    every raw tensor that has a stored checksum.  Raises FormatError / ChecksumError (one line
    naming tensor and file).  Returns {"encoded_checked", "raw_checked", "decoded"}."""
    threads = threads or tc.default_threads()
    crcs = ck.raw_checksums()
    n_enc = n_raw = 0
    for base in ck.encoded:
        where = ck.location(base)
        h = ck.header(base)
        planes = ck.planes(base)
        if decode:
            tc.decode(h, planes, threads, where=where, verify=True)
        else:
            tc.check_planes(h, planes, where)
        n_enc += 1
    for name in ck.raw:
        if name in crcs:
            if raw_crc32(ck.array(name), threads) != crcs[name]:
                raise ChecksumError(f"checksum mismatch in tensor {name!r} ({ck.file_of(name)})")
            n_raw += 1
    return {"encoded_checked": n_enc, "raw_checked": n_raw, "decoded": decode}
