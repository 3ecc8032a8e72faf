#!/usr/bin/env python3
"""Write the golden files of unweight format v1 under tests/golden/.

Usage: python scripts/make_golden.py [--out tests/golden]

Every golden tensor is one ``<case>_<encoding>.safetensors`` holding the planes of a tensor
named ``w`` (``w__hdr``, ``w__sm``, ...) exactly as a checkpoint shard would, next to a
``<case>.json`` with the original values (or, for the 65536-value tensor, their crc32 and
sha256) and the grid.  ``corrupt/`` holds damaged copies, each listed in
``corrupt/manifest.json`` with the error class a decoder must raise.

``checkpoint/`` is a whole compressed checkpoint (two shards, two encoded and two raw
tensors, index, config, report) built from the same tensors, and
``corrupt/checkpoints/<case>/`` damaged copies of it (a raw tensor's bit, overlapping
offsets, an index that lost a shard, records that disagree), listed in
``corrupt/checkpoints/manifest.json`` with the error class every reader must raise.

The bytes are the encoder's output and are frozen on purpose: once committed they are the
definition of v1 that tests hold the C++ codec, the CUDA kernels and the reference decoder
to.  Re-running this script must reproduce them bit for bit (tests/golden checks that the
encoder still does); never regenerate them to make a failing test pass.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import struct
import sys
import zlib

import numpy as np
from safetensors.numpy import save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unweight import api  # noqa: E402
from unweight.codec import tensor_codec as tc  # noqa: E402
from unweight.format import constants as C  # noqa: E402
from unweight.format.errors import ChecksumError, FormatError, VersionError  # noqa: E402

NAME = "w"
META = {"unweight_format_version": "1.0"}  # pinned: the 1.0 golden files stay 1.0 files

# The worked example of docs/FORMAT.md: 2 x 8 BF16 words chosen to touch every corner the
# bit split has (signed zero, a NaN with a payload, -Inf, a subnormal, several exponents,
# three of the four mantissa contexts, leaving one context without a code).  Grid R=1,
# C=4 gives 4 segments, enough to show the chunk-major segment order.
WORKED_VALUES = [
    [0x3F80, 0xBF80, 0x8000, 0x7FC1, 0x0001, 0x4049, 0x3F00, 0xC000],
    [0x3F81, 0x3FC0, 0xFF80, 0x3E80, 0x3F80, 0x3F40, 0x3FA0, 0x3EA0],
]
WORKED_GRID = (1, 4)
# The stacked example of FORMAT.md (format 1.1): a [2, 2, 8] stack whose matrix 0 is the
# worked example and matrix 1 the same words with the sign bit flipped.  The exponents and
# contexts are the worked example's twice over, so the code lengths (and codes) are the same
# and each matrix's segments are the worked example's bytes: what the stack adds is easy to see.
STACK_GRID = WORKED_GRID
STACK_META = {"unweight_format_version": "1.1"}  # pinned: a 1.1 file stays one
ALL_PATTERNS_SEED = 20240601
# The checkpoint index (format 1.2).  index_example is FORMAT.md's: 3 x 32 words on a 2 x 16
# grid with S = 16, so the two full segments (32 weights) carry one checkpoint each and the
# two one-row segments (16 weights) none, which shows an unused (zero) entry.
# all_patterns_indexed holds the 65536 patterns on all_patterns' grid with the writers' S.
INDEX_META = {"unweight_format_version": "1.2"}  # pinned: a 1.2 file stays one
INDEX_CASES = {"index_example": ((2, 16), 16), "all_patterns_indexed": ((16, 256), C.DEFAULT_CHK_INTERVAL)}


def verbatim_values() -> np.ndarray:
    """3 x 80: 16 common exponents plus three rare ones that force verbatim blocks.

    80 columns make two palette blocks per row, the second one partial (16 weights), and the
    rare exponents land in blocks 1, 4 and 5, so the verbatim list has three entries.
    """
    n, k = 3, 80
    i = np.arange(n * k).reshape(n, k)
    e = 120 + (i * 7) % 16
    e[0, 70], e[2, 5], e[2, 79] = 1, 250, 255
    sm = (i * 37 + 11) & 0xFF
    return (((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)).astype(np.uint16)


def all_patterns_values() -> np.ndarray:
    w = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    return np.random.default_rng(ALL_PATTERNS_SEED).permutation(w).reshape(256, 256)


def index_values() -> np.ndarray:
    """3 x 32: mostly exponents 126/127 with some 125, 128 and one 120, so the code lengths
    differ and the checkpoint deltas are not a multiple of anything."""
    i = np.arange(3 * 32).reshape(3, 32)
    e = np.where(i % 3 == 0, 126, 127)
    e[i % 7 == 0] = 125
    e[i % 11 == 5] = 128
    e[1, 9] = 120
    sm = (i * 29 + 3) & 0xFF
    return (((sm & 0x80) << 8) | (e << 7) | (sm & 0x7F)).astype(np.uint16)


def index_corrupt_cases(ix_h: dict) -> dict:
    """name -> (planes, expected error class, description, decoded by index-free decoders) for
    the index example.  A wrong entry that passes the bounds every reader checks is refused
    only by decoders that use the index; a decoder that ignores it still decodes exactly."""
    def chk(f):
        c = ix_h[C.SUFFIX_CHK].copy()
        f(c)
        return dict(ix_h, **{C.SUFFIX_CHK: c})

    def interval(v):
        h = ix_h[C.SUFFIX_HDR].copy()
        h[36:40] = np.frombuffer(int(v).to_bytes(4, "little"), np.uint8)
        return _fix_hdr_crc(h)
    no_chk = {s: a for s, a in ix_h.items() if s != C.SUFFIX_CHK}
    return {
        "chk_entry_off_by_one": (chk(lambda c: c.__setitem__((0, 0), c[0, 0] + 1)), FormatError,
                                 "index: checkpoint 1 of segment 0 one bit late (inside every bound)", True),
        "chk_unused_entry": (chk(lambda c: c.__setitem__((1, 0), 16)), FormatError,
                             "index: entry of one-row segment 1, which has no checkpoint, set to 16", False),
        "chk_interval_unaligned": (dict(ix_h, **{C.SUFFIX_HDR: interval(24)}), FormatError,
                                   "index: chk_interval 24, not a multiple of 16", False),
        "chk_missing": (no_chk, FormatError, "index: chk_interval 16 but no __chk plane", False),
        "chk_without_interval": (dict(ix_h, **{C.SUFFIX_HDR: interval(0)}), FormatError,
                                 "index: __chk present but chk_interval 0", False),
        "chk_wrong_shape": (chk(lambda c: None) | {C.SUFFIX_CHK: ix_h[C.SUFFIX_CHK].reshape(1, -1).copy()},
                            FormatError, "index: __chk stored as [1, 4] instead of [4, 1]", False),
    }


def stack_values() -> np.ndarray:
    wx = np.array(WORKED_VALUES, dtype=np.uint16)
    return np.stack([wx, wx ^ 0x8000])


def stack_corrupt_cases(st_h: dict, st_p: dict) -> dict:
    """name -> (planes, expected error class, description) for the stacked example."""
    def flip_matrix1(e):
        e = e.copy()
        e[int(st_h[C.SUFFIX_OFF][4])] ^= 0xFF  # first byte of matrix 1's segment 0
        return e
    cases = {
        "stack_sm_unstacked": (dict(st_h, **{C.SUFFIX_SM: st_h[C.SUFFIX_SM].reshape(4, 8).copy()}), FormatError,
                               "stack: __sm stored as [4, 8] instead of [2, 2, 8]"),
        "stack_offsets_one_matrix": (dict(st_h, **{C.SUFFIX_OFF: st_h[C.SUFFIX_OFF][:5].copy()}), FormatError,
                                     "stack: __off holds the 5 offsets of one matrix instead of 2 * 4 + 1"),
        "stack_matrix1_stream_flip": (dict(st_h, **{C.SUFFIX_EXP: flip_matrix1(st_h[C.SUFFIX_EXP])}), FormatError,
                                      "stack: first byte of matrix 1's segment 0 inverted"),
        "stack_palette_sm_bit_flip": (dict(st_p, **{C.SUFFIX_SM: st_p[C.SUFFIX_SM] ^ np.eye(1, 32, 31, dtype=np.uint8)
                                                    .reshape(2, 2, 8)}), ChecksumError,
                                      "stack: lowest mantissa bit of weight [1, 1, 7] flipped"),
    }
    return cases


def _save(path: pathlib.Path, planes: dict) -> None:
    save_file({NAME + s: np.ascontiguousarray(a) for s, a in planes.items()}, str(path), metadata=META)


def _encode(w: np.ndarray, enc: str, grid, chk_interval: int = 0) -> dict:
    return dict(tc.encode(w, enc, grid=grid, threads=1, chk_interval=chk_interval).planes)


def _fix_hdr_crc(hdr: np.ndarray) -> np.ndarray:
    """Recompute the header crc so that a deliberate change reaches the check behind it."""
    b = bytearray(hdr.tobytes())
    b[60:64] = zlib.crc32(bytes(b[:60]) + bytes(b[64:])).to_bytes(4, "little")
    return np.frombuffer(bytes(b), dtype=np.uint8).copy()


def _expect_cpp(planes: dict, cls) -> None:
    """Check that the C++ path raises exactly `cls`, so a corrupt file tests what it says."""
    try:
        h = tc.encoded_header(planes, "golden")
        tc.decode(h, planes, threads=1)
    except FormatError as e:  # FormatError family only; anything else is a generator bug
        if type(e) is not cls:
            raise SystemExit(f"corrupt case raised {type(e).__name__}, meant {cls.__name__}: {e}")
        return
    raise SystemExit(f"corrupt case decoded without error (meant {cls.__name__})")


def _expect_index_users(planes: dict, cls, w: np.ndarray) -> None:
    """An index-only corruption: the reference decoder (which decodes from every checkpoint)
    raises `cls`, the C++ decoder (which ignores the index) still returns the original."""
    from unweight.codec.reference import decode_reference
    try:
        decode_reference(planes[C.SUFFIX_HDR], planes)
    except FormatError as e:
        if type(e) is not cls:
            raise SystemExit(f"index case raised {type(e).__name__}, meant {cls.__name__}: {e}")
    else:
        raise SystemExit(f"index case decoded by the reference without error (meant {cls.__name__})")
    if not np.array_equal(tc.decode(tc.encoded_header(planes, "golden"), planes, threads=1), w):
        raise SystemExit("index case: the C++ decoder, which ignores the index, did not decode the original")


def corrupt_cases(wx_h: dict, wx_p: dict, vb_p: dict) -> dict:
    """name -> (planes, expected error class, description)."""
    cases = {}

    def add(name, base, cls, what, **changes):
        p = {s: a.copy() for s, a in base.items()}
        for s, a in changes.items():
            s = "__" + s
            if a is None:
                del p[s]
            else:
                p[s] = a(p[s]) if callable(a) else a
        cases[name] = (p, cls, what)

    def hdr_set(off, val, fix=True):
        def f(h):
            h = h.copy()
            h[off] = val
            return _fix_hdr_crc(h) if fix else h
        return f

    add("bad_magic", wx_h, FormatError, "magic 'UNWT' -> 'XNWT'", hdr=hdr_set(0, ord("X"), fix=False))
    add("version_2_0", wx_h, VersionError, "version 2.0 with a valid header crc", hdr=hdr_set(4, 2))
    add("header_byte_flip", wx_h, FormatError, "rows field changed, header crc left stale",
        hdr=hdr_set(8, wx_h["__hdr"][8] ^ 0x01, fix=False))
    add("unknown_encoding", wx_h, FormatError, "encoding code 3 with a valid header crc", hdr=hdr_set(6, 3))

    def bad_kraft(h):
        # Lengthen the code of the first coded symbol of context 0: the code becomes
        # incomplete (Kraft sum < 1), which a v1 decoder must refuse.
        h = h.copy()
        t = np.flatnonzero(h[64:64 + (int(h[31]) - int(h[30]) + 1)])[0]
        h[64 + t] += 1
        return _fix_hdr_crc(h)
    add("bad_kraft", wx_h, FormatError, "a code length of context 0 raised by one (incomplete code)", hdr=bad_kraft)

    def flip_stream(e):
        e = e.copy()
        e[0] ^= 0xFF
        return e
    add("stream_byte_flip", wx_h, FormatError, "first byte of segment 0 inverted", exp=flip_stream)
    add("stream_truncated", wx_h, FormatError, "exponent stream cut 9 bytes short", exp=lambda e: e[:-9].copy())

    def off_swap(o):
        o = o.copy()
        o[1] = o[2] + 1
        return o
    add("offsets_not_ascending", wx_h, FormatError, "off[1] set above off[2]", off=off_swap)

    def off_shift(o):
        o = o.copy()
        o[1] += 1
        assert o[1] <= o[2]
        return o
    add("segment_bits_mismatch", wx_h, FormatError,
        "off[1] moved one byte later: segment 0 spans a byte its bits do not use", off=off_shift)
    add("missing_plane", wx_h, FormatError, "the __off plane is absent", off=None)
    add("wrong_plane_shape", wx_h, FormatError, "__sm stored as [1, 16] instead of [2, 8]",
        sm=lambda s: s.reshape(1, -1).copy())
    add("wrong_plane_dtype", wx_h, FormatError, "__off stored as int64 instead of uint32",
        off=lambda o: o.astype(np.int64))

    def nibble15(i):
        i = i.copy()
        i[0, 0] |= 0x0F
        return i
    add("palette_index_out_of_range", wx_p, FormatError, "nibble of column 0 set to 15 >= pal_size", idx=nibble15)
    add("vpos_unsorted", vb_p, FormatError, "first two verbatim block ids swapped",
        vpos=lambda v: v[[1, 0] + list(range(2, len(v)))].copy(),
        vexp=lambda v: v[[1, 0] + list(range(2, len(v)))].copy())

    def vpos_oob(v):
        v = v.copy()
        v[-1] = 3 * 2  # rows * blocks_per_row: one past the last block
        return v
    add("vpos_out_of_range", vb_p, FormatError, "last verbatim block id = rows * blocks_per_row", vpos=vpos_oob)

    def sm_flip(s):
        s = s.copy()
        s[0, 0] ^= 0x01  # lowest mantissa bit: not a context bit, so only the crc sees it
        return s
    add("sm_bit_flip", wx_h, ChecksumError, "lowest mantissa bit of weight [0, 0] flipped", sm=sm_flip)
    add("palette_sm_bit_flip", wx_p, ChecksumError, "lowest mantissa bit of weight [1, 7] flipped",
        sm=lambda s: s ^ np.array([[0] * 8, [0] * 7 + [1]], dtype=np.uint8))
    return cases


# ----------------------------------------------------------------------------- checkpoints

CK_SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
# Pinned, not C.FORMAT_VERSION: the golden checkpoint is a 1.0 checkpoint, which every 1.x
# reader must go on accepting.
CK_VERSION = "1.0"
CK_META = {"format": "pt", "unweight_format_version": CK_VERSION}


def _st_bytes(tensors: list, metadata: dict, offsets: dict | None = None) -> bytes:
    """A safetensors file of tensors [(name, dtype, array)], data back to back in that order.
    offsets: {name: (begin, end)} written in the header instead of the true ones, and the
    tensor's own bytes left out of the data (for damaged files)."""
    header, data = {}, b""
    offsets = offsets or {}
    for name, dt, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        if name in offsets:
            header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": list(offsets[name])}
            continue
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    header["__metadata__"] = dict(metadata)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def _ck_shard_tensors(wx_h: dict, vb_p: dict) -> list:
    """The tensors of each shard: [(name, dtype, array)]; encoded tensors as their planes."""
    b = np.array(WORKED_VALUES[0], dtype=np.uint16)          # a BF16 bias, stored raw
    norm = np.array([1.0, -0.5, 0.25, 2.0], dtype=np.float32)  # an F32 norm, stored raw
    planes = lambda base, p: [(base + s, tc._st_dtype(a), a) for s, a in sorted(p.items())]  # noqa: E731
    return [planes("layers.0.w", wx_h) + [("layers.0.b", "BF16", b)],
            planes("layers.1.w", vb_p) + [("norm", "F32", norm)]]


