"""unweight: lossless BF16 weight compression with GPU decode inside the matmul.

Public API (see README and docs/FORMAT.md):
    unweight.compress(src, dst, ...)       -> report dict
    unweight.decompress(src, dst, ...)     -> report dict
    unweight.verify(path, against=None)    -> report dict (raises on any difference)
    unweight.inspect(path)                 -> report dict
"""
import logging

from .format.constants import FORMAT_VERSION
from .format.errors import ChecksumError, FormatError, InputError, MismatchError, UnweightError, VersionError

__version__ = "0.1.0"
logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name):
    # Lazy so that ``import unweight`` stays cheap and never touches torch or CUDA.
    if name in ("compress", "decompress", "verify", "inspect"):
        from . import api
        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["compress", "decompress", "verify", "inspect", "FORMAT_VERSION", "UnweightError", "FormatError",
           "VersionError", "ChecksumError", "InputError", "MismatchError"]
