"""Compress / decompress / verify / inspect through the Python API on synthetic checkpoints."""
import errno
import json
import os

import numpy as np
import pytest

import unweight
from unweight.format import constants as C
from unweight.format.errors import ChecksumError, FormatError, InputError, MismatchError

from .conftest import bf16_gaussian, write_checkpoint


def _tensors_of(folder):
    from safetensors.numpy import load_file  # noqa: F401 - numpy lacks bf16; use torch
    import torch
    from safetensors.torch import load_file as load_pt
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            for k, v in load_pt(os.path.join(folder, f)).items():
                out[k] = (str(v.dtype), tuple(v.shape), v.contiguous().view(torch.uint8).numpy().tobytes())
    return out


@pytest.mark.parametrize("encoding", ["huffman", "palette", "auto"])
def test_round_trip_is_byte_identical(tiny_model, tmp_path, encoding):
    src, _ = tiny_model
    r = unweight.compress(src, str(tmp_path / "c"), encoding=encoding, progress=False)
    assert r["verified"] and r["encoded_tensors"] == 4
    assert r["passthrough_dtypes"] == ["F32", "I64"]
    cfg = json.load(open(tmp_path / "c" / "config.json"))
    assert cfg["quantization_config"]["quant_method"] == "unweight"
    assert cfg["quantization_config"]["format_version"] == C.FORMAT_VERSION
    for f in ("tokenizer.json", "generation_config.json", "README.md", C.REPORT_NAME, C.INDEX_NAME):
        assert (tmp_path / "c" / f).exists(), f
    unweight.verify(str(tmp_path / "c"))
    unweight.verify(str(tmp_path / "c"), against=src)
    unweight.decompress(str(tmp_path / "c"), str(tmp_path / "d"), progress=False)
    assert _tensors_of(src) == _tensors_of(str(tmp_path / "d"))
    cfg = json.load(open(tmp_path / "d" / "config.json"))
    assert "quantization_config" not in cfg


def test_single_file_source_and_sharding(tiny_model, tmp_path):
    src, _ = tiny_model
    r = unweight.compress(os.path.join(src, "model.safetensors"), str(tmp_path / "c"), max_shard_size="200KB",
                          progress=False)
    assert len(r["files"]) > 1
    idx = json.load(open(tmp_path / "c" / C.INDEX_NAME))
    # All planes of one tensor live in one shard.
    by_base = {}
    for name, f in idx["weight_map"].items():
        by_base.setdefault(name.split("__")[0], set()).add(f)
    assert all(len(v) == 1 for v in by_base.values())
    unweight.verify(str(tmp_path / "c"), against=os.path.join(src, "model.safetensors"))
    # Decompressing into shards: each shard's header is written before its data.
    unweight.decompress(str(tmp_path / "c"), str(tmp_path / "d"), max_shard_size="200KB", progress=False)
    idx = json.load(open(tmp_path / "d" / C.INDEX_NAME))
    assert len(set(idx["weight_map"].values())) > 1
    assert _tensors_of(src) == _tensors_of(str(tmp_path / "d"))


def test_include_exclude(tiny_model, tmp_path):
    src, _ = tiny_model
    r = unweight.compress(src, str(tmp_path / "c"), include=["*mlp*"], exclude=["*down_proj*"], progress=False)
    enc = [t["name"] for t in r["tensors"] if t["encoding"] != "raw"]
    assert enc == ["model.layers.0.mlp.up_proj.weight"]


def test_inspect_reports_every_tensor(tiny_model, tmp_path):
    src, tensors = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    r = unweight.inspect(str(tmp_path / "c"))
    names = [t["name"] for t in r["tensors"]]
    assert sorted(names) == sorted(tensors)
    enc = [t for t in r["tensors"] if t["encoding"] != "raw"]
    assert all(0 < t["exp_entropy"] < 8 and 0 < t["palette_coverage"] <= 1 and 0 <= t["verbatim_fraction"] <= 1
               for t in enc)


def test_dst_exists_needs_overwrite(tiny_model, tmp_path):
    src, _ = tiny_model
    dst = tmp_path / "c"
    dst.mkdir()
    (dst / "keep").write_text("x")
    with pytest.raises(InputError, match="--overwrite"):
        unweight.compress(src, str(dst), progress=False)
    assert (dst / "keep").read_text() == "x"
    unweight.compress(src, str(dst), overwrite=True, progress=False)
    assert not (dst / "keep").exists()


def test_src_equal_or_inside_dst_is_refused(tiny_model):
    src, _ = tiny_model
    with pytest.raises(InputError, match="overlap"):
        unweight.compress(src, src, overwrite=True, progress=False)
    with pytest.raises(InputError, match="overlap"):
        unweight.compress(src, os.path.join(src, "out"), progress=False)


