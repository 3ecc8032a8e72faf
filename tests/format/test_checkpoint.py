"""Checkpoint folders: the index, shard discovery, tensor lookup, and a compressed
checkpoint's structure and records (written here with the format layer alone)."""
import json
import os

import numpy as np
import pytest

from unweight.format import constants as C
from unweight.format.checkpoint import (Checkpoint, CompressedCheckpoint, list_weight_files, read_index,
                                        split_name)
from unweight.format.errors import FormatError, InputError, VersionError
from unweight.format.shards import ShardSet, write_index

HDR = np.zeros(64, np.uint8)  # a stand-in header plane: nothing here parses it


def _folder(tmp_path, groups, *, max_bytes=1 << 30, config=None, name="ck", compressed=True):
    """Write groups [[(name, array)]] with ShardSet (one shard per group when max_bytes is
    small), an index with records, and a config; returns (folder, shard names)."""
    d = tmp_path / name
    d.mkdir()
    meta = {"format": "pt"}
    if compressed:
        meta["unweight_format_version"] = C.FORMAT_VERSION
    s = ShardSet(str(d), max_bytes, meta, crc_meta=compressed)
    for g in groups:
        s.add_group([(n, {1: "U8", 4: "F32"}[a.itemsize], a.shape, a) for n, a in g],
                    raw_crc=(g[0][0], 0) if compressed and "__" not in g[0][0] else None)
    files = s.finish()
    write_index(str(d), s.weight_map, s.file_sizes, {"format_version": C.FORMAT_VERSION} if compressed else None)
    cfg = dict(config or {})
    if compressed:
        cfg.setdefault("quantization_config", {"quant_method": C.QUANT_METHOD, "format_version": C.FORMAT_VERSION})
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d), files


def _index(folder):
    return json.load(open(os.path.join(folder, C.INDEX_NAME)))


def _set_index(folder, idx):
    json.dump(idx, open(os.path.join(folder, C.INDEX_NAME), "w"))


GROUPS = [[("a.w" + C.SUFFIX_HDR, HDR), ("a.w" + C.SUFFIX_SM, np.ones((4, 4), np.uint8))],
          [("a.b", np.arange(4, dtype=np.float32))],
          [("b.w" + C.SUFFIX_HDR, HDR), ("b.w" + C.SUFFIX_SM, np.ones((2, 2), np.uint8))]]


def test_split_name():
    assert split_name("x.weight__sm") == ("x.weight", C.SUFFIX_SM)
    assert split_name("x.weight") == ("x.weight", None)
    assert split_name("x.weight__smx") == ("x.weight__smx", None)


def test_compressed_checkpoint_groups_planes_and_keeps_order(tmp_path):
    folder, files = _folder(tmp_path, GROUPS, max_bytes=64)
    assert len(files) == 3
    ck = CompressedCheckpoint(folder)
    assert ck.tensor_order() == ["a.w", "a.b", "b.w"]
    assert sorted(ck.encoded) == ["a.w", "b.w"] and ck.raw == ["a.b"]
    assert ck.raw_checksums() == {"a.b": 0}
    assert ck.location("b.w") == f"b.w ({os.path.join(folder, files[2])})"
    assert ck.array("a.b").tolist() == [0.0, 1.0, 2.0, 3.0]
    ck.close()


def test_index_order_missing_shard_and_bad_index(tmp_path):
    folder, files = _folder(tmp_path, GROUPS, max_bytes=64)
    assert [os.path.basename(p) for p in list_weight_files(folder)] == files
    os.rename(os.path.join(folder, files[1]), os.path.join(folder, "elsewhere"))
    with pytest.raises(InputError, match=f"shard {files[1]} named in .* is missing"):
        Checkpoint(folder)
    for bad, match in (("{", "corrupt index"), ('{"weight_map": [1]}', "corrupt index"),
                       ('{"weight_map": {"a": "../x.safetensors"}}', "not a file name")):
        open(os.path.join(folder, C.INDEX_NAME), "w").write(bad)
        with pytest.raises(FormatError, match=match):
            read_index(folder)
    os.unlink(os.path.join(folder, C.INDEX_NAME))
    assert read_index(folder) is None
    # Without the index the names "-of-00003" are the one record left of the lost shard.
    with pytest.raises(InputError, match=f"shard {files[1]} is missing"):
        list_weight_files(folder)
    os.rename(os.path.join(folder, "elsewhere"), os.path.join(folder, files[1]))
    assert [os.path.basename(p) for p in list_weight_files(folder)] == files


