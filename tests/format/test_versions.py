"""Every record of the format version (config.json's quantization_config, each shard's
``unweight_format_version``, the index's ``unweight.format_version``) is checked with one rule
(FORMAT.md "Version policy"), and a numbered shard set read without an index must be whole."""
import json
import logging
import os

import numpy as np
import pytest

from unweight.format import constants as C
from unweight.format.checkpoint import Checkpoint, CompressedCheckpoint, check_numbered_shards
from unweight.format.errors import FormatError, InputError, VersionError
from unweight.format.quant_config import check_format_version
from unweight.format.shards import ShardSet, write_index

HDR = np.zeros(64, np.uint8)  # a stand-in header plane: nothing here parses it
GROUPS = [[("a.w" + C.SUFFIX_HDR, HDR), ("a.w" + C.SUFFIX_SM, np.ones((4, 4), np.uint8))],
          [("a.b", np.arange(4, dtype=np.float32))]]
QC = {"quant_method": C.QUANT_METHOD, "format_version": C.FORMAT_VERSION}


def _folder(tmp_path, *, shard_version=C.FORMAT_VERSION, index_version=C.FORMAT_VERSION, config=None,
            name="ck", max_bytes=64):
    """A compressed checkpoint (one shard per group) whose version records are the given ones;
    config None: a config.json with QC; returns (folder, shard names)."""
    d = tmp_path / name
    d.mkdir()
    s = ShardSet(str(d), max_bytes, {"format": "pt", "unweight_format_version": shard_version}, crc_meta=True)
    for g in GROUPS:
        s.add_group([(n, {1: "U8", 4: "F32"}[a.itemsize], a.shape, a) for n, a in g],
                    raw_crc=(g[0][0], 0) if "__" not in g[0][0] else None)
    files = s.finish()
    write_index(str(d), s.weight_map, s.file_sizes, {"format_version": index_version})
    (d / "config.json").write_text(json.dumps({"quantization_config": QC} if config is None else config))
    return str(d), files


@pytest.mark.parametrize("version", ["1.0", "1.2", "1.99", f"{C.VERSION_MAJOR}.7"])
def test_any_minor_of_a_known_major_is_accepted(version):
    assert check_format_version(version, "f") == version


@pytest.mark.parametrize("version", ["2.0", "9.9", "10.1"])
def test_a_newer_major_says_upgrade(version):
    with pytest.raises(VersionError, match=rf"^f: unsupported unweight format version {version} \(this unweight reads "
                                           rf"1\.x; upgrade unweight to read it\)$"):
        check_format_version(version, "f")


def test_an_older_major_does_not_say_upgrade():
    with pytest.raises(VersionError) as e:
        check_format_version("0.9", "f")
    msg = str(e.value)
    assert "0.9" in msg and "upgrade" not in msg and "with the unweight release that wrote it" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("version", [None, 1.0, 1, "1", "", "abc", "1.x", " 1.0", "1.0.0", "-1.0"])
def test_a_record_that_is_no_version_is_refused(version):
    with pytest.raises(VersionError, match="not a MAJOR.MINOR version"):
        check_format_version(version, "f")


@pytest.mark.parametrize("where", ["shard", "index", "config"])
@pytest.mark.parametrize("version", ["2.0", "9.9", "0.9", "x"])
def test_each_record_is_checked_on_open(tmp_path, where, version):
    kw = {"shard": {"shard_version": version}, "index": {"index_version": version},
          "config": {"config": {"quantization_config": dict(QC, format_version=version)}}}[where]
    folder, files = _folder(tmp_path, **kw)
    named = {"shard": os.path.join(folder, files[0]), "index": C.INDEX_NAME, "config": "config.json"}[where]
    with pytest.raises(VersionError, match=rf"{named}.*unsupported unweight format version"):
        CompressedCheckpoint(folder)


