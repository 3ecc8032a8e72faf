"""Which compressed models must match the original bit for bit: the one place that decides
between the bitwise and the tolerance check (it follows the runtime's dispatch policies)."""
from __future__ import annotations

def fused_kernels(model) -> list[str]:
    """Compressed layers of `model` whose dispatch policy may run a fused kernel on their device
    (anything else computes decode + the same dense GEMM as the original)."""
    from ..runtime.modules import compressed_modules
    return [n for n, m in compressed_modules(model) if m.policy is not None and m.policy.may_fuse(m.device)]


def bitwise_by_construction(model, mode: str, device: str = "cpu") -> bool:
    """True when the compressed model computes with exactly the original bits in the original order:
    dense mode (or auto resolved to all-dense), or no layer whose policy can pick a fused kernel
    (CPU never does: decode + F.linear; CUDA without a measured fused win: decode + cuBLAS)."""
    if mode == "dense":
        return True
    counts = (getattr(model, "unweight_info", None) or {}).get("modules") or {}
    if counts and not counts.get("huffman") and not counts.get("palette"):
        return True  # e.g. auto mode resolved to all-dense
    return not fused_kernels(model)

