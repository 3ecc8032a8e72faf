"""Pack and parse the per-tensor header (the ``<name>__hdr`` uint8 tensor).

Layout (little-endian, docs/FORMAT.md "Tensor header"):

    off size field
      0   4  magic  b"UNWT"
      4   1  version_major
      5   1  version_minor
      6   1  encoding        1 huffman, 2 palette
      7   1  src_dtype       1 bf16
      8   4  rows (N)
     12   4  cols (K)
     16   4  rows_per_group (R)
     20   4  cols_per_chunk (C)
     24   4  crc32 of the original tensor bytes
     28   1  max_code_len    huffman: 12; palette: 0
     29   1  num_ctx         huffman: 4;  palette: 0
     30   1  exp_lo          huffman: smallest coded exponent
     31   1  exp_hi          huffman: largest coded exponent
     32   1  pal_size        palette: entries used (1..16)
     33   1  pal_block       palette: 32
     34   2  stack           0: a matrix [N, K]; E >= 1: a stack [E, N, K] of E matrices (v1.1)
     36   4  num_verbatim    palette: verbatim blocks
                 chk_interval    huffman: symbols S between index checkpoints, 0 = no __chk (v1.2)
     40  16  palette         palette: exponents, unused entries 0
     56   4  table_bytes     huffman: num_ctx * (exp_hi - exp_lo + 1); palette: 0
     60   4  header_crc32    crc32 of bytes [0, 60) followed by the table
     64   *  table           huffman code lengths, uint8 [num_ctx][exp_hi - exp_lo + 1]
"""
from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np

from . import constants as C
from .errors import FormatError, VersionError
from .quant_config import version_advice

_FIXED = struct.Struct("<4sBBBBIIIIIBBBBBBHI16sI")
assert _FIXED.size == 60