def test_empty_model_is_refused(tmp_path):
    folder = write_checkpoint(str(tmp_path / "e"), {})
    with pytest.raises(InputError, match="empty"):
        unweight.compress(folder, str(tmp_path / "c"), progress=False)


def test_model_without_bf16_is_refused(tmp_path):
    # A copy at ratio 1.0 is not what compress was asked for; a cast to BF16 would not be lossless.
    rng = np.random.default_rng(0)
    folder = write_checkpoint(str(tmp_path / "f"), {"w": ("F32", rng.standard_normal((128, 128), dtype=np.float32)),
                                                    "h": ("F16", np.zeros((64, 64), np.float16))})
    with pytest.raises(InputError) as e:
        unweight.compress(folder, str(tmp_path / "c"), progress=False)
    assert str(e.value) == (f"{folder}: no BF16 tensor to compress (dtypes: F16, F32); unweight codes the exponents "
                            "of BF16 weights, and a cast to BF16 is not lossless")
    assert not os.path.exists(tmp_path / "c")


def test_mixed_dtypes_pass_through_beside_bf16(tmp_path):
    rng = np.random.default_rng(0)
    f = (rng.standard_normal((128, 128), dtype=np.float32) * 0.02).view(np.uint32)
    folder = write_checkpoint(str(tmp_path / "f"), {"w": ("F32", rng.standard_normal((128, 128), dtype=np.float32)),
                                                    "b": ("BF16", (f >> 16).astype(np.uint16))})
    r = unweight.compress(folder, str(tmp_path / "c"), progress=False)
    assert r["encoded_tensors"] == 1 and r["passthrough_dtypes"] == ["F32"]
    unweight.verify(str(tmp_path / "c"), against=folder)


@pytest.mark.parametrize("fname,kind", [("pytorch_model.bin", "PyTorch pickle"), ("model.gguf", "GGUF"),
                                        ("tf_model.h5", "Keras/TF HDF5")])
def test_folder_of_other_weight_formats_is_refused_by_name(tmp_path, fname, kind):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / fname).write_bytes(b"\0" * 16)
    with pytest.raises(InputError) as e:
        unweight.compress(str(src), str(tmp_path / "c"), progress=False)
    assert str(e.value) == (f"{src}: its weights are {fname} ({kind}), not safetensors; unweight reads safetensors "
                            "checkpoints (transformers' save_pretrained writes them)")


def test_inputs_are_never_modified(tiny_model, tmp_path):
    import hashlib
    src, _ = tiny_model
    before = {f: hashlib.sha256(open(os.path.join(src, f), "rb").read()).hexdigest() for f in os.listdir(src)}
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    unweight.decompress(str(tmp_path / "c"), str(tmp_path / "d"), progress=False)
    after = {f: hashlib.sha256(open(os.path.join(src, f), "rb").read()).hexdigest() for f in os.listdir(src)}
    assert before == after


def test_disk_full_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    from unweight.format import safetensors_io

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(safetensors_io.ShardWriter, "add", full)
    with pytest.raises(InputError, match="no space left"):
        unweight.compress(tiny_model[0], str(tmp_path / "c"), progress=False)
    assert os.listdir(tmp_path) == ["src"]


def test_disk_full_during_decompress_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    # Decompress writes shards header-first (planned sizes); a failure mid-write must still
    # leave no output and no temporary file behind.
    from unweight.format import safetensors_io
    unweight.compress(tiny_model[0], str(tmp_path / "c"), progress=False)
    real_add = safetensors_io.ShardWriter.add
    calls = {"n": 0}

    def full_later(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_add(self, *a, **k)
    monkeypatch.setattr(safetensors_io.ShardWriter, "add", full_later)
    with pytest.raises(InputError, match="no space left"):
        unweight.decompress(str(tmp_path / "c"), str(tmp_path / "d"), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["c", "src"]


def _corrupt_copy(tmp_path, src, mutate):
    import shutil
    out = tmp_path / "bad"
    shutil.copytree(src, out)
    mutate(out)
    return str(out)


def _flip_byte_of_plane(folder, plane_suffix, delta=1):
    from unweight.format.safetensors_io import SafetensorsFile
    path = os.path.join(folder, "model.safetensors")
    f = SafetensorsFile(path)
    name = next(n for n in f.names() if n.endswith(plane_suffix))
    _, _, b, e = f.info(name)
    pos = f.data_start + b + (e - b) // 2
    f.close()
    with open(path, "r+b") as fh:
        fh.seek(pos)
        v = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([(v + delta) & 0xFF]))


@pytest.mark.parametrize("suffix,err", [("__sm", ChecksumError), ("__exp", FormatError), ("__hdr", FormatError)])
def test_bit_flips_are_caught(tiny_model, tmp_path, suffix, err):
    src, _ = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    bad = _corrupt_copy(tmp_path, str(tmp_path / "c"), lambda d: _flip_byte_of_plane(str(d), suffix))
    with pytest.raises(err):
        unweight.verify(bad)
    with pytest.raises(FormatError):
        unweight.decompress(bad, str(tmp_path / "d"), progress=False)
    assert not (tmp_path / "d").exists()


def test_truncated_and_foreign_and_missing(tiny_model, tmp_path):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c, progress=False)

    def trunc(d):
        p = d / "model.safetensors"
        p.write_bytes(p.read_bytes()[:-1000])
    with pytest.raises(FormatError, match="truncated"):
        unweight.verify(_corrupt_copy(tmp_path, c, trunc))
    import shutil
    shutil.rmtree(tmp_path / "bad")
    # A plain checkpoint is not an unweight one.
    with pytest.raises(InputError, match="not an unweight checkpoint"):
        unweight.verify(src)
    # An index entry whose shard lacks the tensor.
    def extra_entry(d):
        idx = json.load(open(d / C.INDEX_NAME))
        idx["weight_map"]["ghost.weight"] = "model.safetensors"
        json.dump(idx, open(d / C.INDEX_NAME, "w"))
    with pytest.raises(FormatError, match="ghost.weight"):
        unweight.verify(_corrupt_copy(tmp_path, c, extra_entry))
    shutil.rmtree(tmp_path / "bad")
    def missing_shard(d):
        idx = json.load(open(d / C.INDEX_NAME))
        idx["weight_map"]["x"] = "model-00002-of-00002.safetensors"
        json.dump(idx, open(d / C.INDEX_NAME, "w"))
    with pytest.raises(InputError, match="missing"):
        unweight.verify(_corrupt_copy(tmp_path, c, missing_shard))