def test_plain_checkpoint_rules(tmp_path):
    folder, files = _folder(tmp_path, GROUPS[1:2], compressed=False, name="plain")
    ck = Checkpoint(folder)
    assert ck.names() == ["a.b"] and ck.config() == {}
    ck.close()
    assert Checkpoint(os.path.join(folder, files[0])).config() is None  # a single file has no config
    open(os.path.join(folder, "config.json"), "w").write("{nope")
    with pytest.raises(FormatError, match="invalid JSON"):
        Checkpoint(folder).config()
    open(os.path.join(folder, "config.json"), "w").write("{}")
    with pytest.raises(InputError, match="not an unweight checkpoint"):
        CompressedCheckpoint(folder)
    with pytest.raises(InputError, match="no such file or folder"):
        Checkpoint(str(tmp_path / "nothing"))
    # The same tensor in two shards.
    other, _ = _folder(tmp_path, GROUPS[1:2], compressed=False, name="other")
    os.rename(os.path.join(other, "model.safetensors"), os.path.join(folder, "model-2.safetensors"))
    os.unlink(os.path.join(folder, C.INDEX_NAME))
    with pytest.raises(FormatError, match="'a.b' appears in both"):
        Checkpoint(folder)


def test_index_entry_must_name_the_shard_holding_the_tensor(tmp_path):
    folder, files = _folder(tmp_path, GROUPS, max_bytes=64)
    idx = _index(folder)
    idx["weight_map"]["a.b"] = files[0]
    _set_index(folder, idx)
    with pytest.raises(FormatError, match=f"tensor 'a.b' listed for {files[0]} is not in that shard"):
        Checkpoint(folder)


def test_planes_without_header_and_foreign_or_future_configs(tmp_path):
    folder, _ = _folder(tmp_path, [[("x.w" + C.SUFFIX_SM, np.ones((2, 2), np.uint8))]])
    with pytest.raises(FormatError, match="'x.w': plane __hdr is missing"):
        CompressedCheckpoint(folder)
    folder, _ = _folder(tmp_path, GROUPS[:1], config={"quantization_config": {"quant_method": "gptq"}}, name="q")
    with pytest.raises(InputError, match="quant_method='gptq'"):
        CompressedCheckpoint(folder)
    folder, _ = _folder(tmp_path, GROUPS[:1], config={"quantization_config": {
        "quant_method": C.QUANT_METHOD, "format_version": "2.0"}}, name="v2")
    with pytest.raises(VersionError, match="2.0"):
        CompressedCheckpoint(folder)


def test_raw_checksum_metadata_is_validated(tmp_path):
    folder, files = _folder(tmp_path, GROUPS[1:2])
    ck = CompressedCheckpoint(folder)
    f = ck.files[0]
    for bad, match in (("not json", "corrupt unweight_crc32"), ('{"a.b": -1}', "corrupt unweight_crc32"),
                       ('{"a.b": true}', "corrupt unweight_crc32"), ('{"zz": 1}', "'zz'")):
        f.metadata["unweight_crc32"] = bad
        ck._raw_crcs = None  # read the changed metadata again
        with pytest.raises(FormatError, match=match):
            ck.raw_checksums()
    ck.close()


def test_records_checked_on_open(tmp_path):
    folder, files = _folder(tmp_path, GROUPS, max_bytes=64)
    CompressedCheckpoint(folder).close()
    good = _index(folder)
    rec = good["metadata"]["unweight"]
    assert rec["shards"] == files and rec["stored_tensors"] == 5

    def bad(change, match):
        idx = json.loads(json.dumps(good))
        change(idx)
        _set_index(folder, idx)
        with pytest.raises(FormatError, match=match):
            CompressedCheckpoint(folder)

    def lose_shard(idx, records=True):
        idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v != files[2]}
        if not records:
            idx["metadata"]["unweight"] = {"format_version": C.FORMAT_VERSION}
    bad(lose_shard, f"shard {files[2]} is recorded in the index metadata but the weight_map names none")
    bad(lambda i: lose_shard(i, False), f"shard {files[2]} holds unweight tensors but the weight_map names none")
    bad(lambda i: i["metadata"]["unweight"].update(shards=files[:2]), f"names shard {files[2]}, which")
    bad(lambda i: i["metadata"]["unweight"].update(shards="x"), "unweight.shards must list file names")
    bad(lambda i: i["metadata"]["unweight"].update(stored_tensors=4), "lists 5 tensors, the index metadata records 4")
    bad(lambda i: (i["weight_map"].pop("a.w__sm"), i["metadata"]["unweight"].update(stored_tensors=4)),
        "tensor 'a.w__sm' of .* is not in the weight_map")
    bad(lambda i: i["metadata"].update(total_size=1), "total_size is 1 bytes but the shards it lists hold")
    # Without the records and without the stray shard, what is left is consistent.
    idx = json.loads(json.dumps(good))
    lose_shard(idx, False)
    idx["metadata"]["total_size"] -= os.path.getsize(os.path.join(folder, files[2]))
    _set_index(folder, idx)
    os.unlink(os.path.join(folder, files[2]))
    ck = CompressedCheckpoint(folder)
    assert ck.tensor_order() == ["a.w", "a.b"]
    ck.close()


def test_a_foreign_stray_safetensors_file_is_not_judged(tmp_path):
    folder, _ = _folder(tmp_path, GROUPS[:2], max_bytes=64)
    open(os.path.join(folder, "adapter.safetensors"), "wb").write(b"junk")
    CompressedCheckpoint(folder).close()
