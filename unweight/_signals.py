"""Ctrl-C and SIGTERM for the ``unweight`` command (stdlib only, so the entry point can install
them before it imports anything heavy).

The first SIGINT or SIGTERM raises KeyboardInterrupt wherever the command is; the output
staging (format/staging.py) then removes its temp folder (or, if the signal comes while it
renames the output into place, finishes or undoes the swap first) and the command prints one
``error: interrupted ...`` line and exits 128 + the signal number: 130 for SIGINT, 143 for
SIGTERM.  Later signals are ignored, so an impatient second Ctrl-C cannot cut that clean-up
short or print a second message.  Once the command has finished (result printed, exit status
chosen) signals are ignored too: the interpreter's own shutdown has nothing left to abort.
"""
from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd command

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_installed = False
received: int | None = None  # the first SIGINT / SIGTERM, which decides the message and status
_pending: int | None = None  # a signal that came during a __del__, for check() to act on


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _interrupt(signum, frame):
    global received, _pending
    if _in_finalizer(frame):
        # CPython swallows an exception raised in __del__ (a progress bar's, as a function
        # returns) and prints it as "Exception ignored": keep the signal for check() instead.
        _pending = _pending or signum
        return
    # Later signals go to a no-op handler, not SIG_IGN: one already delivered but not yet
    # handled would find SIG_IGN and make CPython print "Signal ignored due to race condition".
    for s in _SIGNALS:
        signal.signal(s, _ignore)
    if received is None:
        received = signum
    raise KeyboardInterrupt


def _ignore(signum, frame):
    pass


def install() -> None:
    """Route SIGINT and SIGTERM (a service manager's stop) to one clean abort; a signal the
    parent set to be ignored (e.g. SIGINT of a background job) stays ignored."""
    global _installed
    _installed = True
    for s in _SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _interrupt)


def check() -> None:
    """Raise the KeyboardInterrupt of a signal that came while a __del__ ran, if any."""
    global _pending
    if _pending is not None:
        signum, _pending = _pending, None
        _interrupt(signum, None)


def finished() -> None:
    """The command's outcome is decided and reported: ignore SIGINT and SIGTERM from here on,
    so one arriving while the interpreter shuts down (atexit callbacks, __del__ methods) cannot
    print a traceback or turn a finished run into a death by signal.  Does nothing unless
    install() ran (the API used in-process keeps its caller's handlers)."""
    if not _installed:
        return
    ours = [s for s in _SIGNALS if signal.getsignal(s) in (_interrupt, _ignore)]
    for s in ours:
        signal.signal(s, _ignore)
    # signal.signal runs the handlers of signals already delivered before it switches, so one
    # that came just now meets the no-op above, not SIG_IGN's race message.
    for s in ours:
        signal.signal(s, signal.SIG_IGN)


def interrupted_message(written: str | None = None) -> str:
    """The one line for an interrupt; `written`: the output this run had already renamed
    into place (complete) when the signal came, if any."""
    what = "terminated (SIGTERM)" if received == signal.SIGTERM else "interrupted"
    if written:
        return f"error: {what} after the output was written: {written} is complete and the source is untouched"
    return f"error: {what}; the output was not written and the source is untouched"


def say_interrupted(written: str | None = None) -> int:
    """Print the one interrupted line; returns the exit status to use (128 + the signal)."""
    sys.stderr.write(interrupted_message(written) + "\n")
    sys.stderr.flush()
    return 128 + int(received) if received is not None else EXIT_INTERRUPTED