def test_wrong_version_is_refused_by_name(tiny_model, tmp_path):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c, progress=False)
    cfg = json.load(open(os.path.join(c, "config.json")))
    cfg["quantization_config"]["format_version"] = "2.0"
    json.dump(cfg, open(os.path.join(c, "config.json"), "w"))
    with pytest.raises(unweight.VersionError, match="2.0"):
        unweight.verify(c)


def test_verify_against_detects_a_difference(tiny_model, tmp_path):
    src, tensors = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    changed = dict(tensors)
    arr = tensors["model.layers.0.mlp.down_proj.weight"][1].copy()
    arr[5, 7] ^= 1
    changed["model.layers.0.mlp.down_proj.weight"] = ("BF16", arr)
    other = write_checkpoint(str(tmp_path / "other"), changed)
    with pytest.raises(MismatchError, match="down_proj"):
        unweight.verify(str(tmp_path / "c"), against=other)


def test_hub_id_offline_gives_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import importlib

    import huggingface_hub.constants as hc
    importlib.reload(hc)
    with pytest.raises(InputError, match="HF_HUB_OFFLINE|not in the local cache|cannot"):
        unweight.compress("someorg/somemodel", str(tmp_path / "c"), progress=False)


def test_reserved_suffix_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    folder = write_checkpoint(str(tmp_path / "r"), {"x__sm": ("BF16", bf16_gaussian(rng, (64, 64)))})
    with pytest.raises(InputError, match="reserved"):
        unweight.compress(folder, str(tmp_path / "c"), progress=False)


@pytest.mark.parametrize("as_file", [False, True])
def test_compressing_a_compressed_checkpoint_is_refused_by_name(tiny_model, tmp_path, as_file):
    c = str(tmp_path / "c")
    unweight.compress(tiny_model[0], c, progress=False)
    src = os.path.join(c, next(f for f in os.listdir(c) if f.endswith(".safetensors"))) if as_file else c
    with pytest.raises(InputError) as e:
        unweight.compress(src, str(tmp_path / "again"), progress=False)
    assert str(e.value).startswith(f"{src} is already an unweight checkpoint")
    assert not os.path.exists(tmp_path / "again")


# ------------------------------------------------------------------ damage every reader must refuse


def _raw_tensor_span(folder, name):
    """(shard path, absolute file offset, nbytes) of a stored tensor."""
    from unweight.format.checkpoint import CompressedCheckpoint
    ck = CompressedCheckpoint(folder)
    f = ck.where[name]
    _, _, b, e = f.info(name)
    out = (f.path, f.data_start + b, e - b)
    ck.close()
    return out


def _refused_everywhere(bad, tmp_path, err, match):
    """verify, inspect and decompress all raise `err` (exactly) and decompress writes nothing."""
    for call in (lambda: unweight.verify(bad), lambda: unweight.inspect(bad),
                 lambda: unweight.decompress(bad, str(tmp_path / "d"), progress=False)):
        with pytest.raises(err, match=match) as e:
            call()
        assert type(e.value) is err and "\n" not in str(e.value)
    assert not (tmp_path / "d").exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".d.")]


