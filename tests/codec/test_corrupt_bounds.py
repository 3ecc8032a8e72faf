"""A corrupt exponent stream must be reported, never read out of bounds.

FORMAT.md "Decoding one segment": a decoder must not let a segment consume bits past its
end without reporting an error.  The stream is placed at the very end of a page followed
by a PROT_NONE guard page, so a decoder that reads past the buffer faults; the check runs
in a subprocess so a fault fails this test instead of killing the test run.
"""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import ctypes, mmap
    import numpy as np
    from unweight.codec import tensor_codec as tc
    from unweight.codec.reference import decode_reference
    from unweight.format.errors import FormatError

    K = 4000
    w = np.full((1, K), 0x3F80, dtype=np.uint16)
    w[0, ::40] = (np.arange(100, dtype=np.uint16) + 20) << 7  # rare exponents: long codes
    e = tc.encode(w, "huffman", grid=(1, K), threads=1)
    exp = e.planes["__exp"].copy()
    exp[:-8] = 0xFF  # every code now reads as one of the longest
    PAGE = mmap.PAGESIZE
    buf = mmap.mmap(-1, 2 * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(addr + PAGE), PAGE, 0) == 0
    arr = np.frombuffer(buf, dtype=np.uint8, count=PAGE)[PAGE - exp.size:]
    arr[:] = exp
    p = dict(e.planes)
    p["__exp"] = arr
    for dec in (lambda: decode_reference(p["__hdr"], p), lambda: tc.decode(e.header, p, threads=1)):
        try:
            dec()
        except FormatError:
            continue
        raise SystemExit("corrupt stream decoded without error")
    print("ok")
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mprotect guard pages")
def test_corrupt_stream_is_not_read_past_its_end():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, f"rc={r.returncode} {r.stderr[-500:]}"