def _ck_files(shards: list, offsets: dict | None = None, crc_of: dict | None = None,
              drop_crcs: tuple = ()) -> dict:
    """file name -> bytes of a compressed checkpoint holding `shards` (see _ck_shard_tensors),
    with every record (crc32 metadata, index, report) true to the shard files written.
    offsets / crc_of / drop_crcs: damage one record-keeping layer only (see checkpoint_cases)."""
    files, weight_map, n_enc, n_raw = {}, {}, 0, 0
    for fname, tensors in zip(CK_SHARDS, shards):
        crcs = {}
        for name, dt, a in tensors:
            weight_map[name] = fname
            if "__" in name:
                n_enc += name.endswith(C.SUFFIX_HDR)
            else:
                n_raw += 1
                if name not in drop_crcs:
                    crcs[name] = (crc_of or {}).get(name, zlib.crc32(np.ascontiguousarray(a).tobytes()))
        meta = dict(CK_META, **({"unweight_crc32": json.dumps(crcs, separators=(",", ":"))} if crcs else {}))
        files[fname] = _st_bytes(tensors, meta, offsets)
    sizes = {f: len(files[f]) for f in CK_SHARDS}
    files[C.INDEX_NAME] = json.dumps({"metadata": {"total_size": sum(sizes.values()), "unweight": {
        "format_version": CK_VERSION, "shards": list(CK_SHARDS), "stored_tensors": len(weight_map)}},
        "weight_map": weight_map}, indent=2).encode()
    files["config.json"] = json.dumps({"model_type": "golden", "quantization_config": {
        "quant_method": C.QUANT_METHOD, "format_version": CK_VERSION, "encoding": "auto",
        "encoded_dtype": "bfloat16", "tool_version": "golden"}}, indent=2).encode()
    files[C.REPORT_NAME] = json.dumps({"tool": "unweight", "format_version": CK_VERSION, "files": list(CK_SHARDS),
                                       "encoded_tensors": n_enc, "raw_tensors": n_raw,
                                       "output_bytes": sum(sizes.values())}, indent=2).encode()
    return files