def test_raw_tensor_bit_flip_is_caught_by_every_command(tiny_model, tmp_path):
    src, _ = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)

    def flip(d):
        path, pos, _ = _raw_tensor_span(str(d), "model.f32_proj.weight")
        with open(path, "r+b") as fh:
            fh.seek(pos + 5)
            v = fh.read(1)[0]
            fh.seek(pos + 5)
            fh.write(bytes([v ^ 0x01]))
    bad = _corrupt_copy(tmp_path, str(tmp_path / "c"), flip)
    _refused_everywhere(bad, tmp_path, ChecksumError, "model.f32_proj.weight")
    with pytest.raises(ChecksumError, match="f32_proj"):
        unweight.verify(bad, against=src)


def _rewrite_header(path, change):
    """Rewrite a shard's safetensors header through change(header dict); data unchanged."""
    import struct
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def test_overlapping_raw_tensor_is_refused(tiny_model, tmp_path):
    # The position ids' offsets moved onto the norm's bytes (sizes kept): without the overlap
    # check decompress would write the norm's bytes as position ids.
    src, _ = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)

    def overlap(d):
        path = os.path.join(str(d), "model.safetensors")

        def change(h):
            b = h["model.norm.weight"]["data_offsets"][0]
            n = h["model.position_ids"]["data_offsets"][1] - h["model.position_ids"]["data_offsets"][0]
            h["model.position_ids"]["data_offsets"] = [b, b + n]
        _rewrite_header(path, change)
    bad = _corrupt_copy(tmp_path, str(tmp_path / "c"), overlap)
    _refused_everywhere(bad, tmp_path, FormatError, "overlaps")


def _two_shards(tiny_model, tmp_path):
    src, _ = tiny_model
    c = str(tmp_path / "c")
    r = unweight.compress(src, c, max_shard_size="60KB", progress=False)
    assert len(r["files"]) >= 2
    return c, r["files"]


def _drop_shard_from_index(d, shard, records=True):
    idx = json.load(open(d / C.INDEX_NAME))
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v != shard}
    if not records:  # an index as older writers wrote it: no shard list, no tensor count
        idx["metadata"]["unweight"] = {"format_version": C.FORMAT_VERSION}
    json.dump(idx, open(d / C.INDEX_NAME, "w"))


@pytest.mark.parametrize("records", [True, False])
def test_index_that_lost_a_shard_is_refused(tiny_model, tmp_path, records):
    c, files = _two_shards(tiny_model, tmp_path)
    unweight.verify(c)
    bad = _corrupt_copy(tmp_path, c, lambda d: _drop_shard_from_index(d, files[-1], records))
    _refused_everywhere(bad, tmp_path, FormatError, files[-1])


def test_index_records_are_written(tiny_model, tmp_path):
    c, files = _two_shards(tiny_model, tmp_path)
    idx = json.load(open(os.path.join(c, C.INDEX_NAME)))
    rec = idx["metadata"]["unweight"]
    assert rec == {"format_version": C.FORMAT_VERSION, "shards": files, "stored_tensors": len(idx["weight_map"])}
    assert idx["metadata"]["total_size"] == sum(os.path.getsize(os.path.join(c, f)) for f in files)


def test_records_that_disagree_are_refused(tiny_model, tmp_path):
    import shutil
    c, files = _two_shards(tiny_model, tmp_path)

    def edit(fname, change):
        def f(d):
            p = d / fname
            v = json.load(open(p))
            change(v)
            json.dump(v, open(p, "w"))
        return f

    cases = [
        (C.INDEX_NAME, lambda v: v["metadata"]["unweight"].update(stored_tensors=3), "records 3"),
        (C.INDEX_NAME, lambda v: v["weight_map"].pop("model.norm.weight"), r"lists \d+ tensors.*records \d+"),
        (C.INDEX_NAME, lambda v: (v["weight_map"].pop("model.norm.weight"),
                                  v["metadata"]["unweight"].update(stored_tensors=len(v["weight_map"]))), "'model.norm.weight'"),
        (C.INDEX_NAME, lambda v: v["metadata"].update(total_size=5), "total_size"),
        (C.INDEX_NAME, lambda v: v["metadata"]["unweight"].update(shards=files[:1]), "does not record"),
        (C.REPORT_NAME, lambda v: v.update(raw_tensors=v["raw_tensors"] + 1), "raw_tensors"),
        (C.REPORT_NAME, lambda v: v.update(files=files[:1]), "files"),
    ]
    for fname, change, match in cases:
        bad = _corrupt_copy(tmp_path, c, edit(fname, change))
        _refused_everywhere(bad, tmp_path, FormatError, match)
        shutil.rmtree(bad)


