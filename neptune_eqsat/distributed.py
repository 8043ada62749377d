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


class _Shifted:
    """score_mod and mask_mod called with the key's global position: kv_idx plus this rank's offset, a captured
    tensor (one compiled kernel for every rank and shard length; filled before each call)."""

    def __init__(self, score_mod, mask_mod, device: torch.device):
        self.offset = torch.zeros(1, dtype=torch.int32, device=device)
        off = self.offset
        self.score = None if score_mod is None else (lambda s, b, h, q, k: score_mod(s, b, h, q, k + off[0]))
        self.mask = None if mask_mod is None else (lambda b, h, q, k: mask_mod(b, h, q, k + off[0]))


_SHIFTED: dict[tuple, tuple] = {}   # (callables, device) -> (weak refs to them, _Shifted)
_TRACED: dict[tuple, tuple] = {}    # (callables, device, problem) -> (spec, captures, compiled)


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None,
                               mask_mod=None, *, group=None, scale: float | None = None,
                               enable_gqa: bool = False) -> torch.Tensor:
    """flex_attention over keys and values sharded across the ranks of `group` along the sequence: each rank
    passes the same query and its own shard of key and value (rank order is sequence order; shards may differ
    in length, or be empty). score_mod and mask_mod see global key positions. Each rank computes its partial
    results with the split plan's kernel, the partials are gathered, and every rank gets the whole output.
    No gradient yet."""
    from neptune_eqsat import flex
    from neptune_eqsat.compiled import compiled_module, run_kernels
    from neptune_eqsat.frontend.flex_trace import trace

    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise NotImplementedError("context_parallel_attention has no backward pass yet: call it under "
                                  "torch.no_grad() or with tensors that do not require grad")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = [torch.zeros(1, dtype=torch.int64, device=key.device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([key.shape[2]], device=key.device), group=group)
    lengths = [int(n.item()) for n in lengths]
    memo = (id(score_mod), id(mask_mod), key.device)
    hit = _SHIFTED.get(memo)
    if hit is None or hit[0][0]() is not score_mod or hit[0][1]() is not mask_mod:
        hit = _SHIFTED[memo] = ((flex._ref(score_mod), flex._ref(mask_mod)), _Shifted(score_mod, mask_mod, key.device))
    shifted = hit[1]
    shifted.offset.fill_(sum(lengths[:rank]))
    problem = flex._problem(query, key, value, None if scale is None else float(scale), bool(enable_gqa))
    interpret = query.device.type == "cpu"
    traced = _TRACED.get(memo + (problem,))
    if traced is None or traced[0] is not shifted:
        spec, captures = trace(shifted.score, shifted.mask, problem)
        module = compiled_module(flex.plan_key(spec, problem), spec, interpret=interpret, plan="split")
        traced = _TRACED[memo + (problem,)] = (shifted, captures, flex._Compiled(module, spec))
    _, captures, compiled = traced
    captures = [flex._as_kernel_input(c, query.device) for c in captures]
    compiled.check_indices(query, key, captures)
    return run_kernels(query.device, lambda: sharded_forward(compiled.module, query, key, value, *captures,
                                                             sizes={"S": sum(lengths)}, group=group))
