"""Minimal safetensors reader/writer working on raw bytes.

Why not the ``safetensors`` package here: its save API needs every tensor of a shard in
memory at once (we stream one tensor at a time to keep peak memory at the largest tensor),
and its NumPy bindings cannot represent BF16/FP8, which we must carry bit-for-bit without a
dtype round trip.  Files written here are read back by the ``safetensors`` package in the
tests, which keeps the two compatible.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import shutil
import struct

import numpy as np

from .errors import FormatError, InputError

# safetensors dtype -> (itemsize, numpy dtype used to carry the bytes)
DTYPES = {
    "BOOL": (1, np.uint8), "U8": (1, np.uint8), "I8": (1, np.int8), "F8_E4M3": (1, np.uint8),
    "F8_E5M2": (1, np.uint8), "F8_E8M0": (1, np.uint8), "I16": (2, np.int16), "U16": (2, np.uint16),
    "F16": (2, np.uint16), "BF16": (2, np.uint16), "I32": (4, np.int32), "U32": (4, np.uint32),
    "F32": (4, np.float32), "I64": (8, np.int64), "U64": (8, np.uint64), "F64": (8, np.float64),
}
NP_TO_ST = {np.dtype(np.uint8): "U8", np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16"}
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile:
    """Read-only view of one .safetensors file; tensors are zero-copy views of an mmap."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fh = open(path, "rb")
        except OSError as e:
            raise InputError(f"cannot open {path}: {e.strerror}") from None
        try:
            self._parse(path)
        except BaseException:
            self._fh.close()
            raise

    def _parse(self, path: str):
        size = os.fstat(self._fh.fileno()).st_size
        head = self._fh.read(8)
        if len(head) < 8:
            raise FormatError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n < 2 or n > MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: not a safetensors file or truncated (header length {n}, file {size} bytes)")
        try:
            header = json.loads(self._fh.read(n).decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise FormatError(f"{path}: corrupt safetensors header (invalid JSON)") from None
        except _DuplicateKey as e:
            raise FormatError(f"{path}: corrupt safetensors header (key {e.args[0]!r} appears twice)") from None
        if not isinstance(header, dict):
            raise FormatError(f"{path}: corrupt safetensors header (not a JSON object)")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise FormatError(f"{path}: corrupt safetensors __metadata__ (must map strings to strings)")
        self.metadata = meta
        self.data_start = 8 + n
        self.data_size = size - self.data_start
        self.entries = {name: _entry(path, name, info, self.data_size) for name, info in header.items()}
        _check_coverage(path, self.entries, self.data_size)
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def names(self):
        return list(self.entries)

    def info(self, name):
        return self.entries[name]

    def array(self, name) -> np.ndarray:
        """Tensor as a read-only NumPy view carrying its bytes (BF16/F16 as uint16, FP8 as uint8)."""
        dt, shape, b, e = self.entries[name]
        np_dt = DTYPES[dt][1]
        if e == b:
            return np.zeros(shape, dtype=np_dt)
        a = np.frombuffer(self._mm, dtype=np.uint8, count=e - b, offset=self.data_start + b)
        return a.view(np_dt).reshape(shape)

    def release(self, name, lo: int = 0, hi: int | None = None):
        """Drop the pages of a tensor already processed (or of its bytes [lo, hi)) from this
        process's resident set, so streaming a checkpoint keeps memory at the largest tensor,
        not the model (file-backed mmap pages otherwise stay counted in RSS until unmapped)."""
        if self._mm is None or not hasattr(self._mm, "madvise"):
            return
        _, _, b, e = self.entries[name]
        if hi is not None:
            b, e = b + lo, min(e, b + hi)
        else:
            b += lo
        page = mmap.PAGESIZE
        start = (self.data_start + b) // page * page
        end = self.data_start + e
        if end > start:
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass  # an optimisation only

    def close(self):
        # Views handed out keep the mmap alive; closing the file handle is enough.
        self._fh.close()


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs):
    # json.loads keeps the last of repeated keys; two entries for one tensor name would let
    # two readers see different tensors in the same file.
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _is_count(x) -> bool:
    """A non-negative JSON integer (bool is an int subclass in Python, not in JSON)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry(path: str, name: str, info, data_size: int) -> tuple:
    """(dtype, shape, begin, end) of one header entry; FormatError naming file and tensor."""
    at = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise FormatError(f"{at}: corrupt safetensors entry (needs dtype, shape and data_offsets)")
    dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dt, str):
        raise FormatError(f"{at}: dtype {dt!r} is not a string")
    if dt not in DTYPES:
        raise InputError(f"{at} has unsupported dtype {dt}")
    if not isinstance(shape, list) or not all(_is_count(x) for x in shape):
        raise FormatError(f"{at}: shape {shape!r} is not a list of non-negative integers")
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_count(x) for x in offs):
        raise FormatError(f"{at}: data_offsets {offs!r} is not a pair of non-negative integers")
    b, e = offs
    if b > e:
        raise FormatError(f"{at}: data_offsets [{b}, {e}] end before they begin")
    if e > data_size:
        raise FormatError(f"{at}: data_offsets [{b}, {e}] run past the end of the data ({data_size} bytes; "
                          f"truncated file?)")
    need = math.prod(shape) * DTYPES[dt][0]  # Python ints: no overflow on a hostile shape
    if e - b != need:
        raise FormatError(f"{at}: holds {e - b} bytes but dtype {dt} shape {shape} needs {need}")
    return dt, tuple(shape), b, e


def _check_coverage(path: str, entries: dict, data_size: int) -> None:
    """The safetensors rule: the tensors tile the data buffer exactly, no overlap, no hole, no
    trailing bytes.  Overlapping tensors would alias each other's bytes (a write through one
    changes the other; a checksum of one vouches for bytes of another)."""
    pos, prev, hole = 0, None, None
    for name, (_, _, b, e) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b < pos:
            raise FormatError(f"{path}: tensor {name!r} (data_offsets [{b}, {e}]) overlaps tensor {prev!r} "
                              f"(which ends at {pos})")
        if b > pos and hole is None:  # reported after the sweep: an overlap further on says more
            what = f"after tensor {prev!r}" if prev is not None else "at the start of the data"
            hole = f"{path}: bytes [{pos}, {b}) {what} belong to no tensor (before {name!r})"
        pos, prev = e, name
    if hole:
        raise FormatError(hole)
    if pos != data_size:
        raise FormatError(f"{path}: the last {data_size - pos} bytes of the data belong to no tensor")

def _header_bytes(entries: dict, metadata: dict) -> bytes:
    header = dict(entries)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    return hb + b" " * (-len(hb) % 8)  # safetensors aligns the data section to 8 bytes


class ShardWriter:
    """Streams tensors into one safetensors file, so memory holds one tensor at a time.

    Every mode writes each byte once (disk writes bound compressing and decompressing a large
    model).  With a plan, [(name, dtype, shape, nbytes)] in the order add() will be called,
    the header is written first and the data straight after it.  With reserve (bytes, a
    multiple of 8, an upper bound on the header's length), the data goes after that much
    room and close() writes the header into it, padded with spaces (JSON whitespace).
    With neither, data goes to a side file and close() copies it behind the header; so does
    a reserve the header outgrows (nothing is lost, it only costs the copy).
    """

    def __init__(self, path: str, metadata: dict | None = None, plan: list | None = None,
                 reserve: int | None = None):
        self.path = path
        self.metadata = dict(metadata or {})
        self._entries = {}
        self._pos = 0
        self._plan = None
        self._reserve = None
        self._added = 0  # tensors written so far (plan mode checks them in order)
        if plan is None and reserve is not None:
            self._reserve = -(-int(reserve) // 8) * 8
            self._data_path = None
            self._data = open(path, "wb")
            self._data.seek(8 + self._reserve)  # the header's room, written at close
            return
        if plan is None:
            self._data_path = path + ".data.tmp"
            self._data = open(self._data_path, "wb")
            return
        self._data_path = None
        self._plan = [(n, dt, [int(x) for x in shape], int(nb)) for n, dt, shape, nb in plan]
        pos = 0
        for n, dt, shape, nb in self._plan:
            if n in self._entries:
                raise ValueError(f"duplicate tensor name {n!r}")
            self._entries[n] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + nb]}
            pos += nb
        hb = _header_bytes(self._entries, self.metadata)
        self._head = 8 + len(hb)
        self._data = open(path, "wb")
        self._data.write(struct.pack("<Q", len(hb)))
        self._data.write(hb)

    @property
    def nbytes(self) -> int:
        return self._pos

    def add(self, name: str, dtype: str, shape, data: np.ndarray):
        buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        dims = [int(s) for s in shape]
        if self._plan is not None:
            k = self._added
            if k >= len(self._plan) or self._plan[k] != (name, dtype, dims, buf.nbytes):
                raise ValueError(f"tensor {name!r} does not match the shard plan")
        elif name in self._entries:
            raise ValueError(f"duplicate tensor name {name!r}")
        self._data.write(memoryview(buf))
        if self._plan is None:
            self._entries[name] = {"dtype": dtype, "shape": dims,
                                   "data_offsets": [self._pos, self._pos + buf.nbytes]}
        self._added += 1
        self._pos += buf.nbytes

    def close(self) -> int:
        """Finish the file (flushed to disk) and return its size in bytes."""
        if self._plan is not None:
            if self._added != len(self._plan):
                raise ValueError(f"{self.path}: {len(self._plan) - self._added} planned tensors never written")
            self._data.flush()
            os.fsync(self._data.fileno())
            self._data.close()
            return self._head + self._pos
        hb = _header_bytes(self._entries, self.metadata)
        if self._reserve is not None and len(hb) <= self._reserve:
            hb += b" " * (self._reserve - len(hb))
            self._data.seek(0)
            self._data.write(struct.pack("<Q", len(hb)))
            self._data.write(hb)
            self._data.flush()
            os.fsync(self._data.fileno())
            self._data.close()
            return 8 + len(hb) + self._pos
        self._data.close()
        src_path, skip = self._data_path, 0
        if self._reserve is not None:  # the header outgrew its room: copy the data behind it
            src_path, skip = self.path + ".data.tmp", 8 + self._reserve
            os.replace(self.path, src_path)
            self._data_path = src_path
        with open(self.path, "wb") as out, open(src_path, "rb") as src:
            out.write(struct.pack("<Q", len(hb)))
            out.write(hb)
            src.seek(skip)
            shutil.copyfileobj(src, out, 16 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.unlink(src_path)
        return 8 + len(hb) + self._pos

    def abort(self):
        try:
            self._data.close()
        finally:
            for p in (self._data_path, self.path):
                if p and os.path.exists(p):
                    os.unlink(p)