def test_raw_checksum_records_must_match_the_shard(tiny_model, tmp_path):
    import shutil
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c, progress=False)
    path = "model.safetensors"

    def drop(h):
        crcs = json.loads(h["__metadata__"]["unweight_crc32"])
        del crcs["model.norm.weight"]
        h["__metadata__"]["unweight_crc32"] = json.dumps(crcs)

    def ghost(h):
        crcs = json.loads(h["__metadata__"]["unweight_crc32"])
        crcs["ghost"] = 1
        h["__metadata__"]["unweight_crc32"] = json.dumps(crcs)

    for change, match in ((drop, "'model.norm.weight'.*no stored checksum"), (ghost, "'ghost'")):
        def mutate(d):
            _rewrite_header(str(d / path), change)
            # keep the size records true, so the checksum record is the only defect
            size = os.path.getsize(d / path)
            for fname, key in ((C.INDEX_NAME, None), (C.REPORT_NAME, "output_bytes")):
                v = json.load(open(d / fname))
                if key:
                    v[key] = size
                else:
                    v["metadata"]["total_size"] = size
                json.dump(v, open(d / fname, "w"))
        bad = _corrupt_copy(tmp_path, c, mutate)
        _refused_everywhere(bad, tmp_path, FormatError, match)
        shutil.rmtree(bad)


def test_old_index_without_records_still_reads(tiny_model, tmp_path):
    c, files = _two_shards(tiny_model, tmp_path)

    def old(d):
        idx = json.load(open(d / C.INDEX_NAME))
        idx["metadata"]["unweight"] = {"format_version": C.FORMAT_VERSION}
        json.dump(idx, open(d / C.INDEX_NAME, "w"))
        os.unlink(d / C.REPORT_NAME)
    bad = _corrupt_copy(tmp_path, c, old)
    unweight.verify(bad)
    unweight.inspect(bad)
    unweight.decompress(bad, str(tmp_path / "d"), progress=False)
    assert _tensors_of(tiny_model[0]) == _tensors_of(str(tmp_path / "d"))


def test_verify_report_counts(tiny_model, tmp_path):
    src, tensors = tiny_model
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    r = unweight.verify(str(tmp_path / "c"))
    assert r["encoded_checked"] == 4 and r["raw_checked"] == len(tensors) - 4
    assert r["tensors_checked"] == len(tensors) and r["decoded"] is True


def test_one_version_everywhere(tiny_model, tmp_path):
    from importlib.metadata import version

    from unweight._version import __version__
    r = unweight.compress(tiny_model[0], str(tmp_path / "c"), progress=False)
    cfg = json.load(open(tmp_path / "c" / "config.json"))
    assert r["tool_version"] == cfg["quantization_config"]["tool_version"] == unweight.__version__ == __version__
    assert version("unweight") == __version__  # pyproject.toml reads unweight/_version.py


# ------------------------------------------------------------------ argument checking


def test_path_like_arguments_are_accepted(tiny_model, tmp_path):
    from pathlib import Path
    src, _ = tiny_model
    r = unweight.compress(Path(src), tmp_path / "c", progress=False)
    assert r["source"] == src  # the report is JSON: a str, not the Path given
    assert json.load(open(tmp_path / "c" / C.REPORT_NAME))["source"] == src
    f = Path(src) / "model.safetensors"
    unweight.compress(f, tmp_path / "c1", progress=False)
    assert unweight.verify(tmp_path / "c", against=f)["mode"] == "against"
    assert unweight.verify(tmp_path / "c1", against=Path(src))["ok"]
    unweight.decompress(tmp_path / "c", tmp_path / "d", progress=False)
    assert unweight.inspect(tmp_path / "c")["path"] == str(tmp_path / "c")
    assert _tensors_of(src) == _tensors_of(str(tmp_path / "d"))


@pytest.mark.parametrize("call,what,got", [
    (lambda d: unweight.compress(None, d, progress=False), "src", "NoneType"),
    (lambda d: unweight.compress(5, d, progress=False), "src", "int"),
    (lambda d: unweight.compress(b"src", d, progress=False), "src", "bytes"),
    (lambda d: unweight.compress("smollm2-135m", None, progress=False), "dst", "NoneType"),
    (lambda d: unweight.decompress(None, d, progress=False), "src", "NoneType"),
    (lambda d: unweight.decompress(d, 3.5, progress=False), "dst", "float"),
    (lambda d: unweight.verify(None), "path", "NoneType"),
    (lambda d: unweight.verify(d, against=5), "against", "int"),
    (lambda d: unweight.inspect(None), "path", "NoneType"),
])
def test_non_path_arguments_are_refused_by_name(tmp_path, call, what, got):
    with pytest.raises(InputError) as e:
        call(str(tmp_path / "d"))
    assert str(e.value) == f"{what} must be a path, got {got}"
    assert os.listdir(tmp_path) == []


def test_empty_dst_is_refused(tiny_model, tmp_path, monkeypatch):
    # "" is the current folder to abspath: with overwrite it would be replaced.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="dst is an empty path"):
        unweight.compress(tiny_model[0], "", overwrite=True, progress=False)
    assert os.listdir(tmp_path) == ["src"]