def _edit_json(files: dict, fname: str, change) -> dict:
    files = dict(files)
    d = json.loads(files[fname])
    change(d)
    files[fname] = json.dumps(d, indent=2).encode()
    return files


def checkpoint_cases(wx_h: dict, vb_p: dict) -> tuple[dict, dict]:
    """(the valid checkpoint's files, {case: (files, expected error class, description)})."""
    shards = _ck_shard_tensors(wx_h, vb_p)
    valid = _ck_files(shards)
    cases = {}

    flipped = bytearray(valid[CK_SHARDS[0]])
    pos = flipped.index(np.array(WORKED_VALUES[0], dtype=np.uint16).tobytes())
    flipped[pos] ^= 0x01
    cases["raw_bit_flip"] = (dict(valid, **{CK_SHARDS[0]: bytes(flipped)}), ChecksumError,
                             "lowest bit of raw tensor layers.0.b's first byte flipped")

    # "norm" points at the first 16 bytes of layers.1.w__sm, its own bytes gone, its crc32
    # record that of the bytes it now reads: only the overlap tells.
    sm = vb_p[C.SUFFIX_SM]
    sm_at = sum(a.nbytes for n, _, a in shards[1][:[n for n, _, _ in shards[1]].index("layers.1.w__sm")])
    cases["raw_overlap"] = (_ck_files(shards, offsets={"norm": (sm_at, sm_at + 16)},
                                      crc_of={"norm": zlib.crc32(sm.tobytes()[:16])}), FormatError,
                            "raw tensor norm's data_offsets overlap layers.1.w__sm (records true to the files)")

    def lose_shard(d):
        d["weight_map"] = {k: v for k, v in d["weight_map"].items() if v != CK_SHARDS[1]}
    cases["index_lost_shard"] = (_edit_json(valid, C.INDEX_NAME, lose_shard), FormatError,
                                 "the weight_map names no tensor of shard 2 (file still there)")

    def lose_shard_old(d):
        lose_shard(d)
        d["metadata"]["unweight"] = {"format_version": CK_VERSION}
    cases["index_lost_shard_no_records"] = (
        _edit_json(valid, C.INDEX_NAME, lose_shard_old), FormatError,
        "as index_lost_shard, in an index without the shards / stored_tensors records")
    cases["stored_tensors_mismatch"] = (
        _edit_json(valid, C.INDEX_NAME, lambda d: d["metadata"]["unweight"].update(stored_tensors=3)), FormatError,
        "index records 3 stored tensors, its weight_map lists 11")
    cases["raw_without_checksum"] = (_ck_files(shards, drop_crcs=("norm",)), FormatError,
                                     "shard 2's unweight_crc32 has no entry for raw tensor norm")
    cases["report_disagrees"] = (
        _edit_json(valid, C.REPORT_NAME, lambda d: d.update(raw_tensors=3)), FormatError,
        "the compress report records 3 raw tensors, the checkpoint holds 2")
    return valid, cases


