"""Pure-NumPy reference decoder of unweight format v1, written from docs/FORMAT.md alone.

It deliberately shares nothing with the production path (no ``unweight._C``, no
``tensor_codec``, no ``format.header``): header parsing, canonical-code construction, bit
reading and validation are re-derived from the spec so that a disagreement between this
module and the C++/CUDA decoders points at a bug in one of them or at an ambiguity in the
spec.  Only the numeric constants (``unweight.format.constants``) and the error classes are
shared.  It favours obviousness over speed: tests feed it tensors of at most ~10^5 weights.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..format.errors import ChecksumError, FormatError, VersionError

__all__ = ["decode_reference", "parse_header_reference", "canonical_code_table"]


def _u8(b: bytes, off: int) -> int:
    return b[off]


def _u16(b: bytes, off: int) -> int:
    return int.from_bytes(b[off:off + 2], "little")


def _u32(b: bytes, off: int) -> int:
    return int.from_bytes(b[off:off + 4], "little")


def parse_header_reference(header_bytes) -> dict:
    """Parse and validate a ``__hdr`` plane (FORMAT.md "Tensor header").

    header_bytes: uint8 array (any shape, flattened) or bytes, host memory.
    Returns a dict of the header fields; ``table`` is a list of num_ctx lists of code lengths
    (Huffman) or None.  Raises FormatError / VersionError.
    """
    b = bytes(np.asarray(header_bytes, dtype=np.uint8).reshape(-1)) if not isinstance(
        header_bytes, (bytes, bytearray)) else bytes(header_bytes)
    if len(b) < 64:
        raise FormatError(f"header plane has {len(b)} bytes, the fixed part alone is 64")
    if b[0:4] != b"UNWT":
        raise FormatError(f"bad magic {b[0:4]!r}")
    vmaj, vmin = _u8(b, 4), _u8(b, 5)
    # The major version is checked before anything else past the magic: a future major may
    # change every later byte, so nothing after this point can be trusted for it.
    if vmaj != 1:
        raise VersionError(f"unsupported unweight format version {vmaj}.{vmin} (reference reader knows 1.x)")
    h = {
        "version_major": vmaj, "version_minor": vmin,
        "encoding": _u8(b, 6), "src_dtype": _u8(b, 7),
        "rows": _u32(b, 8), "cols": _u32(b, 12),
        "rows_per_group": _u32(b, 16), "cols_per_chunk": _u32(b, 20),
        "crc32": _u32(b, 24),
        "max_code_len": _u8(b, 28), "num_ctx": _u8(b, 29),
        "exp_lo": _u8(b, 30), "exp_hi": _u8(b, 31),
        "pal_size": _u8(b, 32), "pal_block": _u8(b, 33),
        "stack": _u16(b, 34),  # 1.1: 0 = a matrix [N, K], E >= 1 = a stack [E, N, K]
        "num_verbatim": _u32(b, 36),
        "palette": list(b[40:56]),
        "table_bytes": _u32(b, 56),
        "header_crc32": _u32(b, 60),
        "table": None,
    }
    table = b[64:]
    if len(table) != h["table_bytes"]:
        raise FormatError(f"header plane carries {len(table)} table bytes, table_bytes says {h['table_bytes']}")
    if zlib.crc32(b[:60] + table) != h["header_crc32"]:
        raise FormatError("header crc32 mismatch: the header is corrupt")
    if h["src_dtype"] != 1:
        raise FormatError(f"unknown source dtype code {h['src_dtype']}")
    for f in ("rows", "cols", "rows_per_group", "cols_per_chunk"):
        if h[f] == 0:
            raise FormatError(f"header field {f} is 0")
    if h["encoding"] == 1:
        if h["max_code_len"] != 12 or h["num_ctx"] != 4 or h["exp_lo"] > h["exp_hi"]:
            raise FormatError("bad huffman parameters in header")
        width = h["exp_hi"] - h["exp_lo"] + 1
        if h["table_bytes"] != h["num_ctx"] * width:
            raise FormatError("huffman table size does not match the exponent range")
        h["table"] = [list(table[t * width:(t + 1) * width]) for t in range(h["num_ctx"])]
        # 1.2: a huffman header keeps the checkpoint interval S where a palette one keeps
        # num_verbatim; 0 = no __chk index.
        h["chk_interval"], h["num_verbatim"] = h["num_verbatim"], 0
        S = h["chk_interval"]
        if S and (S % 16 or S > 4096):
            raise FormatError(f"checkpoint interval {S} is not 0 or a multiple of 16 up to 4096")
    elif h["encoding"] == 2:
        if not 1 <= h["pal_size"] <= 16 or h["pal_block"] != 32 or h["table_bytes"] != 0:
            raise FormatError("bad palette parameters in header")
        if len(set(h["palette"][:h["pal_size"]])) != h["pal_size"]:
            raise FormatError("palette has duplicate entries")
    else:
        raise FormatError(f"unknown encoding code {h['encoding']}")
    return h


def canonical_code_table(lengths: list[int], lo: int) -> dict[int, int]:
    """Canonical prefix code of one context (FORMAT.md "Canonical code").

    lengths[i] is the code length of exponent lo+i (0 = absent).  Returns a dict keyed by
    ``(1 << length) | code`` (the leading 1 keeps codes of different lengths apart) whose
    value is the exponent.  Raises FormatError unless the lengths are a complete prefix code
    within 12 bits, or a single symbol of length 1, or empty.
    """
    used = [(l, lo + i) for i, l in enumerate(lengths) if l]
    if not used:
        return {}
    if any(l > 12 for l, _ in used):
        raise FormatError("code length above 12")
    if len(used) == 1:
        if used[0][0] != 1:
            raise FormatError("a lone symbol must have code length 1")
    else:
        kraft = sum(1 << (12 - l) for l, _ in used)
        if kraft != 1 << 12:
            raise FormatError(f"code lengths are not a complete prefix code (Kraft sum {kraft}/4096)")
    used.sort()  # by (length, exponent)
    table = {}
    code, prev_len = 0, used[0][0]
    for k, (l, sym) in enumerate(used):
        if k:
            code = (code + 1) << (l - prev_len)
        prev_len = l
        table[(1 << l) | code] = sym
    return table


def _want_plane(planes: dict, suffix: str, dtype, shape) -> np.ndarray:
    if suffix not in planes:
        raise FormatError(f"missing plane {suffix}")
    a = np.asarray(planes[suffix])
    if a.dtype != np.dtype(dtype) or (shape is not None and tuple(a.shape) != tuple(shape)):
        raise FormatError(f"plane {suffix} is {a.dtype} {tuple(a.shape)}, expected {np.dtype(dtype)} {shape}")
    return a


def _decode_huffman(h: dict, planes: dict, sm: np.ndarray, only: int | None = None) -> np.ndarray:
    """Exponents of every matrix: uint16 [E, N, K] (E = 1 for a plain matrix); with `only`,
    matrix `only` alone is decoded (the others stay 0)."""
    n, k, R, Cc = h["rows"], h["cols"], h["rows_per_group"], h["cols_per_chunk"]
    n_groups, n_chunks = -(-n // R), -(-k // Cc)
    n_seg = n_groups * n_chunks
    n_mat = max(1, h["stack"])
    exp = _want_plane(planes, "__exp", np.uint8, None)
    off = _want_plane(planes, "__off", np.uint32, (n_mat * n_seg + 1,))
    if exp.ndim != 1:
        raise FormatError("exponent stream must be 1-D")
    off = [int(x) for x in off]
    if off[0] != 0:
        raise FormatError("first segment offset is not 0")
    for s in range(n_mat * n_seg):
        if off[s + 1] < off[s]:
            raise FormatError(f"segment offsets are not ascending at segment {s}")
    if off[-1] + 8 != exp.size:
        raise FormatError(f"exponent stream is {exp.size} bytes, offsets say {off[-1]} + 8 slack (truncated?)")
    codes = [canonical_code_table(lens, h["exp_lo"]) for lens in h["table"]]
    sm = sm.reshape(n_mat, n, k)
    out = np.zeros((n_mat, n, k), dtype=np.uint16)
    for m in range(n_mat) if only is None else [only]:  # a stack: segments matrix after matrix
        _decode_huffman_matrix(exp, off[m * n_seg:(m + 1) * n_seg + 1], codes, h, sm[m], out[m])
    return out


def _decode_huffman_matrix(exp, off, codes, h, sm, out_exp) -> None:
    n, k, R, Cc = h["rows"], h["cols"], h["rows_per_group"], h["cols_per_chunk"]
    n_groups, n_chunks = -(-n // R), -(-k // Cc)
    ctx = ((sm >> 5) & 3).astype(np.int64)
    for s in range(n_groups * n_chunks):
        c, g = divmod(s, n_groups)  # chunk-major: s = c * n_groups + g
        r0, r1 = g * R, min(n, (g + 1) * R)
        k0, k1 = c * Cc, min(k, (c + 1) * Cc)
        bits = np.unpackbits(exp[off[s]:off[s + 1]], bitorder="big").tolist()
        pos = 0
        for r in range(r0, r1):
            for col in range(k0, k1):
                table = codes[ctx[r, col]]
                key, sym = 1, None
                for _ in range(12):
                    if pos >= len(bits):
                        raise FormatError(f"segment {s} runs past its end")
                    key = (key << 1) | bits[pos]
                    pos += 1
                    sym = table.get(key)
                    if sym is not None:
                        break
                if sym is None:
                    raise FormatError(f"invalid code in segment {s}")
                out_exp[r, col] = sym
        if (pos + 7) // 8 != off[s + 1] - off[s]:
            raise FormatError(f"segment {s} decodes to {pos} bits but spans {off[s + 1] - off[s]} bytes")


def _check_chains(h: dict, planes: dict, sm: np.ndarray) -> None:
    """Decode every chain of a huffman tensor's checkpoint index from its checkpoint and check
    that it ends where the next one starts (FORMAT.md "Checkpoint index").  Runs after the
    segment-by-segment decode has validated the stream, so only the index can fail here."""
    S = h["chk_interval"]
    n, k, R, Cc = h["rows"], h["cols"], h["rows_per_group"], h["cols_per_chunk"]
    n_groups, n_chunks = -(-n // R), -(-k // Cc)
    n_seg = n_groups * n_chunks
    n_mat = max(1, h.get("stack", 0))
    if not S:
        if "__chk" in planes:
            raise FormatError("a __chk plane is present but the header's checkpoint interval is 0")
        return
    P = -(-(min(R, n) * min(Cc, k)) // S) - 1
    chk = _want_plane(planes, "__chk", np.uint16, (n_mat * n_seg, P)).astype(np.int64)
    exp, off = planes["__exp"], [int(x) for x in planes["__off"]]
    codes = [canonical_code_table(lens, h["exp_lo"]) for lens in h["table"]]
    ctx = ((sm.reshape(n_mat, n, k) >> 5) & 3).astype(np.int64)
    for t in range(n_mat * n_seg):
        m_i, (c, g) = t // n_seg, divmod(t % n_seg, n_groups)
        r0, k0 = g * R, c * Cc
        width = min(k, k0 + Cc) - k0
        n_s = (min(n, r0 + R) - r0) * width
        used = -(-n_s // S) - 1
        if chk[t, used:].any():
            raise FormatError(f"checkpoint index row {t} has entries past the end of its segment")
        bits = np.unpackbits(exp[off[t]:off[t + 1]], bitorder="big").tolist()
        start = 0
        for m in range(used):  # chain m: weights m*S .. (m+1)*S - 1 from bit `start`
            pos = start
            for i in range(m * S, (m + 1) * S):
                table, key = codes[ctx[m_i, r0 + i // width, k0 + i % width]], 1
                for _ in range(12):
                    if pos >= len(bits):
                        raise FormatError(f"checkpoint {m} of segment {t} runs past the segment's end")
                    key, pos = (key << 1) | bits[pos], pos + 1
                    if key in table:
                        break
                else:
                    raise FormatError(f"checkpoint {m} of segment {t} does not start on a code")
            if pos != start + chk[t, m]:
                raise FormatError(f"chain {m} of segment {t} ends at bit {pos}, its next checkpoint is at "
                                  f"{start + chk[t, m]}: the checkpoint index is wrong")
            start = pos


def _decode_palette(h: dict, planes: dict) -> np.ndarray:
    """Exponents uint16 [E*N, K]: a stack's rows are numbered over all its matrices."""
    k = h["cols"]
    n = max(1, h["stack"]) * h["rows"]
    nv, pal_size = h["num_verbatim"], h["pal_size"]
    shape = (h["stack"], h["rows"]) if h["stack"] else (n,)
    idx = _want_plane(planes, "__idx", np.uint8, shape + ((k + 1) // 2,)).reshape(n, (k + 1) // 2)
    vpos = _want_plane(planes, "__vpos", np.uint32, (nv,)).astype(np.int64)
    vexp = _want_plane(planes, "__vexp", np.uint8, (nv, 32))
    bpr = -(-k // 32)
    if nv and (vpos.max() >= n * bpr or (nv > 1 and (np.diff(vpos) <= 0).any())):
        raise FormatError("verbatim block list is not strictly ascending or out of range")
    # Column j's index is the low nibble of byte j//2 when j is even, the high one when odd.
    nib = np.empty((n, k), dtype=np.uint8)
    nib[:, 0::2] = idx[:, : (k + 1) // 2] & 0x0F
    nib[:, 1::2] = idx[:, : k // 2] >> 4
    if (nib >= pal_size).any():
        raise FormatError("palette index out of range")
    palette = np.array(h["palette"][:pal_size], dtype=np.uint16)
    out_exp = palette[nib]
    for v in range(nv):
        r, blk = divmod(int(vpos[v]), bpr)
        k0, k1 = blk * 32, min(k, blk * 32 + 32)
        out_exp[r, k0:k1] = vexp[v, : k1 - k0]
    return out_exp


def _join(sm: np.ndarray, e: np.ndarray) -> np.ndarray:
    """BF16 words (little-endian uint16) from sign+mantissa bytes and exponents."""
    sm16 = sm.astype(np.uint16)
    return (((sm16 & 0x80) << 8) | (e << 7) | (sm16 & 0x7F)).astype("<u2")


def decode_reference(header_bytes, planes: dict, matrix: int | None = None) -> np.ndarray:
    """Decode one encoded tensor from its planes.

    header_bytes: the ``__hdr`` plane, uint8 [64 + table_bytes] (host).
    planes: suffix (``"__sm"``, ``"__exp"``, ...) -> NumPy array, as stored in the shard.
    Returns uint16 [N, K] BF16 bit patterns, or [E, N, K] for a stack (host).  Raises
    FormatError for any violation of FORMAT.md, VersionError for an unknown major version,
    ChecksumError when the decoded bytes do not hash to the header's crc32.
    matrix: decode only matrix `matrix` of a stack, returned as uint16 [N, K] (not checksummed).
    """
    h = parse_header_reference(header_bytes)
    shape = (h["stack"], h["rows"], h["cols"]) if h["stack"] else (h["rows"], h["cols"])
    sm = _want_plane(planes, "__sm", np.uint8, shape)
    if matrix is not None:
        # One matrix of a stack alone (an expert): only its own segments are read.  The crc32
        # covers the whole stack, so a lone matrix is returned unchecked.
        if not 0 <= matrix < h["stack"]:
            raise IndexError(f"matrix {matrix} of a tensor of shape {shape}")
        if h["encoding"] == 1:
            e = _decode_huffman(h, planes, sm, only=matrix)[matrix]
        else:
            e = _decode_palette(h, planes).reshape(shape)[matrix]
        return _join(sm[matrix], e).astype(np.uint16)
    if h["encoding"] == 1:
        e = _decode_huffman(h, planes, sm).reshape(shape)
        _check_chains(h, planes, sm)
    else:
        e = _decode_palette(h, planes).reshape(shape)
    out = _join(sm, e)
    if zlib.crc32(out.tobytes()) != h["crc32"]:
        raise ChecksumError("decoded tensor does not match its crc32: the data planes are corrupt")
    return out.astype(np.uint16)
