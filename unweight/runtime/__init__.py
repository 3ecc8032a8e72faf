"""Runtime: run compressed checkpoints in PyTorch / transformers with weights kept compressed.

    unweight.load(path, device=..., mode=...)      -> transformers model   (loader.py)
    CompressedLinear / CompressedEmbedding          (modules.py)
    dispatch.linear / dispatch.embedding            the one dispatch point (dispatch.py)
    hf_quantizer.UnweightHfQuantizer               transformers integration (hf_quantizer.py)

Importing this package is cheap (no torch); the submodules import torch.
"""
