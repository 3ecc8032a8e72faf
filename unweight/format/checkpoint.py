"""Checkpoint folders: reading a source checkpoint (one or many safetensors files) and a
compressed one (planes grouped back into encoded tensors)."""
from __future__ import annotations

import json
import logging
import os
import re

import numpy as np

from . import constants as C
from .errors import FormatError, InputError, UnweightError
from .header import TensorHeader
from .quant_config import check_format_version
from .safetensors_io import SafetensorsFile
from .staging import WEIGHT_FORMATS

log = logging.getLogger(__name__)

# The shard names save_pretrained (and ``unweight compress``) give: model-00001-of-00003.safetensors.
_NUMBERED = re.compile(r"(.+)-(\d+)-of-(\d+)\.safetensors")


def read_index(folder: str) -> dict | None:
    """The folder's INDEX_NAME as {"metadata": dict, "weight_map": {tensor: file}}, or None
    when there is none; FormatError when it is not that shape."""
    idx = os.path.join(folder, C.INDEX_NAME)
    if not os.path.exists(idx):
        return None
    try:
        with open(idx) as f:
            d = json.load(f)
        wm, meta = d["weight_map"], d.get("metadata") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise FormatError(f"{idx}: corrupt index (no weight_map)") from None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()) \
            or not isinstance(meta, dict):
        raise FormatError(f"{idx}: corrupt index (weight_map must map tensor names to file names)")
    for fname in set(wm.values()):
        # A shard name is a file of this folder, never a path out of it.
        if os.path.basename(fname) != fname or fname in (".", ".."):
            raise FormatError(f"{idx}: shard name {fname!r} is not a file name")
    return {"metadata": meta, "weight_map": wm}


def list_weight_files(folder: str, index: dict | None = None) -> list[str]:
    """Safetensors files of a folder, in index order when an index exists."""
    index = index if index is not None else read_index(folder)
    if index is not None:
        files = list(dict.fromkeys(index["weight_map"].values()))
        missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
        if missing:
            raise InputError(f"{folder}: shard {missing[0]} named in {C.INDEX_NAME} is missing")
        return [os.path.join(folder, f) for f in files]
    names = os.listdir(folder)
    files = sorted(f for f in names if f.endswith(".safetensors"))
    if not files:
        refuse_foreign_weights(folder, names)
    check_numbered_shards(folder, files)
    return [os.path.join(folder, f) for f in files]


def refuse_foreign_weights(folder: str, names: list[str]) -> None:
    """InputError when a folder without safetensors holds weights in another serialisation
    (pytorch_model.bin, GGUF, ...): unweight reads safetensors only.  Pickles are not loaded
    here on purpose: safetensors is the hub's standard, and reading a pickle needs torch and
    trust in the file."""
    foreign = sorted(f for f in names if os.path.splitext(f)[1] in WEIGHT_FORMATS and not f.startswith("."))
    if foreign:
        kind = WEIGHT_FORMATS[os.path.splitext(foreign[0])[1]]
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise InputError(f"{folder}: its weights are {foreign[0]}{more} ({kind}), not safetensors; unweight reads "
                         "safetensors checkpoints (transformers' save_pretrained writes them)")


def check_numbered_shards(folder: str, files: list[str]) -> None:
    """InputError naming the first missing shard when files (names in folder, read without an
    index) hold some of a numbered set "<prefix>-<i>-of-<n>.safetensors" but not all n: without
    an index their names are the one record of the set, and the rest would read as a whole."""
    sets = {}
    for f in files:
        m = _NUMBERED.fullmatch(f)
        if m:
            sets.setdefault((m.group(1), m.group(3)), set()).add(int(m.group(2)))
    for (prefix, total), have in sorted(sets.items()):
        lost = [i for i in range(1, int(total) + 1) if i not in have]
        if lost:
            name = f"{prefix}-{lost[0]:0{len(total)}d}-of-{total}.safetensors"
            raise InputError(f"{folder}: shard {name} is missing ({len(lost)} of the {int(total)} numbered shards "
                             f"absent and no {C.INDEX_NAME})")


