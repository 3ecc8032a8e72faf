"""Golden files of format v1 (written once by scripts/make_golden.py, then frozen).

The reference decoder, the C++ codec and the stored originals must agree bit for bit; the
encoder must still produce the same bytes; every corrupt file must be refused by both
decoders with the error class its manifest names; FORMAT.md's worked example must show the
golden bytes.
"""
import hashlib
import json
import pathlib
import re
import zlib

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from unweight.codec import tensor_codec as tc
from unweight.codec.reference import decode_reference
from unweight.format import constants as C
from unweight.format import errors

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = ("worked_example", "verbatim", "all_patterns")
ENCODINGS = ("huffman", "palette")
# Format 1.2 files with a checkpoint index (huffman only), as (case, encoding).
INDEXED = (("index_example", "huffman"), ("all_patterns_indexed", "huffman"))
FILES = [(c, e) for c in CASES for e in ENCODINGS] + list(INDEXED)
NAME = "w"


def load_planes(path: pathlib.Path) -> dict:
    return {k[len(NAME):]: v for k, v in load_file(str(path)).items()}


def cpp_decode(planes: dict) -> np.ndarray:
    h = tc.encoded_header(planes, "golden")
    return tc.decode(h, planes, threads=1)


def meta(case: str) -> dict:
    return json.loads((HERE / f"{case}.json").read_text())


def original(case: str):
    m = meta(case)
    if "values" not in m:
        return original(m["note"].split("'")[0]) if case.endswith("_indexed") else None
    return np.array([[int(x, 16) for x in row] for row in m["values"]], dtype=np.uint16)


@pytest.mark.parametrize("case,enc", FILES)
def test_decoders_agree_with_originals(case, enc):
    m = meta(case)
    path = HERE / m["files"][enc]
    with safe_open(str(path), "np") as f:
        assert f.metadata()["unweight_format_version"] == m.get("format_version", "1.0")
    planes = load_planes(path)
    want = set(C.HUFFMAN_PLANES if enc == "huffman" else C.PALETTE_PLANES)
    assert set(planes) == (want | {C.SUFFIX_CHK} if "chk_interval" in m else want)
    ref = decode_reference(planes[C.SUFFIX_HDR], planes)
    cpp = cpp_decode(planes)
    assert ref.dtype == cpp.dtype == np.uint16
    assert ref.shape == cpp.shape == tuple(m["shape"])
    np.testing.assert_array_equal(ref, cpp)
    raw = ref.astype("<u2").tobytes()
    assert zlib.crc32(raw) == m["crc32"]
    assert hashlib.sha256(raw).hexdigest() == m["sha256"]
    w = original(case)
    if w is not None:
        np.testing.assert_array_equal(ref, w)
    else:  # all_patterns: every uint16 exactly once
        assert np.array_equal(np.sort(ref.reshape(-1)), np.arange(65536, dtype=np.uint16))
    h = tc.encoded_header(planes)
    assert [h.rows_per_group, h.cols_per_chunk] == m["grid"]
    assert h.chk_interval == m.get("chk_interval", 0)
    assert (h.version_major, h.version_minor) == tuple(int(x) for x in m.get("format_version", "1.0").split("."))


@pytest.mark.parametrize("case,enc", FILES)
def test_reencoding_reproduces_the_bytes(case, enc):
    planes = load_planes(HERE / meta(case)["files"][enc])
    w = cpp_decode(planes)
    h = tc.encoded_header(planes)
    for threads in (1, 2):
        again = tc.encode(w, enc, grid=(h.rows_per_group, h.cols_per_chunk), threads=threads,
                          chk_interval=h.chk_interval).planes
        assert set(again) == set(planes)
        for s in planes:
            assert again[s].dtype == planes[s].dtype and again[s].shape == planes[s].shape, s
            assert again[s].tobytes() == planes[s].tobytes(), f"{case}/{enc}: plane {s} changed"


def test_huffman_to_palette_transcode_matches_golden():
    for case in CASES:
        h_planes = load_planes(HERE / meta(case)["files"]["huffman"])
        p_planes = load_planes(HERE / meta(case)["files"]["palette"])
        t = tc.transcode_to_palette(tc.encoded_header(h_planes), h_planes, threads=1)
        for s in p_planes:
            assert t.planes[s].tobytes() == p_planes[s].tobytes(), (case, s)


MANIFEST = json.loads((HERE / "corrupt" / "manifest.json").read_text())


