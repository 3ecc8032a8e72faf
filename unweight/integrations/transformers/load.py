"""``unweight.load``: a compressed checkpoint folder as a ready transformers model."""
from __future__ import annotations

import os

import torch

from ...format import constants as C
from ...format.checkpoint import CompressedCheckpoint
from ...format.errors import InputError
from ...runtime.modes import check_mode, check_plane_order
from ...sources import as_path
from .quantizer import register


def _model_class(config):
    import transformers
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def load(path: str, device: str | torch.device | None = None, mode: str = "auto", *, model_class=None,
         verify: bool = True, plane_order: str = "auto", merge_siblings: bool | str = "auto",
         l2_prefetch: bool = False, **from_pretrained_kwargs):
    """Load an unweight checkpoint folder as a ready transformers model.

    path: folder written by ``unweight compress`` (config.json + safetensors shards).
    device: "cuda", "cuda:1", "cpu" (default: "cuda" when available, else "cpu"), or "auto"
        / a device_map dict, passed to from_pretrained as device_map.
    mode: "auto" | "huffman" | "palette" | "dense" (runtime/prepare.py).
    model_class: the transformers class to instantiate (default: config.architectures[0]
        when transformers has it, else AutoModel).
    verify: check every encoded weight against its crc32 once placed, where it is held (a GPU
        decodes and hashes its own: runtime/verify.py; structure and raw checksums are always
        checked before placing; UNWEIGHT_VERIFY=host checks the files on the CPU instead).
    plane_order: "tiled" holds palette matmul weights tile-major in memory (the order the
        fused kernels stream; the same results: runtime/prepare.py), "file" as stored, "auto"
        (the default) each in the order the dispatch table measured faster for its shape on
        its GPU (a shape never timed: the nearest timed shape's order), file order where nothing
        applies.  Tile-major is for a GPU: on CPU every decode first puts the planes back in
        file order, which only costs.
    merge_siblings: True holds each set of sibling projections that read one input (q/k/v,
        gate/up) as one stacked palette matrix, one matmul per set (runtime/siblings.py);
        "auto" (the default) only where the dispatch table measured the stack faster than its
        members apart on this GPU (never on CPU); False never.  Palette modules only, not with
        a tensor-parallel plan.
    l2_prefetch: after each compressed matmul, prefetch the next one's weight into L2 on a
        side stream while the kernels between them run (runtime/prefetch.py; one CUDA device,
        not with a tensor-parallel plan; results unchanged).
    Returns the model in eval mode (with ``output_loading_info=True``, from_pretrained's
    (model, loading info) pair); model.unweight_info summarizes what was done.  A checkpoint
    the model cannot take whole (a stored tensor with no place, a parameter the checkpoint
    does not fill) fails with one InputError line.
    """
    check_mode(mode)
    check_plane_order(plane_order)
    path = as_path(path, "path")
    if not os.path.isdir(path):
        raise InputError(f"{path}: not a folder (unweight.load takes a compressed checkpoint folder)")
    from transformers import AutoConfig

    register()
    # Fail on a corrupt/truncated folder with our one-line error before transformers opens it.
    CompressedCheckpoint(path).close()
    config = AutoConfig.from_pretrained(path)
    qc = getattr(config, "quantization_config", None)
    qc = dict(qc) if qc is not None else {}
    if qc.get("quant_method") != C.QUANT_METHOD:
        raise InputError(f"{path}: config.json has no unweight quantization_config (compress it with unweight)")
    if merge_siblings not in (True, False, "auto"):
        raise InputError(f"merge_siblings={merge_siblings!r}: choose True, False or 'auto'")
    qc.update(mode=mode, verify=verify, plane_order=plane_order, merge_siblings=merge_siblings,
              l2_prefetch=bool(l2_prefetch))
    config.quantization_config = qc
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, str) and device.startswith("cuda") and not torch.cuda.is_available():
        # Otherwise torch's own assertion surfaces deep inside from_pretrained.
        raise InputError(f"device {device!r} asked for, but this torch sees no CUDA GPU "
                         f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
    cls = model_class or _model_class(config)
    out = cls.from_pretrained(path, config=config, device_map=device, **from_pretrained_kwargs)
    # output_loading_info=True makes from_pretrained return (model, loading info): passed on as is.
    (out[0] if isinstance(out, tuple) else out).eval()
    return out