class Checkpoint:
    """All tensors of a checkpoint folder or file: name -> (file, entry)."""

    def __init__(self, path: str):
        self.path = path
        self.index = None
        if os.path.isdir(path):
            self.folder = path
            self.index = read_index(path)
            self.files = [SafetensorsFile(p) for p in list_weight_files(path, self.index)]
        elif os.path.isfile(path):
            self.folder = None
            self.files = [SafetensorsFile(path)]
        else:
            raise InputError(f"{path}: no such file or folder")
        self.where = {}
        for f in self.files:
            for n in f.names():
                if n in self.where:
                    raise FormatError(f"tensor {n!r} appears in both {self.where[n].path} and {f.path}")
                self.where[n] = f
        self._check_index()

    def _check_index(self):
        if self.index is None:
            return
        idx = os.path.join(self.folder, C.INDEX_NAME)
        for name, fname in self.index["weight_map"].items():
            if name not in self.where or os.path.basename(self.where[name].path) != fname:
                raise FormatError(f"{idx}: tensor {name!r} listed for {fname} is not in that shard")

    def names(self) -> list[str]:
        return list(self.where)

    def info(self, name):
        return self.where[name].info(name)

    def array(self, name) -> np.ndarray:
        return self.where[name].array(name)

    def release(self, name, lo: int = 0, hi: int | None = None):
        """Let the OS drop the pages of a tensor we are done with, or of its bytes [lo, hi)
        (see SafetensorsFile.release)."""
        self.where[name].release(name, lo, hi)

    def file_of(self, name) -> str:
        return self.where[name].path

    def config(self) -> dict | None:
        if not self.folder:
            return None
        p = os.path.join(self.folder, "config.json")
        if not os.path.exists(p):
            return None
        try:
            with open(p) as f:
                return json.load(f)
        except ValueError:
            raise FormatError(f"{p}: invalid JSON") from None

    def close(self):
        for f in self.files:
            f.close()


def _is_unweight_shard(path: str) -> bool:
    """True when path is a readable safetensors file written by unweight compress."""
    try:
        f = SafetensorsFile(path)
    except UnweightError:
        return False  # not a shard we wrote: not ours to judge
    f.close()
    return bool(f.metadata.get("unweight_format_version"))


def split_name(name: str):
    """('model.x.weight', '__sm') for a plane name, else (name, None)."""
    for suf in C.ALL_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)], suf
    return name, None


