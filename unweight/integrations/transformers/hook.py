"""Register with transformers without importing it from ``import unweight``.

``import unweight`` must stay cheap (no torch, no transformers), yet
``AutoModelForCausalLM.from_pretrained(compressed)`` after ``import unweight`` must find the
"unweight" quant method.  install():
  * transformers' quantizer registry already imported -> register now;
  * transformers installed but not imported -> a sys.meta_path finder waits for
    ``transformers.quantizers.auto`` to finish executing, then registers (so the first
    from_pretrained, which imports that module, sees us);
  * transformers not installed -> nothing.
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


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    if _TARGET in sys.modules:
        _register()
        return
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    try:
        if importlib.util.find_spec("transformers") is None:
            return
    except (ImportError, ValueError):
        return
    sys.meta_path.insert(0, _Finder())
