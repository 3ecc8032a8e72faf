"""Runtime modes of a compressed model (stdlib only, so the offline tools can name them).

    "huffman" / "palette": weights stay encoded on the device (a checkpoint in the other
        encoding is transcoded at load) and are decoded per forward.
    "dense": decoded once at load into ordinary nn.Linear / nn.Embedding weights.
    "auto": dense where the memory allows it, compressed otherwise (runtime/prepare.py).

Plane orders of the palette matmul weights a compressed mode keeps: "file" (as stored),
"tiled" (tile-major, ops/layout.py; runtime/prepare.py), or "auto" (the default: per weight,
whichever order the dispatch table measured faster on its device; file order where nothing
was measured, and always on CPU).
"""
from __future__ import annotations

from ..format.errors import InputError

MODES = ("auto", "huffman", "palette", "dense")


def check_mode(mode: str) -> str:
    """Return mode, or raise InputError naming the choices."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    return mode


PLANE_ORDERS = ("auto", "file", "tiled")


def check_plane_order(order: str, error: type = InputError) -> str:
    """Return order, or raise `error` (InputError for user input) naming the choices."""
    if order not in PLANE_ORDERS:
        raise error(f"plane_order {order!r} is not a plane order: choose {', '.join(PLANE_ORDERS)}")
    return order


def sharded_mode(mode: str, stored_encoding: str) -> str:
    """The mode a tensor-parallel shard runs in: "auto" keeps the stored encoding (loading a
    shard at all means memory is what matters), any other mode as asked."""
    check_mode(mode)
    return stored_encoding if mode == "auto" else mode
