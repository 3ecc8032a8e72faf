"""unweight: lossless BF16 weight compression with GPU decode inside the matmul.

Public API (see README and docs/FORMAT.md):
    unweight.compress(src, dst, ...)       -> report dict
    unweight.decompress(src, dst, ...)     -> report dict
    unweight.verify(path, against=None)    -> report dict (raises on any difference)
    unweight.inspect(path)                 -> report dict
    unweight.load(path, device, mode)      -> transformers model, weights kept compressed
"""
import logging

from ._version import __version__
from .format.constants import FORMAT_VERSION
from .format.errors import ChecksumError, FormatError, InputError, MismatchError, UnweightError, VersionError

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name):
    # Lazy so that ``import unweight`` stays cheap and never touches torch or CUDA.
    if name in ("compress", "decompress", "verify", "inspect"):
        from . import api
        return getattr(api, name)
    if name == "load":
        from .integrations.transformers.load import load
        return load
    raise AttributeError(name)


# Registers the "unweight" quant method with transformers when (and only when) transformers'
# quantizer registry gets imported; costs nothing here (stdlib import hook, see
# integrations/transformers/hook.py).
try:
    from .integrations.transformers import hook as _hf_hook
    _hf_hook.install()
except Exception:  # noqa: BLE001 - never let the integration break the offline tools
    logging.getLogger(__name__).debug("transformers hook not installed", exc_info=True)


__all__ = ["__version__", "compress", "decompress", "verify", "inspect", "load", "FORMAT_VERSION", "UnweightError",
           "FormatError", "VersionError", "ChecksumError", "InputError", "MismatchError"]
