"""Shard files written once: ShardWriter with a reserved header room (compress's mode) puts
the data straight into the final file and the header last into its room; a header that
outgrows the room falls back to the side-file copy; compress never makes a side file."""
import json
import os
import struct

import numpy as np
import pytest
import torch

from unweight import api
from unweight.format import safetensors_io
from unweight.format.safetensors_io import SafetensorsFile, ShardWriter


def _tensors():
    rng = np.random.default_rng(0)
    return [("a", "U8", (3, 5), rng.integers(0, 255, (3, 5), dtype=np.uint8)),
            ("b.weight", "BF16", (4, 2), rng.integers(0, 2**16, (4, 2), dtype=np.uint16)),
            ("c", "U32", (7,), rng.integers(0, 2**32, 7, dtype=np.uint32))]


@pytest.mark.parametrize("reserve", [4096, 8])  # room to spare; a room the header outgrows
def test_reserved_header_room(tmp_path, reserve):
    path = str(tmp_path / "s.safetensors")
    w = ShardWriter(path, {"format": "pt"}, reserve=reserve)
    for name, dt, shape, a in _tensors():
        w.add(name, dt, shape, a)
    size = w.close()
    assert size == os.path.getsize(path)
    assert not os.path.exists(path + ".data.tmp")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = f.read(n)
    assert n % 8 == 0 and (n == reserve if reserve > 8 else n > reserve)
    json.loads(head)  # padded with spaces: still one JSON object
    f = SafetensorsFile(path)
    for name, dt, shape, a in _tensors():
        assert f.info(name)[:2] == (dt, shape) and f.array(name).tobytes() == a.tobytes()
    f.close()
    from safetensors.torch import load_file  # the reference reader agrees
    got = load_file(path)
    for name, _, _, a in _tensors():
        assert got[name].reshape(-1).view(torch.uint8).numpy().tobytes() == a.tobytes()


def test_compress_writes_each_shard_once(tmp_path, monkeypatch):
    """No side file: every shard is opened for writing once, under its temporary name, and
    its header room wastes little (the bound is per tensor, from its possible shapes)."""
    from tests.conftest import bf16_gaussian, write_checkpoint
    rng = np.random.default_rng(1)
    src = write_checkpoint(str(tmp_path / "src"), {
        "w1": ("BF16", bf16_gaussian(rng, (256, 512))), "w2": ("BF16", bf16_gaussian(rng, (512, 256))),
        "norm": ("F32", rng.standard_normal(256).astype(np.float32)),
        "emb": ("BF16", bf16_gaussian(rng, (1000, 64)))})
    opened = []
    real_open = open

    def spy(path, mode="r", *a, **k):
        if "w" in mode and str(path).endswith(".tmp"):
            opened.append(os.path.basename(str(path)))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(safetensors_io, "open", spy, raising=False)
    for enc in ("huffman", "auto"):
        opened.clear()
        out = str(tmp_path / enc)
        api.compress(src, out, encoding=enc, progress=False, max_shard_size="300KB")
        assert len(opened) == len(set(opened)) >= 2 and not any(o.endswith(".data.tmp") for o in opened), opened
        for name in os.listdir(out):
            if name.endswith(".safetensors"):
                with real_open(os.path.join(out, name), "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    head = f.read(n)
                assert len(head) - len(head.rstrip(b" ")) < 1024, (enc, name)
        assert api.verify(out, against=src)["ok"]