@dataclasses.dataclass
class TensorHeader:
    """Parsed header of one encoded tensor; ``table`` is uint8 [num_ctx, exp_hi-exp_lo+1] or None."""

    encoding: int
    rows: int
    cols: int
    rows_per_group: int
    cols_per_chunk: int
    crc32: int
    max_code_len: int = 0
    num_ctx: int = 0
    exp_lo: int = 0
    exp_hi: int = 0
    pal_size: int = 0
    pal_block: int = 0
    num_verbatim: int = 0
    palette: bytes = bytes(16)
    table: np.ndarray | None = None
    # Huffman only (format 1.2, stored where a palette header keeps num_verbatim): S, the
    # symbols between two checkpoints of the __chk index; 0 = the tensor has no index.
    chk_interval: int = 0
    version_major: int = C.VERSION_MAJOR
    # The smallest minor whose features the tensor uses (constants.MINOR_*): a tensor without
    # them stays byte-identical to a 1.0 tensor.
    version_minor: int = 0
    src_dtype: int = C.DTYPE_BF16
    # 0: the tensor is the matrix [rows, cols]; E >= 1: a stack [E, rows, cols] of E matrices
    # that share the code table / palette and each have their own segment grid (FORMAT.md,
    # "Stacked tensors").
    stack: int = 0

    @property
    def n_matrices(self) -> int:
        return max(1, self.stack)

    @property
    def shape(self) -> tuple:
        """The original tensor's shape: (rows, cols), or (stack, rows, cols) for a stack."""
        return (self.stack, self.rows, self.cols) if self.stack else (self.rows, self.cols)

    @property
    def numel(self) -> int:
        return self.n_matrices * self.rows * self.cols

    @property
    def n_groups(self) -> int:
        return -(-self.rows // self.rows_per_group)

    @property
    def n_chunks(self) -> int:
        return -(-self.cols // self.cols_per_chunk)

    @property
    def n_segments(self) -> int:
        """Segments of one matrix (a stack has n_matrices * n_segments)."""
        return self.n_groups * self.n_chunks

    @property
    def chk_cols(self) -> int:
        """P, the checkpoints per segment of the __chk plane [n_segments, P] (0 without an index):
        ceil(n / S) - 1 for the largest segment's n = min(R, rows) * min(C, cols) weights."""
        if not self.chk_interval:
            return 0
        n = min(self.rows_per_group, self.rows) * min(self.cols_per_chunk, self.cols)
        return -(-n // self.chk_interval) - 1

    @property
    def encoding_name(self) -> str:
        return {C.ENC_HUFFMAN: "huffman", C.ENC_PALETTE: "palette"}[self.encoding]

    def pack(self) -> np.ndarray:
        """Serialize to the uint8 array stored as ``<name>__hdr``."""
        table = b"" if self.table is None else np.ascontiguousarray(self.table, dtype=np.uint8).tobytes()
        fixed = _FIXED.pack(
            C.MAGIC, self.version_major, self.version_minor, self.encoding, self.src_dtype,
            self.rows, self.cols, self.rows_per_group, self.cols_per_chunk, self.crc32,
            self.max_code_len, self.num_ctx, self.exp_lo, self.exp_hi, self.pal_size, self.pal_block,
            self.stack, self.chk_interval if self.encoding == C.ENC_HUFFMAN else self.num_verbatim,
            bytes(self.palette).ljust(16, b"\0"), len(table),
        )
        crc = zlib.crc32(table, zlib.crc32(fixed))
        return np.frombuffer(fixed + struct.pack("<I", crc) + table, dtype=np.uint8).copy()

    @classmethod
    def parse(cls, raw, where: str = "") -> "TensorHeader":
        """Parse and validate a header; raise FormatError/VersionError naming ``where``."""
        b = bytes(np.asarray(raw, dtype=np.uint8).reshape(-1)) if not isinstance(raw, (bytes, bytearray)) else bytes(raw)
        at = f" in {where}" if where else ""
        if len(b) < C.HEADER_BYTES:
            raise FormatError(f"tensor header truncated{at}: {len(b)} bytes, need {C.HEADER_BYTES}")
        f = _FIXED.unpack_from(b, 0)
        (magic, vmaj, vmin, enc, dt, n, k, r, cc, crc, mcl, nctx, lo, hi, psz, pblk, stack, nverb, pal,
         tbytes) = f
        if magic != C.MAGIC:
            raise FormatError(f"bad magic {magic!r}{at}: not an unweight tensor header")
        if vmaj != C.VERSION_MAJOR:
            raise VersionError(
                f"unsupported unweight format version {vmaj}.{vmin}{at} ({version_advice(vmaj)})")
        (hcrc,) = struct.unpack_from("<I", b, 60)
        table_raw = b[C.HEADER_BYTES:]
        if len(table_raw) != tbytes:
            raise FormatError(f"tensor header table is {len(table_raw)} bytes, header says {tbytes}{at}")
        if zlib.crc32(table_raw, zlib.crc32(b[:60])) != hcrc:
            raise FormatError(f"tensor header checksum mismatch{at}: header is corrupt")
        if dt != C.DTYPE_BF16:
            raise FormatError(f"unknown source dtype code {dt}{at}")
        if r == 0 or cc == 0 or n == 0 or k == 0:
            raise FormatError(f"zero dimension or grid in header{at}")
        h = cls(encoding=enc, rows=n, cols=k, rows_per_group=r, cols_per_chunk=cc, crc32=crc,
                max_code_len=mcl, num_ctx=nctx, exp_lo=lo, exp_hi=hi, pal_size=psz, pal_block=pblk,
                num_verbatim=nverb, palette=pal, version_major=vmaj, version_minor=vmin, src_dtype=dt,
                stack=stack)
        if enc == C.ENC_HUFFMAN:
            if mcl != C.HUFF_MAX_CODE_LEN or nctx != C.HUFF_NUM_CTX or lo > hi:
                raise FormatError(f"bad huffman parameters (max_code_len={mcl}, num_ctx={nctx}, "
                                  f"exp range {lo}..{hi}){at}")
            if tbytes != nctx * (hi - lo + 1):
                raise FormatError(f"huffman table size {tbytes} does not match exp range{at}")
            h.table = np.frombuffer(table_raw, dtype=np.uint8).reshape(nctx, hi - lo + 1).copy()
            h.num_verbatim, h.chk_interval = 0, nverb
            if nverb and (nverb % C.CHK_ALIGN or nverb > C.CHK_MAX_INTERVAL):
                raise FormatError(f"bad checkpoint interval {nverb} (0, or a multiple of {C.CHK_ALIGN} "
                                  f"up to {C.CHK_MAX_INTERVAL}){at}")
        elif enc == C.ENC_PALETTE:
            if not (1 <= psz <= C.PAL_MAX_ENTRIES) or pblk != C.PAL_BLOCK or tbytes != 0:
                raise FormatError(f"bad palette parameters (size={psz}, block={pblk}){at}")
            if len(set(pal[:psz])) != psz:
                raise FormatError(f"palette has duplicate entries{at}")
        else:
            raise FormatError(f"unknown encoding code {enc}{at}")
        return h
