"""Test-run shim (tests/integrations/vllm_runner.py puts this folder on PYTHONPATH of the
processes it starts, and so of the vLLM workers they spawn): vLLM's full garbage
collections, taken as young-generation ones.

vLLM calls ``gc.collect()`` seven or eight times while it builds and tears down an engine (to
free device memory before it measures it, and after shutdown).  In a process that has
imported torch, transformers and vLLM each full collection walks the whole heap: about 0.33 s
on a 2-CPU CI machine, ~2.7 s of the ~3 s a tiny TP=1 test engine takes from start to
teardown.  Here a full collection collects generations 0 and 1 only, which holds the objects
created since the last collection; the runner takes one real full collection after each
configuration (``FULL_COLLECT``), so an engine's cycles do not pile up across the
configurations a runner process serves one after another.  Nothing else changes: no object is
kept alive that the real collection would free for good, only later.

Being first on the path, this module is the ``sitecustomize`` Python imports at startup, so it
runs the one it shadows (a distribution's or a virtual environment's, found later on sys.path)
as that would have run without it.
"""
import gc
import importlib.machinery
import importlib.util
import os
import sys

FULL_COLLECT = gc.collect


def _young_collect(generation: int = 2) -> int:
    return FULL_COLLECT(min(generation, 1))


gc.collect = _young_collect


def _run_shadowed() -> None:
    """Execute the next ``sitecustomize`` on sys.path after this folder, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    shadowed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shadowed)


_run_shadowed()
