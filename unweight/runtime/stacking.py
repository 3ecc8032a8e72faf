"""Which projections stack (torch-free: the tuner reads it without a model).

Sibling projections are children of one parent module that read the same input; runtime/
siblings.py runs each set as one stacked palette matrix.  This module names the sets and finds
them among a checkpoint's tensor names, so the tuner can time the stacked shapes too.
"""
from __future__ import annotations

# Child names of one parent that read the same input, in the order a forward calls them:
# a Llama-style attention's q/k/v and MLP's gate/up, a BERT attention's query/key/value, and
# a Mixtral-style expert's w1/w3.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("query", "key", "value"), ("w1", "w3"))

__all__ = ["SIBLINGS", "sibling_tensors"]


def sibling_tensors(names, suffix: str = ".weight") -> list[list[str]]:
    """The sets of tensor names (parent.child + suffix) that make up a whole SIBLINGS set, in
    set order, e.g. [["m.l0.attn.q_proj.weight", "m.l0.attn.k_proj.weight", ...], ...]."""
    have = set(names)
    parents = sorted({n[: -len(suffix)].rpartition(".")[0] for n in have if n.endswith(suffix)})
    out = []
    for p in parents:
        pre = p + "." if p else ""
        for kids in SIBLINGS:
            full = [f"{pre}{k}{suffix}" for k in kids]
            if all(f in have for f in full):
                out.append(full)
    return out
