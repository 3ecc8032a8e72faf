"""Checksum of a tensor-parallel tensor from its shards, without any rank decoding it whole.

Each rank decodes only its own block of a sharded tensor and makes a small record of it
(``shard_record``); the TP group gathers the records (with whatever collective its runtime
offers: transformers' torch.distributed group, vLLM's CPU group) and every rank checks them
against the tensor's stored crc32 with crc32 arithmetic (``check_shard_records``).  The same
function serves the transformers and the vLLM integrations.

Records are plain tuples, so they travel through ``all_gather_object``:
    ("rows", r0, r1, crc32 of the block's bytes)                      a block of whole rows
    ("cols", c0, c1, [crc32 of each row's bytes within the block])    a block of columns
"""
from __future__ import annotations

import logging
import numpy as np

from ..format.errors import ChecksumError
from ..format.header import TensorHeader
from . import tensor_codec as tc
from .shard import combine_col_shard_crcs, combine_row_shard_crcs, row_crcs
from .verify import check_index, raw_crc32

log = logging.getLogger(__name__)


def shard_record(w: np.ndarray, rows: tuple | None = None, cols: tuple | None = None) -> tuple:
    """Record of a decoded block w (uint16 [r1-r0, c1-c0]) of rows [r0, r1) or columns [c0, c1)."""
    if cols is not None:
        return ("cols", int(cols[0]), int(cols[1]), [int(c) for c in row_crcs(w)])
    r0, r1 = rows if rows is not None else (0, w.shape[0])
    return ("rows", int(r0), int(r1), raw_crc32(w))


def decode_record(h: TensorHeader, planes: dict, rows: tuple | None, cols: tuple | None, full_cols: int,
                  where: str = "") -> tuple:
    """A rank's block decoded on the host, its stored checkpoint index checked exactly against
    it (the GPU decoders start chains at it), and its record: (uint16 [r1-r0, c1-c0], record).
    The record is of columns where cols is given and is not the whole width full_cols, else
    of rows (rows None: all of them)."""
    w = tc.decode(h, planes, verify=False, where=where)
    check_index(h, planes, w, where=where)
    per_row = cols is not None and tuple(cols) != (0, full_cols)
    return w, shard_record(w, cols=cols) if per_row else shard_record(w, rows=rows)


def check_shard_records(records: list, header: TensorHeader, where: str = "",
                        parts: str = "tensor-parallel shards") -> bool:
    """Check the gathered records of one tensor (every rank's; duplicates from replicated
    shards allowed) against header.crc32.  Raises ChecksumError on a mismatch; returns False
    (with a log line) when the blocks do not tile the tensor, so no check was possible.
    parts: what the blocks are, for the messages (an expert-parallel stack's are slices)."""
    kind = records[0][0]
    uniq = {r[1]: (r[2], r[3]) for r in records}
    starts = sorted(uniq)
    n = header.rows if kind == "rows" else header.cols
    tiles = starts[0] == 0 and uniq[starts[-1]][0] == n and all(uniq[a][0] == b for a, b in zip(starts, starts[1:]))
    if not tiles or any(r[0] != kind for r in records):
        log.warning("unweight: %s: the %s do not tile the tensor; its crc32 is not checked across ranks",
                    where, parts)
        return False
    if kind == "rows":
        crc = combine_row_shard_crcs([uniq[s][1] for s in starts], [(uniq[s][0] - s) * header.cols * 2 for s in starts])
    else:
        crc = combine_col_shard_crcs([np.asarray(uniq[s][1], dtype=np.uint32) for s in starts],
                                     [(uniq[s][0] - s) * 2 for s in starts])
    if crc != header.crc32:
        across = f"across the {parts}" if len(starts) > 1 else "of the decoded tensor"
        raise ChecksumError(f"{where}: checksum mismatch {across} (decoded bytes differ from the original)")
    return True