def test_manifest_lists_every_corrupt_file():
    on_disk = {p.stem for p in (HERE / "corrupt").glob("*.safetensors")}
    assert on_disk == set(MANIFEST)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_corrupt_files_are_refused_by_both_decoders(name):
    want = getattr(errors, MANIFEST[name]["expect"])
    assert issubclass(want, errors.FormatError)
    planes = load_planes(HERE / "corrupt" / f"{name}.safetensors")
    with pytest.raises(errors.FormatError) as ref_err:
        decode_reference(planes.get(C.SUFFIX_HDR, np.zeros(0, np.uint8)), planes)
    assert type(ref_err.value) is want, f"reference raised {ref_err.value!r}"
    if MANIFEST[name].get("only_index_decoders"):
        # A checkpoint entry that is wrong but inside every bound: the C++ decoder ignores the
        # index and decodes exactly (the CUDA kernels, which use it, are held to refusing it
        # in tests/cuda).
        np.testing.assert_array_equal(cpp_decode(planes), original("index_example"))
        return
    with pytest.raises(errors.FormatError) as cpp_err:
        cpp_decode(planes)
    assert type(cpp_err.value) is want, f"C++ codec raised {cpp_err.value!r}"


def test_version_error_names_the_version():
    planes = load_planes(HERE / "corrupt" / "version_2_0.safetensors")
    for dec in (lambda: decode_reference(planes[C.SUFFIX_HDR], planes), lambda: cpp_decode(planes)):
        with pytest.raises(errors.VersionError, match=r"2\.0"):
            dec()


def _hex(a: np.ndarray) -> str:
    return " ".join(f"{b:02x}" for b in np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def test_format_md_shows_the_golden_bytes():
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "FORMAT.md").read_text().lower())
    for enc in ENCODINGS:
        planes = load_planes(HERE / meta("worked_example")["files"][enc])
        for s, a in planes.items():
            shown = a[: C.HEADER_BYTES] if s == C.SUFFIX_HDR else a
            if shown.size:
                assert _hex(shown) in doc, f"FORMAT.md does not show the {enc} {s} bytes: {_hex(shown)}"
    planes = load_planes(HERE / meta("index_example")["files"]["huffman"])
    for s in (C.SUFFIX_HDR, C.SUFFIX_OFF, C.SUFFIX_EXP, C.SUFFIX_CHK):
        shown = planes[s][: C.HEADER_BYTES] if s == C.SUFFIX_HDR else planes[s]
        assert _hex(shown) in doc, f"FORMAT.md does not show the index example's {s} bytes: {_hex(shown)}"


# ------------------------------------------------------------------ whole checkpoints

CHECKPOINT = HERE / "checkpoint"
CK_CORRUPT = HERE / "corrupt" / "checkpoints"
CK_MANIFEST = json.loads((CK_CORRUPT / "manifest.json").read_text())


def _make_golden():
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "scripts" / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_make_golden_reproduces_the_checkpoints():
    # Built from the frozen golden planes, so only the checkpoint layer is under test here.
    valid, cases = _make_golden().checkpoint_cases(load_planes(HERE / "worked_example_huffman.safetensors"),
                                                   load_planes(HERE / "verbatim_palette.safetensors"))
    for folder, files in [(CHECKPOINT, valid)] + [(CK_CORRUPT / n, f) for n, (f, _, _) in cases.items()]:
        assert {p.name for p in folder.iterdir()} == set(files), folder
        for fname, data in files.items():
            assert (folder / fname).read_bytes() == data, f"{folder.name}/{fname} changed"
    assert set(cases) == set(CK_MANIFEST)


def test_golden_checkpoint_reads_back_exactly(tmp_path):
    from unweight import api
    from unweight.format.safetensors_io import SafetensorsFile
    r = api.verify(str(CHECKPOINT), jobs=1)
    assert (r["encoded_checked"], r["raw_checked"]) == (2, 2)
    api.decompress(str(CHECKPOINT), str(tmp_path / "d"), progress=False)
    f = SafetensorsFile(str(tmp_path / "d" / "model.safetensors"))
    try:
        assert f.names() == ["layers.0.w", "layers.0.b", "layers.1.w", "norm"]
        assert f.array("layers.0.w").tobytes() == original("worked_example").tobytes()
        assert f.array("layers.1.w").tobytes() == original("verbatim").tobytes()
        assert f.array("layers.0.b").tobytes() == original("worked_example")[0].tobytes()
        assert f.array("norm").view(np.float32).tolist() == [1.0, -0.5, 0.25, 2.0]
    finally:
        f.close()


def test_checkpoint_manifest_lists_every_folder():
    assert {p.name for p in CK_CORRUPT.iterdir() if p.is_dir()} == set(CK_MANIFEST)


@pytest.mark.parametrize("name", sorted(CK_MANIFEST))
def test_corrupt_checkpoints_are_refused_by_every_command(name, tmp_path):
    from unweight import api
    want = getattr(errors, CK_MANIFEST[name]["expect"])
    path = str(CK_CORRUPT / name)
    for what, call in (("verify", lambda: api.verify(path, jobs=1)), ("inspect", lambda: api.inspect(path, jobs=1)),
                       ("decompress", lambda: api.decompress(path, str(tmp_path / "d"), jobs=1, progress=False))):
        with pytest.raises(errors.FormatError) as e:
            call()
        assert type(e.value) is want, f"{what} raised {e.value!r}"
        assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
