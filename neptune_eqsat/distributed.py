"""A split reduction across processes: each rank holds a shard of the split axis (a KV cache sharded over GPUs,
say), computes its partial results with the module's own partial-results kernel, exchanges them with
torch.distributed (NCCL on GPUs, gloo on CPUs) and combines them with the module's combine kernel -- the same
derived repairs that combine the chunks of one GPU, applied to the chunks of every rank.

    mod = compiled split module (optimize ... --plan split)
    out = sharded_forward(mod, q, k_shard, v_shard, sizes={"SKV": total_keys}, group=None)

Every rank gets the whole output. Ranks whose shards have fewer chunks pad theirs with the reducers' identities
(a chunk that holds nothing), which the repairs keep. Values that depend on the position along the split axis
(a causal mask, a position bias) must see global positions: give each rank its offset as an input of the spec.
"""
from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist


def _identity(value: str) -> float:
    return {"0.0": 0.0, "float('-inf')": float("-inf"), "float('inf')": float("inf")}[value]


def gather_partials(partials: tuple[torch.Tensor, ...], table: tuple, group=None) -> tuple[torch.Tensor, ...]:
    """Every rank's partial results, joined along the chunk axis (the first) in rank order."""
    world = dist.get_world_size(group)
    counts = [torch.zeros(1, dtype=torch.int64, device=partials[0].device) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([partials[0].shape[0]], device=partials[0].device), group=group)
    most = int(max(c.item() for c in counts))
    joined = []
    for part, (_, _, identity) in zip(partials, table):
        padded = torch.full((most,) + tuple(part.shape[1:]), _identity(identity), dtype=part.dtype, device=part.device)
        padded[:part.shape[0]] = part
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded.contiguous(), group=group)
        joined.append(torch.cat(gathered))
    return tuple(joined)


def sharded_forward(module: ModuleType, *inputs: torch.Tensor, sizes: dict[str, int] | None = None, group=None,
                    config: dict | None = None) -> torch.Tensor:
    """The module's output over the union of every rank's shard. `inputs` are this rank's (its shard of the
    split axis, the rest whole); `sizes` the whole problem's run-time sizes where they differ from this rank's
    inputs (the split axis's total length). Needs a module of a split plan (forward_partials and combine)."""
    if not hasattr(module, "forward_partials"):
        raise TypeError(f"module {getattr(module, 'NAME', module)!r} is not a split plan (no forward_partials): "
                        "optimize its spec with --plan split")
    partials = module.forward_partials(*inputs, config=config)
    joined = gather_partials(partials, module.PARTIALS, group)
    return module.combine(*inputs, partials=joined, sizes=sizes, config=config)
