"""Length-limited canonical Huffman codes (docs/FORMAT.md "Canonical code").

Code lengths come from package-merge (Larmore & Hirschberg), which gives the optimal
prefix code under the HUFF_MAX_CODE_LEN limit; the alphabet is at most 256 exponents per
context, so a plain-Python implementation costs microseconds next to the encode itself.
"""
from __future__ import annotations

import numpy as np

from ..format import constants as C


def code_lengths(counts: np.ndarray, max_len: int = C.HUFF_MAX_CODE_LEN) -> np.ndarray:
    """Optimal length-limited code lengths.

    counts: int array [n] of symbol frequencies (0 = absent).
    Returns uint8 [n]: 0 for absent symbols, 1 for a lone symbol, else lengths of a complete
    prefix code with every length <= max_len.
    """
    counts = np.asarray(counts, dtype=np.int64)
    out = np.zeros(len(counts), dtype=np.uint8)
    present = np.flatnonzero(counts)
    n = len(present)
    if n == 0:
        return out
    if n == 1:
        out[present[0]] = 1
        return out
    if n > (1 << max_len):
        raise ValueError(f"{n} symbols cannot be coded within {max_len} bits")
    # Each item is (weight, tuple of leaf symbols); ties order by symbol for determinism.
    leaves = sorted(((int(counts[s]), (int(s),)) for s in present), key=lambda x: (x[0], x[1]))
    current = list(leaves)
    for _ in range(max_len - 1):
        packages = [(current[i][0] + current[i + 1][0], current[i][1] + current[i + 1][1])
                    for i in range(0, len(current) - 1, 2)]
        current = sorted(leaves + packages, key=lambda x: x[0])
    for _weight, syms in current[: 2 * n - 2]:
        for s in syms:
            out[s] += 1
    return out


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """Canonical codes for lengths [n] (symbol i = index i): uint16 [n], 0 where length is 0.

    Symbols are ordered by (length, symbol); the first code is all zeros and each next one
    is the previous plus one, shifted left by the growth in length.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    codes = np.zeros(len(lengths), dtype=np.uint16)
    order = sorted((int(l), i) for i, l in enumerate(lengths) if l > 0)
    code, prev = 0, 0
    for k, (l, i) in enumerate(order):
        if k:
            code = (code + 1) << (l - prev)
        else:
            code = 0 << l
        codes[i] = code
        prev = l
    return codes


def kraft_ok(lengths: np.ndarray, max_len: int = C.HUFF_MAX_CODE_LEN) -> bool:
    """True when lengths form a code a v1 decoder accepts (complete, or one symbol of length 1)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    used = lengths[lengths > 0]
    if len(used) == 0:
        return True
    if (used > max_len).any():
        return False
    if len(used) == 1:
        return int(used[0]) == 1
    return int(sum(1 << (max_len - int(l)) for l in used)) == (1 << max_len)
