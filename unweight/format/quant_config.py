"""The ``quantization_config`` block of a compressed checkpoint's config.json.

``unweight compress`` writes ``{"quant_method": "unweight", "format_version": "1.0",
"encoding": ..., ...}``; every reader (the transformers quantizer, the vLLM plugin, the
offline tools) checks it here so they agree on what they accept.
"""
from __future__ import annotations

from . import constants as C
from .errors import InputError, VersionError


def check_format_version(version) -> str:
    """Return the version string, or raise VersionError when its major version is not ours."""
    version = str(version)
    if version.split(".")[0] != str(C.VERSION_MAJOR):
        raise VersionError(f"unsupported unweight format version {version} (this unweight reads "
                           f"{C.VERSION_MAJOR}.x; upgrade unweight)")
    return version


def refuse_source_quantization(source_qc, where: str) -> None:
    """Runtimes serve BF16 weights: a checkpoint of a model quantized by another method before
    compression (``source_quantization_config``: fp8 block scales, ...) holds that method's
    tensors as they were, which only that method's loader knows.  InputError naming the way out."""
    if source_qc:
        method = source_qc.get("quant_method", "?") if isinstance(source_qc, dict) else "?"
        raise InputError(f"{where}: the model was quantized with {method!r} before compression; unweight runtimes "
                         f"serve BF16 weights only: run `unweight decompress` and load the result, which loads "
                         f"exactly as the original")