def _write_folder(folder: pathlib.Path, files: dict) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for fname, data in files.items():
        (folder / fname).write_bytes(data)


def _expect_api(folder: pathlib.Path, cls) -> None:
    """Check that `unweight verify` raises exactly `cls` (None: passes) on folder."""
    try:
        api.verify(str(folder), jobs=1)
    except FormatError as e:
        if type(e) is not cls:
            raise SystemExit(f"{folder.name}: verify raised {type(e).__name__}, meant "
                             f"{getattr(cls, '__name__', 'none')}: {e}")
        return
    if cls is not None:
        raise SystemExit(f"{folder.name}: verify passed (meant {cls.__name__})")


def write_checkpoints(out: pathlib.Path, wx_h: dict, vb_p: dict) -> None:
    """Write checkpoint/ and corrupt/checkpoints/ under out, checking each case's error."""
    valid, ck_cases = checkpoint_cases(wx_h, vb_p)
    _write_folder(out / "checkpoint", valid)
    _expect_api(out / "checkpoint", None)
    ck_dir = out / "corrupt" / "checkpoints"
    if ck_dir.exists():
        shutil.rmtree(ck_dir)
    manifest = {}
    for name, (files, cls, what) in ck_cases.items():
        _write_folder(ck_dir / name, files)
        _expect_api(ck_dir / name, cls)
        manifest[name] = {"expect": cls.__name__, "what": what}
    (ck_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "golden"))
    out = pathlib.Path(ap.parse_args().out)
    (out / "corrupt").mkdir(parents=True, exist_ok=True)

    planes = {}
    # Worked example.
    wx = np.array(WORKED_VALUES, dtype=np.uint16)
    vb = verbatim_values()
    ap_ = all_patterns_values()
    cases = {
        "worked_example": (wx, WORKED_GRID),
        "verbatim": (vb, (2, 32)),
        # Grids are pinned, not taken from choose_grid: writer policy may change, the golden
        # bytes must not.
        "all_patterns": (ap_, (16, 256)),
    }
    for case, (w, grid) in cases.items():
        meta = {"shape": list(w.shape), "grid": list(grid), "crc32": zlib.crc32(w.astype("<u2").tobytes()),
                "sha256": hashlib.sha256(w.astype("<u2").tobytes()).hexdigest(),
                "files": {}}
        if case == "all_patterns":
            meta["note"] = ("every uint16 exactly once, np.random.default_rng(seed).permutation; values are "
                            "not stored: check crc32/sha256 and that each pattern occurs once")
            meta["seed"] = ALL_PATTERNS_SEED
        else:
            meta["values"] = [[f"0x{int(x):04X}" for x in row] for row in w]
        for enc in ("huffman", "palette"):
            p = _encode(w, enc, grid)
            planes[(case, enc)] = p
            fname = f"{case}_{enc}.safetensors"
            _save(out / fname, p)
            meta["files"][enc] = fname
        (out / f"{case}.json").write_text(json.dumps(meta, indent=1) + "\n")

    manifest = {}
    for name, (p, cls, what) in corrupt_cases(planes[("worked_example", "huffman")],
                                              planes[("worked_example", "palette")],
                                              planes[("verbatim", "palette")]).items():
        _expect_cpp(p, cls)
        _save(out / "corrupt" / f"{name}.safetensors", p)
        manifest[name] = {"expect": cls.__name__, "what": what}
    # Stacked example (format 1.1): one file per encoding, values nested [matrix][row][col].
    st = stack_values()
    meta = {"shape": list(st.shape), "grid": list(STACK_GRID), "crc32": zlib.crc32(st.astype("<u2").tobytes()),
            "sha256": hashlib.sha256(st.astype("<u2").tobytes()).hexdigest(), "files": {},
            "values": [[[f"0x{int(x):04X}" for x in row] for row in m] for m in st]}
    for enc in ("huffman", "palette"):
        p = _encode(st, enc, STACK_GRID)
        planes[("stack_example", enc)] = p
        meta["files"][enc] = f"stack_example_{enc}.safetensors"
        save_file({NAME + s: np.ascontiguousarray(a) for s, a in p.items()}, str(out / meta["files"][enc]),
                  metadata=STACK_META)
    (out / "stack_example.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name, (p, cls, what) in stack_corrupt_cases(planes[("stack_example", "huffman")],
                                                    planes[("stack_example", "palette")]).items():
        _expect_cpp(p, cls)
        _save(out / "corrupt" / f"{name}.safetensors", p)
        manifest[name] = {"expect": cls.__name__, "what": what}
    # Checkpoint index (format 1.2): huffman only, the palette encoding has no index.
    for case, (grid, S) in INDEX_CASES.items():
        w = index_values() if case == "index_example" else ap_
        meta = {"shape": list(w.shape), "grid": list(grid), "chk_interval": S, "format_version": "1.2",
                "crc32": zlib.crc32(w.astype("<u2").tobytes()),
                "sha256": hashlib.sha256(w.astype("<u2").tobytes()).hexdigest(),
                "files": {"huffman": f"{case}_huffman.safetensors"}}
        if case == "index_example":
            meta["values"] = [[f"0x{int(x):04X}" for x in row] for row in w]
        else:
            meta["note"] = "all_patterns' values (see all_patterns.json) with a checkpoint index"
        p = _encode(w, "huffman", grid, S)
        planes[(case, "huffman")] = p
        save_file({NAME + s: np.ascontiguousarray(a) for s, a in p.items()}, str(out / meta["files"]["huffman"]),
                  metadata=INDEX_META)
        (out / f"{case}.json").write_text(json.dumps(meta, indent=1) + "\n")
    for name, (p, cls, what, index_only) in index_corrupt_cases(planes[("index_example", "huffman")]).items():
        if index_only:
            _expect_index_users(p, cls, index_values())
        else:
            _expect_cpp(p, cls)
        save_file({NAME + s: np.ascontiguousarray(a) for s, a in p.items()}, str(out / "corrupt" / f"{name}.safetensors"),
                  metadata=INDEX_META)
        manifest[name] = {"expect": cls.__name__, "what": what}
        if index_only:
            manifest[name]["only_index_decoders"] = True
    (out / "corrupt" / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    write_checkpoints(out, planes[("worked_example", "huffman")], planes[("verbatim", "palette")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