class CompressedCheckpoint(Checkpoint):
    """A checkpoint written by ``unweight compress``: encoded tensors plus raw tensors."""

    def __init__(self, path: str):
        super().__init__(path)
        self._check_versions()
        self.encoded = {}  # base name -> {suffix: stored name}
        self.raw = []
        self._raw_crcs = None
        for n in self.names():
            base, suf = split_name(n)
            if suf is None:
                self.raw.append(n)
            else:
                self.encoded.setdefault(base, {})[suf] = n
        for base, planes in self.encoded.items():
            if C.SUFFIX_HDR not in planes:
                raise FormatError(f"tensor {base!r}: plane {C.SUFFIX_HDR} is missing "
                                  f"(found {', '.join(sorted(planes))}) in {self.file_of(next(iter(planes.values())))}")
        if not self.encoded:
            for f in self.files:
                if f.metadata.get("unweight_format_version"):
                    break
            else:
                raise InputError(f"{path}: not an unweight checkpoint (no encoded tensors and no unweight metadata)")
        self._check_records()

    def _check_versions(self):
        """Refuse a foreign quant_method, then check every record of the format version (FORMAT.md
        "Version policy"): config.json's quantization_config, the index metadata's
        ``unweight.format_version`` and each shard's ``unweight_format_version``, with one rule
        (check_format_version), before any plane is read.  Each record is optional (a lone
        .safetensors file has no config or index) and the tensor headers carry their own, but
        one that is present is never skipped."""
        cfg = self.config()
        if cfg is not None and not isinstance(cfg, dict):
            raise FormatError(f"{os.path.join(self.folder, 'config.json')}: not a JSON object")
        qc = (cfg or {}).get("quantization_config")
        cfg_path = os.path.join(self.folder, "config.json") if self.folder else ""
        if qc is not None and not isinstance(qc, dict):
            raise FormatError(f"{cfg_path}: quantization_config is not a JSON object")
        qc = qc or {}
        if cfg is not None and qc.get("quant_method") not in (None, C.QUANT_METHOD):
            raise InputError(f"{self.path}: config.json says quant_method={qc.get('quant_method')!r}, not an unweight "
                             f"checkpoint")
        if "format_version" in qc:
            check_format_version(qc["format_version"], f"{cfg_path} (quantization_config)")
        if self.index is not None:
            rec = self.index["metadata"].get("unweight")
            if isinstance(rec, dict) and "format_version" in rec:
                check_format_version(rec["format_version"], f"{os.path.join(self.folder, C.INDEX_NAME)} (metadata)")
        for f in self.files:
            if "unweight_format_version" in f.metadata:
                check_format_version(f.metadata["unweight_format_version"], f.path)
        if cfg is not None and not qc and any(n.endswith(C.SUFFIX_HDR) for f in self.files for n in f.names()):
            # Readable (the shards carry the version), but a loader picks unweight from this entry.
            log.warning("unweight: %s has no quantization_config: transformers and vLLM will not load %s as an "
                        "unweight checkpoint", cfg_path, self.path)

    def _check_records(self):
        """Check the folder against its index's own records (docs/FORMAT.md, "Checkpoint
        container"): a shard whose tensors the weight map no longer names, a tensor it lost,
        a shard of another size.  Each would otherwise make every reader skip tensors
        silently: what is left still verifies."""
        if self.index is None:
            return
        idx = os.path.join(self.folder, C.INDEX_NAME)
        meta, wm = self.index["metadata"], self.index["weight_map"]
        listed = list(dict.fromkeys(wm.values()))
        rec = meta.get("unweight")
        rec = rec if isinstance(rec, dict) else {}
        shards = rec.get("shards")
        if shards is not None:
            if not isinstance(shards, list) or not all(isinstance(f, str) for f in shards):
                raise FormatError(f"{idx}: corrupt index metadata (unweight.shards must list file names)")
            lost = [f for f in shards if f not in listed]
            if lost:
                raise FormatError(f"{idx}: shard {lost[0]} is recorded in the index metadata but the weight_map "
                                  f"names none of its tensors")
            extra = [f for f in listed if f not in shards]
            if extra:
                raise FormatError(f"{idx}: the weight_map names shard {extra[0]}, which the index metadata does "
                                  f"not record")
        n = rec.get("stored_tensors")
        if n is not None and n != len(wm):
            raise FormatError(f"{idx}: the weight_map lists {len(wm)} tensors, the index metadata records {n}")
        for f in self.files:
            for name in f.names():
                if name not in wm:
                    raise FormatError(f"{idx}: tensor {name!r} of {os.path.basename(f.path)} is not in the weight_map")
        for fname in sorted(os.listdir(self.folder)):
            if fname.endswith(".safetensors") and fname not in listed and _is_unweight_shard(
                    os.path.join(self.folder, fname)):
                raise FormatError(f"{idx}: shard {fname} holds unweight tensors but the weight_map names none of "
                                  f"them")
        total = meta.get("total_size")
        if total is not None:
            got = sum(os.path.getsize(f.path) for f in self.files)
            if total != got:
                raise FormatError(f"{idx}: total_size is {total} bytes but the shards it lists hold {got}")

    def header(self, base: str) -> TensorHeader:
        planes = self.encoded[base]
        return TensorHeader.parse(self.array(planes[C.SUFFIX_HDR]), f"{base} ({self.file_of(planes[C.SUFFIX_HDR])})")

    def planes(self, base: str) -> dict:
        return {suf: self.array(n) for suf, n in self.encoded[base].items()}

    def release_encoded(self, base: str):
        for n in self.encoded[base].values():
            self.release(n)

    def location(self, base: str) -> str:
        return f"{base} ({self.file_of(self.encoded[base][C.SUFFIX_HDR])})"

    def raw_checksums(self) -> dict:
        """{raw tensor name: crc32 of its stored bytes} from every shard's unweight_crc32
        metadata.  FormatError when the metadata is corrupt or names a tensor its shard does
        not hold raw (a record that disagrees with the shard)."""
        if self._raw_crcs is not None:
            return self._raw_crcs
        out = {}
        raw = set(self.raw)
        for f in self.files:
            s = f.metadata.get("unweight_crc32")
            if not s:
                continue
            try:
                d = json.loads(s)
            except ValueError:
                d = None
            if not isinstance(d, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32
                                                  for v in d.values()):
                raise FormatError(f"{f.path}: corrupt unweight_crc32 metadata")
            for name in d:
                if name not in raw or self.where[name] is not f:
                    raise FormatError(f"{f.path}: unweight_crc32 records tensor {name!r}, which this shard does not "
                                      f"hold as a raw tensor")
            out.update(d)
        self._raw_crcs = out
        return out

    def tensor_order(self) -> list[str]:
        """Original tensor names in stored order (an encoded tensor at its header's place)."""
        seen, order = set(), []
        for n in self.names():
            base, suf = split_name(n)
            if base not in seen:
                seen.add(base)
                order.append(base)
        return order
