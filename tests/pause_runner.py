"""Run the ``unweight`` command but stop at a chosen point, so a test can signal it there.

    python -m tests.pause_runner POINT MARKER [unweight args...]

On reaching POINT the process creates the file MARKER and sleeps; the test waits for the file,
then sends its signals: no race, and nothing of this lives in the product.  Points:
    start       right after the entry point installed its signal handling
    import-cli  as unweight.cli (and click with it) is about to load
    import-api  as unweight.api (and numpy, the codec) is about to load
    compress    at the first tensor written into the staged output
"""
import importlib.abc
import importlib.util
import runpy
import sys
import time

POINT, MARKER = sys.argv[1], sys.argv[2]


def pause():
    open(MARKER, "w").close()
    # Short sleeps: a signal delivered to another thread (numpy's, the codec's) does not cut a
    # long sleep of the main thread short; its handler runs when the main thread wakes.
    for _ in range(600):
        time.sleep(0.1)


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps the loading of one module: pause before it executes, or patch it after."""

    def __init__(self, name, before=None, after=None):
        self.name, self.before, self.after, self.inner = name, before, after, None

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        self.inner, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        if self.before:
            self.before()
        self.inner.exec_module(module)
        if self.after:
            self.after(module)


def _pause_on_first_group(module):
    orig = module.ShardSet.add_group

    def add_group(self, *a, **k):
        pause()
        return orig(self, *a, **k)
    module.ShardSet.add_group = add_group


if POINT == "start":
    import unweight._signals as sig  # stdlib only, as the entry point imports it
    _install = sig.install
    sig.install = lambda: (_install(), pause())
elif POINT in ("import-cli", "import-api"):
    sys.meta_path.insert(0, _Hook("unweight." + POINT.split("-")[1], before=pause))
elif POINT == "compress":
    sys.meta_path.insert(0, _Hook("unweight.format.shards", after=_pause_on_first_group))
else:
    raise SystemExit(f"unknown point {POINT!r}")
sys.argv = ["unweight"] + sys.argv[3:]
runpy.run_module("unweight", run_name="__main__", alter_sys=True)