@pytest.mark.parametrize("version", ["2.0", "0.9"])
def test_a_lone_shard_is_checked_without_config_or_index(tmp_path, version):
    folder, files = _folder(tmp_path, shard_version=version)
    for f in files:  # the raw-only shard as well as the one with planes
        with pytest.raises(VersionError, match=rf"unsupported unweight format version {version}"):
            CompressedCheckpoint(os.path.join(folder, f))


def test_a_newer_minor_everywhere_opens(tmp_path):
    minor = f"{C.VERSION_MAJOR}.{C.VERSION_MINOR + 1}"
    folder, files = _folder(tmp_path, shard_version=minor, index_version=minor,
                            config={"quantization_config": dict(QC, format_version=minor)})
    CompressedCheckpoint(folder).close()


def test_a_null_config_version_is_refused(tmp_path):
    folder, _ = _folder(tmp_path, config={"quantization_config": dict(QC, format_version=None)})
    with pytest.raises(VersionError, match=r"config\.json \(quantization_config\): unsupported unweight format "
                                           r"version null"):
        CompressedCheckpoint(folder)


def test_config_without_its_version_or_without_quantization_config_opens(tmp_path, caplog):
    # The shards and tensor headers carry the version (checked above); config.json's entry is
    # what a loader selects unweight by, so its absence is logged, not refused.
    folder, _ = _folder(tmp_path, config={"quantization_config": {"quant_method": C.QUANT_METHOD}}, name="a")
    CompressedCheckpoint(folder).close()
    folder, _ = _folder(tmp_path, config={"model_type": "toy"}, name="b")
    with caplog.at_level(logging.WARNING, logger="unweight.format.checkpoint"):
        CompressedCheckpoint(folder).close()
    assert "has no quantization_config" in caplog.text


def test_config_that_is_not_an_object_is_refused(tmp_path):
    folder, _ = _folder(tmp_path, config={"quantization_config": "unweight"}, name="a")
    with pytest.raises(FormatError, match="quantization_config is not a JSON object"):
        CompressedCheckpoint(folder)
    folder, _ = _folder(tmp_path, config=[1], name="b")
    with pytest.raises(FormatError, match="config.json: not a JSON object"):
        CompressedCheckpoint(folder)


def test_versions_are_checked_before_the_planes(tmp_path):
    # A future major may lay planes out differently: its version error comes first.
    folder, files = _folder(tmp_path, shard_version="2.0")
    os.unlink(os.path.join(folder, C.INDEX_NAME))
    with pytest.raises(VersionError):
        CompressedCheckpoint(folder)


# ------------------------------------------------------------------ numbered shard sets


@pytest.mark.parametrize("compressed", [True, False])
def test_a_lost_numbered_shard_is_refused_without_index(tmp_path, compressed):
    folder, files = _folder(tmp_path)
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    os.unlink(os.path.join(folder, C.INDEX_NAME))
    (Checkpoint if not compressed else CompressedCheckpoint)(folder).close()  # whole: fine
    os.unlink(os.path.join(folder, files[1]))
    with pytest.raises(InputError, match=rf"shard {files[1]} is missing") as e:
        (CompressedCheckpoint if compressed else Checkpoint)(folder)
    assert "\n" not in str(e.value)


def test_numbered_shard_rules():
    check_numbered_shards("d", [])
    check_numbered_shards("d", ["model.safetensors", "adapter.safetensors", "x-1-of-1.safetensors"])
    check_numbered_shards("d", ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                "other-00001-of-00001.safetensors"])
    for files, lost in ((["model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"],
                         "model-00001-of-00003.safetensors"),
                        (["model-00001-of-00002.safetensors", "other-1-of-2.safetensors", "other-2-of-2.safetensors",
                          "model-00001-of-00003.safetensors"], "model-00002-of-00002.safetensors"),
                        (["a-01-of-12.safetensors"], "a-02-of-12.safetensors")):
        with pytest.raises(InputError, match=rf"shard {lost} is missing"):
            check_numbered_shards("d", files)
