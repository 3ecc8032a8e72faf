"""The ``quantization_config`` block of a compressed checkpoint's config.json.

``unweight compress`` writes ``{"quant_method": "unweight", "format_version": "1.0",
"encoding": ..., ...}``; every reader (the transformers quantizer, the vLLM plugin, the
offline tools) checks it here so they agree on what they accept.
"""
from __future__ import annotations

import json
import re

from . import constants as C
from .errors import InputError, VersionError


def check_format_version(version, where: str = "") -> str:
    """Return `version` (a "MAJOR.MINOR" string) when this reader knows its major version; any
    minor of a known major is accepted (FORMAT.md "Version policy").  The one rule for every
    place a checkpoint records its format version: config.json's quantization_config, each
    shard's ``unweight_format_version``, the index's ``unweight.format_version`` and the
    compress report.  VersionError naming `where` (a file) otherwise, a record that is no
    version (null, a number, "abc") included."""
    at = f"{where}: " if where else ""
    m = re.fullmatch(r"(\d+)\.(\d+)", version, re.ASCII) if isinstance(version, str) else None
    if m is None:  # shown as written in the JSON record: null, 1.0 (a number), "abc"
        shown = json.dumps(version, default=str) + (" (a number)" if type(version) in (int, float) else "")
        raise VersionError(f"{at}unsupported unweight format version {shown}: not a MAJOR.MINOR version string "
                           f"(this unweight reads {C.VERSION_MAJOR}.x)")
    major = int(m.group(1))
    if major != C.VERSION_MAJOR:
        raise VersionError(f"{at}unsupported unweight format version {version} ({version_advice(major)})")
    return version


def version_advice(major: int) -> str:
    """The end of the message for an unknown major version: a newer one needs a newer reader, an
    older one the unweight release that wrote it (this release has no reader for it)."""
    if major > C.VERSION_MAJOR:
        return f"this unweight reads {C.VERSION_MAJOR}.x; upgrade unweight to read it"
    return (f"this unweight reads {C.VERSION_MAJOR}.x and no older major; decompress the checkpoint with the "
            f"unweight release that wrote it")


def refuse_source_quantization(source_qc, where: str) -> None:
    """The transformers loader holds BF16 weights only: a checkpoint of a model quantized by
    another method before compression (``source_quantization_config``: fp8 block scales, int4
    experts, ...) holds that method's tensors as they were, which only that method's loader
    knows (vLLM's plugin hands them to it).  InputError naming the ways out."""
    if source_qc:
        method = source_qc.get("quant_method", "?") if isinstance(source_qc, dict) else "?"
        raise InputError(f"{where}: the model was quantized with {method!r} before compression; unweight's "
                         f"transformers loader holds BF16 weights only: serve it with vLLM (its {method} layers run "
                         f"as the original's), or run `unweight decompress` and load the result, which loads exactly "
                         f"as the original")
