"""vLLM integration: ``pip install "unweight[vllm]"`` then ``vllm serve COMPRESSED_DIR``.

Importing this package does not import vLLM; the ``vllm.general_plugins`` entry point calls
:func:`unweight.integrations.vllm.plugin.register`, which does.
"""
from .plugin import register

__all__ = ["register"]
