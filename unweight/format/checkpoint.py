"""Checkpoint folders: reading a source checkpoint (one or many safetensors files) and a
compressed one (planes grouped back into encoded tensors)."""
from __future__ import annotations

import json
import os

import numpy as np

from . import constants as C
from .errors import FormatError, InputError
from .header import TensorHeader
from .safetensors_io import SafetensorsFile


def list_weight_files(folder: str) -> list[str]:
    """Safetensors files of a folder, in index order when an index exists."""
    idx = os.path.join(folder, C.INDEX_NAME)
    if os.path.exists(idx):
        try:
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            raise FormatError(f"{idx}: corrupt index (no weight_map)") from None
        files = list(dict.fromkeys(wm.values()))
        missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
        if missing:
            raise InputError(f"{folder}: shard {missing[0]} named in {C.INDEX_NAME} is missing")
        return [os.path.join(folder, f) for f in files]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    return [os.path.join(folder, f) for f in files]


class Checkpoint:
    """All tensors of a checkpoint folder or file: name -> (file, entry)."""

    def __init__(self, path: str):
        self.path = path
        if os.path.isdir(path):
            self.folder = path
            self.files = [SafetensorsFile(p) for p in list_weight_files(path)]
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
        if not self.folder:
            return
        idx = os.path.join(self.folder, C.INDEX_NAME)
        if not os.path.exists(idx):
            return
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        for name, fname in wm.items():
            if name not in self.where:
                raise FormatError(f"{idx}: tensor {name!r} listed for {fname} is not in that shard")

    def names(self) -> list[str]:
        return list(self.where)

    def info(self, name):
        return self.where[name].info(name)

    def array(self, name) -> np.ndarray:
        return self.where[name].array(name)

    def release(self, name):
        """Let the OS drop the pages of a tensor we are done with (see SafetensorsFile.release)."""
        self.where[name].release(name)

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
        self.encoded = {}  # base name -> {suffix: stored name}
        self.raw = []
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
        cfg = self.config()
        qc = (cfg or {}).get("quantization_config") or {}
        if self.folder and cfg is not None and qc.get("quant_method") not in (None, C.QUANT_METHOD):
            raise InputError(f"{path}: config.json says quant_method={qc.get('quant_method')!r}, not an unweight checkpoint")
        if qc.get("format_version"):
            major = str(qc["format_version"]).split(".")[0]
            if major != str(C.VERSION_MAJOR):
                from .errors import VersionError
                raise VersionError(f"{path}: unsupported unweight format version {qc['format_version']} "
                                   f"(this reader knows {C.VERSION_MAJOR}.x; upgrade unweight)")
        if not self.encoded:
            for f in self.files:
                if f.metadata.get("unweight_format_version"):
                    break
            else:
                raise InputError(f"{path}: not an unweight checkpoint (no encoded tensors and no unweight metadata)")

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
        out = {}
        for f in self.files:
            s = f.metadata.get("unweight_crc32")
            if s:
                try:
                    out.update(json.loads(s))
                except ValueError:
                    raise FormatError(f"{f.path}: corrupt unweight_crc32 metadata") from None
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
