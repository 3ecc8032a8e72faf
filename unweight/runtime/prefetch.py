"""Weights into L2 ahead of their matmul, while the kernels between two matmuls run.

At a decode step's small batch the GPU's memory is busy only during the matmuls: between two
of them run the norms, the rotary embedding, attention over a short cache, the residual adds
and the activation, kernels that read little.  On the fourth H200 run's 4-layer model at
batch 1 they take about 105 us of each layer's ~235 us step.  L2Prefetch uses that time: after
each compressed matmul's launch it starts, on a side stream, an L2 prefetch of the weight the
next matmul reads (ops.prefetch_l2: its sm and idx planes, when they fit in a share of L2),
so that matmul's loads wait on L2 rather than DRAM.

* The order of the matmuls is the model's first forward's (calls recorded between the model's
  forward pre- and post-hooks); a later forward that calls them in another order prefetches
  nothing from the first difference on.  A stacked sibling group (runtime/siblings.py) is one
  matmul, keyed by its group.
* The side stream waits for an event recorded after the matmul, so a prefetch starts once the
  matmul it follows is issued; the prefetches run one after another, and the model's
  post-hook makes the current stream wait for the last, so a forward captured in a CUDA graph
  forks and joins the side stream inside the capture.
* A prefetch reads and writes nothing the model uses: it cannot change a result, only how long
  the next matmul waits for its bytes.
* Not inside a torch.compile trace (the recorded order is Python state).
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn

from .. import ops
from .siblings import SiblingGroup

log = logging.getLogger("unweight")

__all__ = ["L2Prefetch", "attach", "detach", "weight_planes"]

# The share of the device's L2 a prefetched weight may take: a larger one would evict its own
# first lines before the matmul reads them.
L2_SHARE = 0.8


def weight_planes(key) -> list:
    """The planes a matmul keyed by `key` streams: a palette weight's sm and idx (a stacked
    group's stack, a module's own), a plain nn.Linear's weight (a BF16 model's, for a
    benchmark's like-for-like reference); [] for anything else (a huffman weight decodes into
    the scratch first, so its planes are not what the matmul reads)."""
    if isinstance(key, nn.Linear) and not hasattr(key, "encoded"):
        return [key.weight.detach()] if key.weight.is_cuda and key.weight.is_contiguous() else []
    w = key.w if isinstance(key, SiblingGroup) else key.encoded()
    if w.is_huffman or w.idx is None:
        return []
    return [w.sm, w.idx]


class L2Prefetch:
    """The prefetcher of one model on one CUDA device (see the module docstring).

    budget: the largest weight (bytes of its planes) it prefetches; launch(planes) and the
    stream handling are methods so a test can follow the calls without a GPU."""

    def __init__(self, device, budget: int):
        self.device = torch.device(device)
        self.budget = int(budget)
        self.order = None  # [key] of the first forward's matmuls, in call order
        self._trace = []
        self._active = False  # between the model's pre- and post-hook
        self._pos = 0
        self._ok = True
        self._pending = False  # a prefetch was issued in this forward: the post-hook joins it
        self._stream = None
        self._last = None
        self.issued = 0  # prefetches issued (a count for tests and reports)

    # -------------------------------------------------------------- model hooks
    def start(self, *args) -> None:
        self._active, self._pos, self._ok = True, 0, True
        if self.order is None:
            self._trace = []

    def end(self, *args) -> None:
        if not self._active:
            return
        self._active = False
        if self.order is None and self._trace:
            self.order = list(self._trace)
            self._trace = []
        if self._pending:
            self._join()
            self._pending = False

    # -------------------------------------------------------------- matmul hook
    def after(self, key) -> None:
        """Called right after the matmul keyed by `key` was launched on the current stream."""
        if not self._active or torch.compiler.is_compiling():
            return
        if self.order is None:
            self._trace.append(key)
            return
        if not self._ok or self._pos >= len(self.order) or self.order[self._pos] is not key:
            self._ok = False  # another order than the first forward's: nothing more this forward
            return
        self._pos += 1
        if self._pos < len(self.order):
            planes = weight_planes(self.order[self._pos])
            if planes and sum(t.numel() * t.element_size() for t in planes) <= self.budget:
                self._launch(planes)
                self._pending = True
                self.issued += 1

    # -------------------------------------------------------------- device work
    def _launch(self, planes: list) -> None:
        cur = torch.cuda.current_stream(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        ev = torch.cuda.Event()
        ev.record(cur)
        self._stream.wait_event(ev)  # after the matmul it follows (and, in a capture, inside it)
        with torch.cuda.stream(self._stream):
            ops.run.prefetch_l2(planes)
        self._last = torch.cuda.Event()
        self._last.record(self._stream)

    def _join(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self._last)


def attach(model: nn.Module, modules: list, device, budget: int | None = None) -> L2Prefetch:
    """An L2Prefetch for `model`'s compressed matmul `modules` on CUDA `device`: hooks on the
    model's forward, and each module told to report its matmuls to it (modules.py).  budget:
    the largest weight to prefetch (default: L2_SHARE of the device's L2)."""
    detach(model)
    dev = torch.device(device)
    if budget is None:
        budget = int(L2_SHARE * torch.cuda.get_device_properties(dev).L2_cache_size)
    pf = L2Prefetch(dev, budget)
    pf._stream = torch.cuda.Stream(dev)  # made here, not inside a forward a CUDA graph captures
    handles = [model.register_forward_pre_hook(pf.start), model.register_forward_hook(pf.end)]
    model.__dict__["_uw_l2_prefetch"] = (pf, handles, list(modules))
    for m in modules:
        m.__dict__["_uw_prefetch"] = pf
    return pf


def detach(model: nn.Module) -> None:
    """Remove the model's L2Prefetch, if it has one."""
    held = model.__dict__.pop("_uw_l2_prefetch", None)
    if held is None:
        return
    _, handles, modules = held
    for h in handles:
        h.remove()
    for m in modules:
        m.__dict__.pop("_uw_prefetch", None)
