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
