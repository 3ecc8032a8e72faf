"""constants.py is the one source of format constants: the generated C++ header must match it."""
import importlib.util
import pathlib
import struct

from unweight.format import constants as C

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _gen():
    spec = importlib.util.spec_from_file_location("_gen_constants", ROOT / "scripts" / "gen_constants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_cpp_header_is_current():
    # The same comparison `scripts/gen_constants.py --check` makes.
    gen = _gen()
    assert gen.HEADER.read_text() == gen.render(), "csrc/unweight_constants.h is stale: run scripts/gen_constants.py"


def test_check_mode_exit_code(monkeypatch):
    gen = _gen()
    monkeypatch.setattr("sys.argv", ["gen_constants.py", "--check"])
    assert gen.main() == 0


def test_every_exported_constant_is_rendered():
    text = _gen().render()
    for name in C.CPP_EXPORTS:
        assert f"constexpr int {name} = {int(getattr(C, name))};" in text
    assert f"0x{int.from_bytes(C.MAGIC, 'little'):08X}u" in text


def test_built_extension_agrees_with_constants():
    # A stale _C built from an older header would silently decode with other constants.
    from unweight import _C

    for name in ("VERSION_MAJOR", "HUFF_MAX_CODE_LEN", "HUFF_NUM_CTX", "PAL_BLOCK"):
        assert getattr(_C, name) == getattr(C, name)


def test_derived_relations():
    assert C.FORMAT_VERSION == f"{C.VERSION_MAJOR}.{C.VERSION_MINOR}"
    assert C.HUFF_NUM_CTX == 1 << 2 and C.HUFF_CTX_SHIFT + 2 == 7  # the top two mantissa bits
    assert C.PAL_MAX_ENTRIES == 16  # a palette index is one nibble
    assert set(C.HUFFMAN_PLANES) | set(C.HUFFMAN_OPTIONAL_PLANES) | set(C.PALETTE_PLANES) == set(C.ALL_SUFFIXES)
    assert C.HEADER_BYTES == struct.calcsize("<4sBBBBIIIIIBBBBBBHI16sI") + 4
