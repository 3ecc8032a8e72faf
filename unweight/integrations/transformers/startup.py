"""The interpreter-startup half of the transformers hook (the other half is hook.py).

An install writes this file's code into ``unweight-transformers.pth`` at the root of
site-packages (setup.py, ``build_py``), and Python runs it at every interpreter start. It puts
one finder at the front of ``sys.meta_path`` that waits for ``transformers.quantizers.auto``.
When that module is imported, the finder hands over to hook.py, which registers the
"unweight" quant method once the module has executed.

Why at startup: transformers ignores a quant method it does not know. It warns and then loads
the model with every compressed weight left at its random initial value. So in a process that
never ran ``import unweight``, ``AutoModelForCausalLM.from_pretrained(compressed)`` would give
a wrong model. That process could be lm-eval's ``--model hf``, a serving script or a notebook.
With the finder in place, the same call loads the original model, or fails with one line.

Because this runs in every Python process of the environment, it imports nothing beyond
``os`` and ``sys`` (both already loaded by then). Each import not yet in ``sys.modules``
costs one string comparison. ``UNWEIGHT_TRANSFORMERS_HOOK=0`` turns it off.
"""
import os as _os
import sys as _sys


class _UnweightTransformersHook:
    unweight_hook = True  # hook.install() looks for this, so an import unweight adds no second finder

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.quantizers.auto":
            return None
        try:
            from unweight.integrations.transformers.hook import startup_find_spec
        except Exception:  # noqa: BLE001 - a broken unweight must not break importing transformers
            # Stay in sys.meta_path: removing this finder while the import machinery walks the
            # list would make it skip the next finder, the one that finds transformers.
            return None
        return startup_find_spec(self, name)


if _os.environ.get("UNWEIGHT_TRANSFORMERS_HOOK", "1") != "0" and not any(
        getattr(f, "unweight_hook", False) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _UnweightTransformersHook())
