"""Writing a checkpoint's shard files and its index.

A ShardSet streams tensors into ``shard-NNNNN.tmp`` files, rolling over to a new one when the
current one would pass the size limit, and names them ``model.safetensors`` or
``model-0000i-of-0000n.safetensors`` once the count is known.  write_index writes
``model.safetensors.index.json``, with, for a compressed checkpoint, the records a reader
checks the folder against (docs/FORMAT.md, "Checkpoint container").
"""
from __future__ import annotations

import json
import os

from . import constants as C
from .safetensors_io import ShardWriter


class ShardSet:
    """Rolls over to a new shard file when the current one would pass max_shard_size."""

    def __init__(self, folder: str, max_bytes: int, metadata: dict, crc_meta: bool, plan: list | None = None,
                 header_bounds: list | None = None):
        """plan: every group's items as (name, dtype, shape, nbytes), in the order add_group
        will get them, when known up front; each shard then writes its header first (see
        ShardWriter).  header_bounds, when sizes are only known as groups arrive: [bytes] the
        header text of the shard metadata (first) and then of each group can take at most, in
        add_group order; each shard reserves room for the groups from its first on and writes
        its header there last.  crc_meta: store each shard's raw-tensor crc32s in its metadata."""
        self.folder, self.max_bytes, self.metadata, self.crc_meta = folder, max_bytes, metadata, crc_meta
        self._bounds = header_bounds
        self._groups = 0  # groups added so far
        self.shards = []  # writers, in file order
        self.weight_map = {}
        self.crcs = []
        self.total = 0
        self.file_sizes = {}
        self._plans = None
        if plan is not None:
            # The same roll-over rule as add_group, applied to the known sizes.
            self._plans, size = [[]], 0
            for group in plan:
                g = sum(int(nb) for _, _, _, nb in group)
                if size and size + g > max_bytes:
                    self._plans.append([])
                    size = 0
                self._plans[-1].extend(group)
                size += g
        self._new()

    def _new(self):
        i = len(self.shards)
        plan = self._plans[i] if self._plans is not None else None
        reserve = None
        if self._bounds is not None:  # this shard may hold every group still to come
            reserve = 2 + self._bounds[0] + sum(self._bounds[1 + self._groups:]) + 8
        w = ShardWriter(os.path.join(self.folder, f"shard-{i:05d}.tmp"), dict(self.metadata), plan, reserve)
        self.shards.append(w)
        self.crcs.append({})

    def add_group(self, items, raw_crc: tuple | None = None):
        """items: [(name, dtype, shape, array)], written to one shard together; raw_crc:
        (name, crc32) of a raw tensor among them."""
        size = sum(int(a.nbytes) for _, _, _, a in items)
        if self.shards[-1].nbytes and self.shards[-1].nbytes + size > self.max_bytes:
            self._new()
        for name, dt, shape, arr in items:
            self.shards[-1].add(name, dt, shape, arr)
            self.weight_map[name] = len(self.shards) - 1
        if raw_crc:
            self.crcs[-1][raw_crc[0]] = raw_crc[1]
        self.total += size
        self._groups += 1

    def finish(self) -> list[str]:
        """Close every shard, give it its final name; returns the names in order."""
        n = len(self.shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        sizes = []
        for w, crcs, final in zip(self.shards, self.crcs, names):
            if self.crc_meta and crcs:
                w.metadata["unweight_crc32"] = json.dumps(crcs, separators=(",", ":"))
            sizes.append(w.close())
            os.rename(w.path, os.path.join(self.folder, final))
        self.weight_map = {k: names[v] for k, v in self.weight_map.items()}
        self.file_sizes = dict(zip(names, sizes))
        return names

    def abort(self):
        for w in self.shards:
            w.abort()


def write_index(folder: str, weight_map: dict, file_sizes: dict, unweight: dict | None = None):
    """Write INDEX_NAME: total_size is the sum of the shard files' sizes.  With `unweight`
    (a compressed checkpoint), metadata["unweight"] holds it plus the records readers check:
    "shards" (every shard file, in order) and "stored_tensors" (the weight map's length)."""
    meta = {"total_size": int(sum(file_sizes.values()))}
    if unweight is not None:
        meta["unweight"] = {**unweight, "shards": list(file_sizes), "stored_tensors": len(weight_map)}
    with open(os.path.join(folder, C.INDEX_NAME), "w") as f:
        json.dump({"metadata": meta, "weight_map": weight_map}, f, indent=2)
