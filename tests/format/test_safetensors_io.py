"""ShardWriter: the side-file mode and the planned (header-first) mode write the same bytes."""
import numpy as np
import pytest

from unweight.format.safetensors_io import SafetensorsFile, ShardWriter

TENSORS = [("a.weight", "BF16", (3, 5), np.arange(15, dtype=np.uint16).reshape(3, 5)),
           ("b.bias", "F32", (4,), np.array([1.5, -0.0, np.inf, 7], dtype=np.float32)),
           ("c", "U8", (0,), np.zeros(0, dtype=np.uint8))]


def _write(path, plan):
    w = ShardWriter(str(path), {"format": "pt"}, plan)
    for name, dt, shape, a in TENSORS:
        w.add(name, dt, shape, a)
    return w.close()


def test_planned_writer_matches_side_file_writer(tmp_path):
    plan = [(n, dt, shape, a.nbytes) for n, dt, shape, a in TENSORS]
    n1 = _write(tmp_path / "side.safetensors", None)
    n2 = _write(tmp_path / "plan.safetensors", plan)
    a, b = (tmp_path / "side.safetensors").read_bytes(), (tmp_path / "plan.safetensors").read_bytes()
    assert a == b and n1 == n2 == len(a)
    f = SafetensorsFile(str(tmp_path / "plan.safetensors"))
    assert f.array("a.weight").tobytes() == TENSORS[0][3].tobytes()
    f.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.safetensors", "side.safetensors"]


def test_planned_writer_refuses_what_the_plan_does_not_say(tmp_path):
    plan = [(n, dt, shape, a.nbytes) for n, dt, shape, a in TENSORS]
    w = ShardWriter(str(tmp_path / "x.safetensors"), {}, plan)
    with pytest.raises(ValueError, match="does not match the shard plan"):
        w.add("b.bias", "F32", (4,), TENSORS[1][3])  # out of order
    w.add(*TENSORS[0])
    with pytest.raises(ValueError, match="never written"):
        w.close()
    w.abort()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ malformed headers


def _raw_file(path, header, data: bytes, header_text: str | None = None):
    """A safetensors file from a header dict (or its literal JSON text) and a data buffer."""
    import json
    import struct
    hb = (header_text if header_text is not None else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)
    return str(path)


def _entry(b, e, shape=None, dtype="U8"):
    return {"dtype": dtype, "shape": shape if shape is not None else [e - b], "data_offsets": [b, e]}


def test_tensors_in_any_header_order_and_empty_tensors_are_fine(tmp_path):
    # The spec orders nothing in the header; only the offsets must tile the buffer.
    p = _raw_file(tmp_path / "ok.safetensors",
                  {"b": _entry(4, 10), "empty": _entry(4, 4, [0, 3]), "a": _entry(0, 4, [2, 1], "BF16"),
                   "__metadata__": {"format": "pt"}}, bytes(range(10)))
    f = SafetensorsFile(p)
    assert f.array("b").tobytes() == bytes(range(4, 10))
    assert f.array("a").tobytes() == bytes(range(4)) and f.array("empty").shape == (0, 3)
    f.close()


BAD_HEADERS = {
    # name: (header, data length, words the message must hold)
    "overlap": ({"a": _entry(0, 8), "b": _entry(4, 12)}, 12, ["'b'", "overlaps", "'a'"]),
    "same_bytes": ({"a": _entry(0, 8), "b": _entry(0, 8)}, 8, ["overlaps"]),
    "empty_inside_another": ({"a": _entry(0, 8), "z": _entry(3, 3, [0])}, 8, ["overlaps"]),
    "gap": ({"a": _entry(0, 4), "b": _entry(6, 8)}, 8, ["[4, 6)", "belong to no tensor", "'b'"]),
    "hole_at_start": ({"a": _entry(2, 8)}, 8, ["[0, 2)", "start"]),
    "trailing_bytes": ({"a": _entry(0, 4)}, 8, ["last 4 bytes"]),
    "past_the_end": ({"a": _entry(0, 16)}, 8, ["'a'", "past the end", "truncated"]),
    "ends_before_it_begins": ({"a": {"dtype": "U8", "shape": [0], "data_offsets": [6, 2]}}, 8, ["end before"]),
    "size_not_shape": ({"a": _entry(0, 8, [3, 2], "BF16")}, 8, ["'a'", "holds 8 bytes", "needs 12"]),
    "negative_dim": ({"a": _entry(0, 8, [-8])}, 8, ["'a'", "shape"]),
    "float_dim": ({"a": _entry(0, 8, [8.0])}, 8, ["shape"]),
    "string_dim": ({"a": _entry(0, 8, ["8"])}, 8, ["shape"]),
    "bool_dim": ({"a": _entry(0, 1, [True])}, 1, ["shape"]),
    "shape_not_list": ({"a": _entry(0, 8, 8)}, 8, ["shape"]),
    "negative_offset": ({"a": {"dtype": "U8", "shape": [0], "data_offsets": [-1, -1]}}, 0, ["data_offsets"]),
    "float_offset": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0.0, 8]}}, 8, ["data_offsets"]),
    "three_offsets": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 4, 8]}}, 8, ["data_offsets"]),
    "missing_field": ({"a": {"dtype": "U8", "shape": [8]}}, 8, ["'a'", "data_offsets"]),
    "entry_not_object": ({"a": [0, 8]}, 8, ["'a'"]),
    "dtype_not_string": ({"a": {"dtype": 3, "shape": [8], "data_offsets": [0, 8]}}, 8, ["dtype"]),
    "metadata_not_strings": ({"a": _entry(0, 8), "__metadata__": {"n": 3}}, 8, ["__metadata__"]),
    "header_not_object": ([1, 2], 0, ["not a JSON object"]),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_headers_are_format_errors_naming_file_and_tensor(tmp_path, case):
    from unweight.format.errors import FormatError
    header, n, words = BAD_HEADERS[case]
    p = _raw_file(tmp_path / f"{case}.safetensors", header, bytes(n))
    with pytest.raises(FormatError) as e:
        SafetensorsFile(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(p), msg
    for w in words:
        assert w in msg, msg


def test_duplicate_tensor_name_is_refused(tmp_path):
    from unweight.format.errors import FormatError
    text = '{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, ' \
           '"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}'
    p = _raw_file(tmp_path / "dup.safetensors", None, bytes(8), header_text=text)
    with pytest.raises(FormatError, match="'a' appears twice"):
        SafetensorsFile(p)


def test_unknown_dtype_is_an_input_error(tmp_path):
    from unweight.format.errors import InputError
    p = _raw_file(tmp_path / "c64.safetensors", {"z": _entry(0, 8, [1], "C64")}, bytes(8))
    with pytest.raises(InputError, match="'z' has unsupported dtype C64"):
        SafetensorsFile(p)


def test_a_refused_file_is_closed(tmp_path):
    import os
    p = _raw_file(tmp_path / "bad.safetensors", {"a": _entry(0, 16)}, bytes(8))

    def open_fds():
        return sum(1 for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == p)
    # The error's traceback (kept here, as a caller logging it would) still references the
    # half-built reader; its file must be closed all the same.
    with pytest.raises(Exception) as err:
        SafetensorsFile(p)
    assert open_fds() == 0 and err.value
