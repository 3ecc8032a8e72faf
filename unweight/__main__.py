"""The ``unweight`` command's entry point (also ``python -m unweight``).

Installs the Ctrl-C / SIGTERM handling (unweight/_signals.py) before importing click, numpy
or the codec, so an interrupt during those start-up imports also ends with one line and exit
status 130, never a traceback.  Only what the interpreter has already loaded is imported at
module level.
"""
import sys


def main(argv=None) -> int:
    try:
        from . import _signals
        _signals.install()
        from .cli import run
        return run(argv)
    except KeyboardInterrupt:
        from . import _signals
        return _signals.say_interrupted()


if __name__ == "__main__":
    sys.exit(main())
