"""Length-limited canonical Huffman codes (docs/FORMAT.md "Canonical code")."""
import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unweight.codec import huffman
from unweight.codec.reference import canonical_code_table
from unweight.format import constants as C
from unweight.format.errors import FormatError

SETTINGS = settings(max_examples=60, deadline=None)


def unlimited_huffman_lengths(counts):
    """Textbook Huffman (no length limit): code lengths of the present symbols."""
    present = [i for i, c in enumerate(counts) if c]
    if len(present) == 1:
        return {present[0]: 1}
    heap = [(int(counts[i]), k, (i,)) for k, i in enumerate(present)]
    heapq.heapify(heap)
    depth = {i: 0 for i in present}
    k = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        for s in a[2] + b[2]:
            depth[s] += 1
        heapq.heappush(heap, (a[0] + b[0], k, a[2] + b[2]))
        k += 1
    return depth


def cost(counts, lengths):
    return sum(int(c) * int(l) for c, l in zip(counts, lengths))


def rule_codes(lengths):
    """The canonical rule, written out: sort by (length, symbol); first code 0; then +1 and
    shift left by the length growth."""
    order = sorted((int(l), s) for s, l in enumerate(lengths) if l)
    codes, code, prev = {}, 0, None
    for l, s in order:
        if prev is not None:
            code = (code + 1) << (l - prev)
        codes[s] = code
        prev = l
    return codes


counts_st = st.lists(st.integers(0, 10**6), min_size=1, max_size=256).filter(lambda c: any(c))


@SETTINGS
@given(counts_st)
def test_package_merge_is_optimal_when_the_limit_does_not_bind(counts):
    free = unlimited_huffman_lengths(counts)
    lens = huffman.code_lengths(np.array(counts))
    assert all(lens[i] == 0 for i, c in enumerate(counts) if c == 0)
    if max(free.values()) <= C.HUFF_MAX_CODE_LEN:
        assert cost(counts, lens) == sum(counts[s] * l for s, l in free.items())


@SETTINGS
@given(counts_st, st.integers(2, C.HUFF_MAX_CODE_LEN))
def test_length_limit_and_kraft(counts, limit):
    n = sum(1 for c in counts if c)
    if n > 1 << limit:
        with pytest.raises(ValueError):
            huffman.code_lengths(np.array(counts), limit)
        return
    lens = huffman.code_lengths(np.array(counts), limit)
    used = [int(l) for l in lens if l]
    assert len(used) == n
    assert max(used) <= limit
    if n == 1:
        assert used == [1]
    else:
        assert sum(2.0 ** -l for l in used) == 1.0  # complete code
    assert huffman.kraft_ok(lens, limit)
    # Never worse than a flat code of ceil(log2 n) bits, which also meets the limit.
    flat = max(1, (n - 1).bit_length())
    assert cost(counts, lens) <= flat * sum(counts)


def test_limit_binds_on_fibonacci_counts():
    fib = [1, 1]
    while len(fib) < 30:
        fib.append(fib[-1] + fib[-2])
    free = unlimited_huffman_lengths(fib)
    assert max(free.values()) > C.HUFF_MAX_CODE_LEN
    lens = huffman.code_lengths(np.array(fib))
    assert lens.max() == C.HUFF_MAX_CODE_LEN and huffman.kraft_ok(lens)
    assert cost(fib, lens) >= sum(fib[s] * l for s, l in free.items())


def test_limit_exactly_full():
    lens = huffman.code_lengths(np.ones(1 << C.HUFF_MAX_CODE_LEN, dtype=np.int64))
    assert (lens == C.HUFF_MAX_CODE_LEN).all()
    with pytest.raises(ValueError):
        huffman.code_lengths(np.ones((1 << C.HUFF_MAX_CODE_LEN) + 1, dtype=np.int64))


def test_degenerate_alphabets():
    assert (huffman.code_lengths(np.zeros(5, np.int64)) == 0).all()
    lens = huffman.code_lengths(np.array([0, 0, 9, 0]))
    assert lens.tolist() == [0, 0, 1, 0]
    assert huffman.canonical_codes(lens).tolist() == [0, 0, 0, 0]
    assert huffman.code_lengths(np.array([5, 1])).tolist() == [1, 1]


@SETTINGS
@given(counts_st)
def test_canonical_codes_follow_the_rule(counts):
    lens = huffman.code_lengths(np.array(counts))
    codes = huffman.canonical_codes(lens)
    want = rule_codes(lens)
    for s, l in enumerate(lens):
        if l:
            assert int(codes[s]) == want[s]
            assert int(codes[s]) < 1 << int(l)
        else:
            assert codes[s] == 0
    # Prefix-free: no code is a prefix of another.
    items = [(int(l), int(codes[s])) for s, l in enumerate(lens) if l]
    left = sorted(c << (16 - l) for l, c in items)
    spans = {c << (16 - l): 1 << (16 - l) for l, c in items}
    for a, b in zip(left, left[1:]):
        assert a + spans[a] <= b
    # The reference decoder derives the same code from the lengths alone.
    table = canonical_code_table([int(x) for x in lens], 0)
    assert table == {(1 << int(lens[s])) | int(codes[s]): s for s in range(len(lens)) if lens[s]}


def test_canonical_example_from_format_md():
    # FORMAT.md "Canonical code": lengths A=2 B=1 C=3 D=3 -> B=0, A=10, C=110, D=111.
    codes = huffman.canonical_codes(np.array([2, 1, 3, 3]))
    assert codes.tolist() == [0b10, 0b0, 0b110, 0b111]


@pytest.mark.parametrize("lens", [[1, 2], [2, 2, 2], [13, 1], [2], [1, 1, 1], [3, 0, 0]])
def test_reference_rejects_invalid_lengths(lens):
    assert not huffman.kraft_ok(np.array(lens))
    with pytest.raises(FormatError):
        canonical_code_table(lens, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=256, max_size=256), st.integers(0, 3))
def test_cpp_tables_match_python(counts, zero_mod):
    """The C++ package-merge and canonical codes give the Python implementation's bytes."""
    from unweight import _C
    hist = np.zeros((C.HUFF_NUM_CTX, 256), dtype=np.int64)
    for t in range(C.HUFF_NUM_CTX):
        row = np.array(counts, dtype=np.int64)
        if zero_mod:
            row[np.arange(256) % (zero_mod + t + 1) != 0] = 0  # sparse alphabets, lone symbols
        hist[t] = row
    lens, codes = _C.huffman_tables(hist)
    for t in range(C.HUFF_NUM_CTX):
        want = huffman.code_lengths(hist[t])
        assert np.array_equal(lens[t], want)
        assert np.array_equal(codes[t], huffman.canonical_codes(want))
