"""The ``quantization_config`` block of a compressed checkpoint's config.json.

``unweight compress`` writes ``{"quant_method": "unweight", "format_version": "1.0",
"encoding": ..., ...}``; every reader (the transformers quantizer, the vLLM plugin, the
offline tools) checks it here so they agree on what they accept.
"""
from __future__ import annotations

from . import constants as C
from .errors import VersionError


def check_format_version(version) -> str:
    """Return the version string, or raise VersionError when its major version is not ours."""
    version = str(version)
    if version.split(".")[0] != str(C.VERSION_MAJOR):
        raise VersionError(f"unsupported unweight format version {version} (this unweight reads "
                           f"{C.VERSION_MAJOR}.x; upgrade unweight)")
    return version
