"""Register the "unweight" quant method with transformers as soon as its quantizer registry exists.

``AutoModelForCausalLM.from_pretrained(compressed)`` must find the "unweight" quant method.
Without it, transformers warns about an unknown method and returns a randomly initialised
model. Registration waits for ``transformers.quantizers.auto`` to finish executing, so that the
first from_pretrained, which imports that module, already sees us. transformers is never
imported on our behalf. Two things arm the wait:

  * startup.py, installed as ``unweight-transformers.pth``: at interpreter start, in every
    process, whether or not it imports unweight. Its finder calls startup_find_spec below.
  * install(), from ``import unweight``, for a tree used without installing it (a checkout on
    PYTHONPATH). It registers at once when the registry is already imported, arms a finder
    when transformers is installed but not yet imported, and does nothing when transformers
    is absent or the startup finder is already waiting.

Any failure while registering is logged, never raised: unweight's own tools do not need it.
Stdlib only.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

log = logging.getLogger(__name__)

_TARGET = "transformers.quantizers.auto"


def _register():
    mod = sys.modules.get(__package__ + ".quantizer")
    if mod is not None and not hasattr(mod, "register"):
        # quantizer.py is itself importing the registry (the import that brought us here):
        # a registration now would import a half-initialised module; it registers at its end.
        return
    try:
        from .quantizer import register
        register()
    except Exception as e:  # noqa: BLE001 - a broken transformers must not break `import unweight`
        log.warning("unweight: could not register with transformers (%s: %s); use unweight.load", type(e).__name__, e)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _register()

    def __getattr__(self, name):
        # get_source, is_package, resource readers...: what inspect and linecache ask of
        # the module's loader stays the original loader's answer.
        return getattr(self.inner, name)


def _wrapped_spec(finder, fullname):
    # One shot: the finder leaves sys.meta_path before the lookup below, which would otherwise
    # come back to it. The spec returned ends the import machinery's walk over that list, so
    # the removal cannot make it skip a finder.
    sys.meta_path[:] = [f for f in sys.meta_path if f is not finder]
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
        spec.loader = _Loader(spec.loader)
    return spec


def startup_find_spec(finder, fullname: str):
    """The startup finder's hand-over (startup.py): the spec of ``fullname`` (the registry
    module), with a loader that registers after executing it."""
    return _wrapped_spec(finder, fullname)


class _Finder(importlib.abc.MetaPathFinder):
    unweight_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        return _wrapped_spec(self, fullname)


def install():
    if _TARGET in sys.modules:
        _register()
        return
    if any(getattr(f, "unweight_hook", False) for f in sys.meta_path):
        return
    try:
        if importlib.util.find_spec("transformers") is None:
            return
    except (ImportError, ValueError):
        return
    sys.meta_path.insert(0, _Finder())
