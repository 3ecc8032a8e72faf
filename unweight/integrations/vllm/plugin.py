"""vLLM general plugin of unweight (entry point group ``vllm.general_plugins``).

vLLM calls :func:`register` in every process it starts (API server, engine core, each
worker, spawned or forked), so it must be cheap and safe to call more than once.  It makes
``quant_method: "unweight"`` in a checkpoint's config.json select unweight's quantization
method (weights kept compressed per rank) and adds ``--load-format unweight`` (decode to
BF16 at load).
"""
from __future__ import annotations

import logging

# a child of vLLM's logger, so the lines show up in every vLLM process with vLLM's formatting
log = logging.getLogger("vllm.unweight")

_DONE = False


def register() -> None:
    """Register the "unweight" quantization config, load format and torch ops with vLLM."""
    global _DONE
    if _DONE:
        return
    try:
        import vllm  # noqa: F401
    except ImportError:  # the entry point can only fire inside vLLM; be quiet elsewhere
        log.debug("vllm not importable; unweight vLLM plugin not registered")
        return
    from . import loader, ops, quant  # noqa: F401  (registration happens at import)
    _DONE = True
    log.debug("unweight vLLM plugin registered")
