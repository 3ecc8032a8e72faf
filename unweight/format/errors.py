"""Errors a reader or writer of the unweight format raises.

Every error carries a one-line message naming the file and tensor where known; the CLI
prints ``error: <message>`` and exits non-zero, never a traceback.
"""


class UnweightError(Exception):
    """Base class: a user-facing failure with a one-line message."""

    exit_code = 1


class FormatError(UnweightError):
    """The bytes do not follow docs/FORMAT.md (bad magic, sizes, tables, offsets)."""

    exit_code = 3


class VersionError(FormatError):
    """The file is of a format major version this reader does not know."""


class ChecksumError(FormatError):
    """Decoded bytes do not match the checksum stored at compress time."""


class DeviceFaultError(UnweightError):
    """A device kernel's output differs from the CPU codec's decode of the same intact planes."""


class InputError(UnweightError):
    """Bad arguments or source: missing paths, foreign files, unsupported inputs."""

    exit_code = 2


class MismatchError(UnweightError):
    """``verify --against`` found a tensor that differs from the original."""

    exit_code = 4
