"""transformers integration: ``unweight.load`` and the ``quant_method: "unweight"`` HfQuantizer.

    load.py       unweight.load(path, device, mode) -> model
    quantizer.py  UnweightConfig + UnweightHfQuantizer, register()
    hook.py       registers the quantizer when transformers' registry is imported (stdlib only)
    tp.py         tensor parallelism (DistributedConfig(tp_plan=...)): each rank loads its shard
    ep.py         expert parallelism (DistributedConfig(ep_size=...)): each rank loads its experts

Importing this package is cheap; its modules import torch / transformers.
"""