@pytest.mark.parametrize("jobs", [1.5, "2", -1, 0, True])
def test_jobs_must_be_an_int_of_at_least_one(tiny_model, tmp_path, jobs):
    src, _ = tiny_model
    d = str(tmp_path / "c")
    for call in (lambda: unweight.compress(src, d, jobs=jobs, progress=False),
                 lambda: unweight.decompress(src, d, jobs=jobs, progress=False),
                 lambda: unweight.verify(src, jobs=jobs), lambda: unweight.inspect(src, jobs=jobs)):
        with pytest.raises(InputError, match=r"^jobs must be an int >= 1 \(or None for all cores\), got "):
            call()
    assert not os.path.exists(d)


def test_jobs_is_the_thread_count_reported(tiny_model, tmp_path):
    r = unweight.compress(tiny_model[0], str(tmp_path / "c"), jobs=np.int64(2), progress=False)
    assert r["jobs"] == 2 and type(r["jobs"]) is int


def test_parse_size():
    from unweight.api import parse_size
    for s, n in (("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("1.5GiB", 3 * 2**29), ("1.1GB", 11 * 10**8),
                 (" 2 kib ", 2048), ("7b", 7), ("1", 1), (".5KB", 500), (123, 123), (1e9, 10**9),
                 (np.int64(9), 9)):
        assert parse_size(s) == n, s
    for s in (".", "1..2GB", "5iB", "1e3", "-1", "", "GB", None, True, b"5GB", [5]):
        with pytest.raises(InputError, match=r"^bad max_shard_size .*: use e\.g\. 5GB or 500MB$"):
            parse_size(s)
    for s in ("1.5", 1.5, float("inf"), float("nan")):
        with pytest.raises(InputError, match="a number of bytes is a whole number"):
            parse_size(s)
    for s in ("0", 0, -1, "0.0001KB", 0.0):
        with pytest.raises(InputError, match="max_shard_size must be at least 1 byte"):
            parse_size(s)


@pytest.mark.parametrize("size", [".", "1..2GB", "0", 0, -1, 1.5])
def test_bad_max_shard_size_is_refused(tiny_model, tmp_path, size):
    src, _ = tiny_model
    with pytest.raises(InputError, match="max_shard_size"):
        unweight.compress(src, str(tmp_path / "c"), max_shard_size=size, progress=False)
    unweight.compress(src, str(tmp_path / "c"), progress=False)
    with pytest.raises(InputError, match="max_shard_size"):
        unweight.decompress(str(tmp_path / "c"), str(tmp_path / "d"), max_shard_size=size, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["c", "src"]


def test_include_exclude_take_one_glob_as_a_str(tiny_model, tmp_path):
    src, _ = tiny_model
    r = unweight.compress(src, str(tmp_path / "c"), include="*embed*", progress=False)
    assert [t["name"] for t in r["tensors"] if t["encoding"] != "raw"] == ["model.embed_tokens.weight"]
    r = unweight.compress(src, str(tmp_path / "c2"), include=("*mlp*",), exclude="*down_proj*", progress=False)
    assert [t["name"] for t in r["tensors"] if t["encoding"] != "raw"] == ["model.layers.0.mlp.up_proj.weight"]
    # a generator is read once, not exhausted by the first tensor
    r = unweight.compress(src, str(tmp_path / "c3"), include=(p for p in ["*mlp*"]), progress=False)
    assert r["encoded_tensors"] == 2


@pytest.mark.parametrize("kw,match", [
    ({"include": ["*mlp*", 1]}, r"^include patterns must be str, got int \(1\)$"),
    ({"exclude": [None]}, r"^exclude patterns must be str, got NoneType"),
    ({"include": 3}, r"^include must be a glob or a list of globs, got int$"),
])
def test_include_exclude_refuse_non_str(tiny_model, tmp_path, kw, match):
    with pytest.raises(InputError, match=match):
        unweight.compress(tiny_model[0], str(tmp_path / "c"), progress=False, **kw)


@pytest.mark.parametrize("seg", [0, -5, 1.5, "8192", True])
def test_segment_weights_must_be_an_int_of_at_least_one(tiny_model, tmp_path, seg):
    with pytest.raises(InputError, match=r"^segment_weights must be an int >= 1, got "):
        unweight.compress(tiny_model[0], str(tmp_path / "c"), segment_weights=seg, progress=False)
    assert not (tmp_path / "c").exists()


def test_revision_of_a_local_source_is_refused(tiny_model, tmp_path):
    with pytest.raises(InputError, match="revision .* applies to hub ids only"):
        unweight.compress(tiny_model[0], str(tmp_path / "c"), revision="main", progress=False)
    assert not (tmp_path / "c").exists()


def test_index_with_palette_is_refused_and_kept_with_auto(tiny_model, tmp_path):
    src, _ = tiny_model
    with pytest.raises(InputError, match="index of huffman tensors.*palette"):
        unweight.compress(src, str(tmp_path / "p"), encoding="palette", index=True, progress=False)
    assert not (tmp_path / "p").exists()
    r = unweight.compress(src, str(tmp_path / "a"), encoding="auto", index=True, progress=False)
    idx = json.load(open(tmp_path / "a" / C.INDEX_NAME))["weight_map"]
    huff = [t["name"] for t in r["tensors"] if t["encoding"] == "huffman"]
    assert huff and all(n + C.SUFFIX_CHK in idx for n in huff)


def test_verify_against_a_compressed_checkpoint_is_refused(tiny_model, tmp_path):
    src, _ = tiny_model
    c, c2 = str(tmp_path / "c"), str(tmp_path / "c2")
    unweight.compress(src, c, progress=False)
    unweight.compress(src, c2, encoding="palette", progress=False)
    for against in (c2, c, os.path.join(c2, "model.safetensors")):  # folder; itself; a lone shard
        with pytest.raises(InputError) as e:
            unweight.verify(c, against=against)
        assert str(e.value) == (f"--against {against} is a compressed checkpoint: it must be the original, "
                                "uncompressed one")
    assert unweight.verify(c, against=os.path.join(src, "model.safetensors"))["ok"]


# --------------------------------------------------------------------------- tune

def test_tune_shapes_are_the_encoded_matrices_and_their_tp_blocks(tiny_model, tmp_path):
    """tune_shapes: each encoded tensor's [rows, cols]; with tp, also every rank's row block
    and column block where the axis splits tp ways (on the segment grid or not)."""
    from unweight.api import tune_shapes
    from unweight.format.checkpoint import CompressedCheckpoint
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c)
    ck = CompressedCheckpoint(c)
    try:
        headers = [ck.header(b) for b in ck.encoded]
    finally:
        ck.close()
    whole = sorted({(h.rows, h.cols) for h in headers})
    assert tune_shapes(c) == whole and len(whole) >= 3
    split = set(tune_shapes(c, tp=2))
    want = set(whole)
    for h in headers:
        want |= {(h.rows // 2, h.cols)} if h.rows % 2 == 0 else set()
        want |= {(h.rows, h.cols // 2)} if h.cols % 2 == 0 else set()
    assert split == want and split > set(whole)
    assert {(h.rows, h.cols // 16) for h in headers if h.cols % 16 == 0} <= set(tune_shapes(c, tp=16))
    with pytest.raises(InputError, match="no such file or folder"):
        tune_shapes(str(tmp_path / "missing"))


def test_tune_shapes_add_the_stacked_siblings(llama_ck):
    """A set of sibling projections (runtime/stacking.py) adds its stacked shape: the tiny
    Llama's gate and up ([128, 64] each) as [256, 64], with tp=2 too (each rank's [64, 64]
    blocks stacked are [128, 64], gate's own shape); its k and v are too small to be
    compressed, so there is no q/k/v stack."""
    from unweight.api import tune_shapes
    from unweight.runtime.stacking import sibling_tensors
    _, ck = llama_ck
    assert sibling_tensors(["a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight", "b.gate_proj.weight",
                            "up_proj.weight", "gate_proj.weight", "c.k_proj.weight"]) == [
        ["gate_proj.weight", "up_proj.weight"], ["a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight"]]
    shapes = tune_shapes(ck["palette"])
    assert (256, 64) in shapes and (96, 64) not in shapes
    assert {(256, 64), (128, 64)} <= set(tune_shapes(ck["palette"], tp=2))


def test_tune_shapes_add_the_blocks_vllm_holds_llama4_stacks_as(tmp_path):
    """Llama 4's expert stacks (gate_up_proj [E, H, 2I], down_proj [E, I, H]): beside the
    stored per-expert matrices, the transposed blocks vLLM holds and looks up (gate and up
    [I / tp, H], down [H, I / tp]), at tp 1 and per rank, and whole at any tp (expert
    parallelism)."""
    from tests.conftest import bf16_gaussian, write_checkpoint
    from unweight.api import tune_shapes
    rng = np.random.default_rng(0)
    E, H, inter = 2, 256, 512
    src = write_checkpoint(str(tmp_path / "src"), {
        "model.layers.0.feed_forward.experts.gate_up_proj": ("BF16", bf16_gaussian(rng, (E, H, 2 * inter))),
        "model.layers.0.feed_forward.experts.down_proj": ("BF16", bf16_gaussian(rng, (E, inter, H)))})
    c = str(tmp_path / "c")
    unweight.compress(src, c, progress=False)
    assert {(H, 2 * inter), (inter, H), (H, inter)} <= set(tune_shapes(c))
    assert {(inter // 4, H), (H, inter // 4), (inter, H), (H, inter)} <= set(tune_shapes(c, tp=4))


def test_tune_shapes_split_experts_over_the_data_parallel_ranks(tmp_path):
    """dp > 1: a MoE's experts (per-expert tensors and Llama 4's stacks) also get their blocks
    split over tp * dp ranks, as vLLM holds them under data parallelism without expert
    parallelism; other layers only their tp blocks."""
    from tests.conftest import bf16_gaussian, write_checkpoint
    from unweight.api import tune_shapes
    rng = np.random.default_rng(0)
    H, inter = 256, 512
    src = write_checkpoint(str(tmp_path / "src"), {
        "model.layers.0.mlp.experts.0.gate_proj.weight": ("BF16", bf16_gaussian(rng, (inter, H))),
        "model.layers.0.mlp.experts.0.down_proj.weight": ("BF16", bf16_gaussian(rng, (H, inter))),
        "model.layers.0.self_attn.o_proj.weight": ("BF16", bf16_gaussian(rng, (H, 3 * H))),
        "model.layers.1.feed_forward.experts.gate_up_proj": ("BF16", bf16_gaussian(rng, (2, H, 2 * inter))),
        "model.layers.1.feed_forward.experts.down_proj": ("BF16", bf16_gaussian(rng, (2, inter, H)))})
    c = str(tmp_path / "c")
    unweight.compress(src, c, progress=False)
    tp2, dp2 = set(tune_shapes(c, tp=2)), set(tune_shapes(c, tp=2, dp=2))
    quarter = {(inter // 4, H), (H, inter // 4)}  # (gate and down per expert, and the stacks' transposed blocks)
    assert not quarter & tp2 and quarter <= dp2 and tp2 <= dp2
    assert {(H // 2, 3 * H), (H, 3 * H // 2)} <= tp2  # (o_proj: its tp blocks only)
    assert (H // 4, 3 * H) not in dp2 and (H, 3 * H // 4) not in dp2
    dp_only = set(tune_shapes(c, dp=2))
    assert dp_only >= set(tune_shapes(c)) | {(inter // 2, H), (H, inter // 2)} and (H // 2, 3 * H) not in dp_only


def test_tune_refuses_without_a_cuda_gpu(tiny_model, tmp_path, monkeypatch):
    """Off a CUDA GPU, tune stops before timing anything with one InputError; bad options too."""
    torch = pytest.importorskip("torch")
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c)
    cache = tmp_path / "cache.json"
    with pytest.raises(InputError, match="CUDA GPU"):
        unweight.api.tune(c, device="cpu", cache=str(cache))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="CUDA GPU"):
        unweight.api.tune(c, cache=str(cache))
    with pytest.raises(InputError, match="unknown encoding"):
        unweight.api.tune(c, encodings=("fp8",))
    for bad in ({"tp": 0}, {"dp": 0}):
        with pytest.raises(InputError, match="tp and dp must be at least 1"):
            unweight.api.tune(c, **bad)
    assert not cache.exists()


def test_selftest_refuses_without_a_cuda_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match="CUDA GPU, not on cpu"):
        unweight.api.selftest(device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="CUDA GPU, and none is visible"):
        unweight.api.selftest()


@pytest.mark.cuda
def test_selftest_on_the_gpu_passes():
    """Every kernel a load checks passes on this GPU (the CRC-32 kernel, the fused paths the
    shipped table picks here, the row gathers, the expert slots)."""
    torch = pytest.importorskip("torch")
    from unweight import ops
    if not torch.cuda.is_available() or not ops.cuda_kernels_built():
        pytest.skip("needs a CUDA GPU and unweight._cuda")
    r = unweight.api.selftest()
    assert r["passed"], r
    assert r["row_gathers"] == {"palette": True, "huffman": True} and r["expert_slots"] == {"decode": True,
                                                                                            "gemv": True}


@pytest.mark.cuda
def test_tune_on_the_gpu_records_every_shape(tiny_model, tmp_path):
    """On a CUDA GPU: every encoded shape gets a path at the bucket asked for, in both
    encodings, and a decoder choice; the cache holds them."""
    torch = pytest.importorskip("torch")
    from unweight import ops
    if not torch.cuda.is_available() or not ops.cuda_kernels_built():
        pytest.skip("needs a CUDA GPU and unweight._cuda")
    from unweight.runtime.tuning_table import TuningTable
    src, _ = tiny_model
    c = str(tmp_path / "c")
    unweight.compress(src, c)
    cache = str(tmp_path / "cache.json")
    r = unweight.api.tune(c, buckets=["1"], iters=3, cache=cache)
    shapes = {tuple(s) for s in r["shapes"]}
    assert {(p["N"], p["K"], p["encoding"]) for p in r["paths"]} == {(n, k, e) for n, k in shapes
                                                                      for e in ("palette", "huffman")}
    assert {p["bucket"] for p in r["paths"]} == {"1"}
    assert {(d["N"], d["K"]) for d in r["decoders"]} == shapes
    t = TuningTable.load(cache)
    assert len(t.entries) == len(r["paths"]) and len(t.decoders) == len(r["decoders"])
