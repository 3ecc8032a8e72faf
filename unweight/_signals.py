"""Ctrl-C and SIGTERM for the ``unweight`` command (stdlib only, so the entry point can install
them before it imports anything heavy).

The first SIGINT or SIGTERM raises KeyboardInterrupt wherever the command is; the output
staging (format/staging.py) then removes its temp folder and the command prints one
``error: interrupted ...`` line and exits 130.  Later signals are ignored, so an impatient
second Ctrl-C cannot cut that clean-up short or print a second message.
"""
from __future__ import annotations

import signal
import sys

INTERRUPTED = "error: interrupted; the output was not written and the source is untouched"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd command


def _interrupt(signum, frame):
    # Later signals go to a no-op handler, not SIG_IGN: one already delivered but not yet
    # handled would find SIG_IGN and make CPython print "Signal ignored due to race condition".
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _ignore)
    raise KeyboardInterrupt


def _ignore(signum, frame):
    pass


def install() -> None:
    """Route SIGINT and SIGTERM (a service manager's stop) to one clean abort; a signal the
    parent set to be ignored (e.g. SIGINT of a background job) stays ignored."""
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _interrupt)


def say_interrupted() -> int:
    """Print the one interrupted line; returns the exit status to use."""
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()
    return EXIT_INTERRUPTED
