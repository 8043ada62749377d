"""A split reduction across processes: each rank holds a shard of the split axis (a KV cache sharded over GPUs,
say), computes its partial results with the module's own partial-results kernel, exchanges them with
torch.distributed (NCCL on GPUs, gloo on CPUs) and combines them with the module's combine kernel -- the same
derived repairs that combine the chunks of one GPU, applied to the chunks of every rank.

    mod = compiled split module (optimize ... --plan split)
    out = sharded_forward(mod, q, k_shard, v_shard, sizes={"SKV": total_keys}, group=None)

Every rank gets the whole output. Ranks whose shards have fewer chunks pad theirs with the reducers' identities
(a chunk that holds nothing), which the repairs keep. Values that depend on the position along the split axis
(a causal mask, a position bias) must see global positions: give each rank its offset as an input of the spec.

For FlexAttention callables (score_mod and mask_mod see global positions): context_parallel_attention (decode:
the same queries on every rank, keys and values sharded) and ring_attention (prefill: queries sharded too, the
key and value shards passed round the ring). docs/distributed.md has the details and the limits.
"""
from __future__ import annotations

import weakref
from types import ModuleType

import torch
import torch.distributed as dist

from neptune_eqsat import flex, flex_plans
from neptune_eqsat.compiled import compiled_module, run_kernels
from neptune_eqsat.frontend.flex_trace import reads, trace


def _identity(value: str) -> float:
    return {"0.0": 0.0, "float('-inf')": float("-inf"), "float('inf')": float("inf")}[value]


def gather_partials(partials: tuple[torch.Tensor, ...], table: tuple, group=None) -> tuple[torch.Tensor, ...]:
    """Every rank's partial results, joined along the chunk axis (the first) in rank order: each rank's padded
    to the most chunks of any rank and packed into one buffer, so one gather carries them all."""
    world = dist.get_world_size(group)
    most = max(_lengths(partials[0].shape[0], partials[0].device, group))
    padded = []
    for part, (_, _, identity) in zip(partials, table):
        full = torch.full((most,) + tuple(part.shape[1:]), _identity(identity), dtype=part.dtype, device=part.device)
        full[:part.shape[0]] = part
        padded.append(full)
    packed = torch.cat([p.reshape(-1) for p in padded])
    gathered = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(gathered, packed, group=group)
    joined, at = [], 0
    for p in padded:
        n = p.numel()
        joined.append(torch.cat([g[at:at + n].view(p.shape) for g in gathered]))
        at += n
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
    """score_mod and mask_mod called with global positions, read from captured tensors (one compiled kernel for
    every rank and step; filled before each call): q_idx and kv_idx plus offsets (contiguous shards), or, given
    the shards' length, the positions of each query row and key (any layout, such as zig-zag shards)."""

    def __init__(self, score_mod, mask_mod, device: torch.device, length: int | None = None):
        if length is None:   # (never inference tensors: a later call outside inference_mode fills them)
            with torch.inference_mode(False):
                self.q_offset = torch.zeros(1, dtype=torch.int32, device=device)
                self.kv_offset = torch.zeros(1, dtype=torch.int32, device=device)
            qo, ko = self.q_offset, self.kv_offset
            q_at, k_at = (lambda q: q + qo[0]), (lambda k: k + ko[0])
        else:
            with torch.inference_mode(False):
                self.q_positions = torch.zeros(length, dtype=torch.int32, device=device)
                self.kv_positions = torch.zeros(length, dtype=torch.int32, device=device)
            qp, kp = self.q_positions, self.kv_positions
            q_at, k_at = (lambda q: qp[q]), (lambda k: kp[k])
        # (the user's callables held weakly: a mask made for every batch goes with its tensors)
        score, mask = flex_plans._ref(score_mod), flex_plans._ref(mask_mod)
        self.score = None if score_mod is None else (lambda s, b, h, q, k: score()(s, b, h, q_at(q), k_at(k)))
        self.mask = None if mask_mod is None else (lambda b, h, q, k: mask()(b, h, q_at(q), k_at(k)))


_SHIFTED: dict[tuple, tuple] = {}   # (callables, device, shard length) -> (weak refs to them, _Shifted)
_TRACED: dict[tuple, tuple] = {}    # (callables, device, shard length, problem) -> (_Shifted, captures, compiled)


def _split_plan(query, key, value, score_mod, mask_mod, scale, enable_gqa, length: int | None = None):
    """(offsets to fill, the captured tensors, the flex _Compiled of the split plan) for these callables and this
    problem, traced and compiled once. Fill the offsets before converting the captures to kernel inputs
    (_inputs): an integer tensor reaches the kernel as a converted copy."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise NotImplementedError("attention across ranks has no backward pass yet: call it under torch.no_grad() "
                                  "or with tensors that do not require grad")
    # (what the callables read is part of the key, as for one GPU: a changed number or tensor traces again)
    memo = (id(score_mod), id(mask_mod), key.device, length, reads(score_mod), reads(mask_mod))
    hit = _SHIFTED.get(memo)
    if hit is None or hit[0][0]() is not score_mod or hit[0][1]() is not mask_mod:
        if len(_SHIFTED) > 64:   # (callables made per batch: their entries go, not their callables' tensors)
            _SHIFTED.clear()
            _TRACED.clear()
        hit = _SHIFTED[memo] = ((flex_plans._ref(score_mod), flex_plans._ref(mask_mod)),
                                _Shifted(score_mod, mask_mod, key.device, length))
        for fn in (score_mod, mask_mod):
            if fn is not None:
                try:
                    weakref.finalize(fn, _forget, memo)
                except TypeError:
                    pass
    shifted = hit[1]
    problem = flex._problem(query, key, value, None if scale is None else float(scale), bool(enable_gqa))
    traced = _TRACED.get(memo + (problem,))
    if traced is None or traced[0] is not shifted:
        spec, captures = trace(shifted.score, shifted.mask, problem)
        module = compiled_module(flex.plan_key(spec, problem), spec, interpret=query.device.type == "cpu",
                                 plan="split")
        traced = _TRACED[memo + (problem,)] = (shifted, captures, flex._Compiled(module, spec))
    _, captures, compiled = traced
    if torch.is_grad_enabled() and any(c.requires_grad for c in captures):
        raise NotImplementedError("attention across ranks has no backward pass yet: a captured tensor requires grad "
                                  "(a learnable table); call it under torch.no_grad()")
    return shifted, captures, compiled


def _forget(memo: tuple) -> None:
    """Drop the entries of callables that were collected (a mask made for every batch, with its tensors)."""
    _SHIFTED.pop(memo, None)
    for k in [k for k in _TRACED if k[:len(memo)] == memo]:
        del _TRACED[k]


def _inputs(captures: list[torch.Tensor], device) -> list[torch.Tensor]:
    return [flex._as_kernel_input(c, device) for c in captures]


ROWS_OF_ONE_CHUNK = 1024   # query rows per rank from which a ring step runs its shard as one chunk


def _many_rows_config(defaults: dict) -> dict:
    """Tunables of a split plan's kernel for many query rows: they fill the GPU alone, so one chunk per shard
    (a step is one pass over its keys) in prefill's tiles, where the split plan's own are for a few rows' long
    reductions (16-row tiles, loads read once). 32k causal prefill as one rank on an H100: 90 ms in those
    against 15 ms for the one-GPU kernel."""
    config = {"CHUNKS": 1, "num_warps": 8, "num_stages": 3, "BLOCK_J": 64, "STREAM": 0}
    config.update({k: 128 for k in defaults if k.startswith("BLOCK_I")})
    return {k: v for k, v in config.items() if k in defaults}


def _global_rank(group, rank: int) -> int:
    """A rank of `group` as the point-to-point operations name it."""
    return dist.get_global_rank(group, rank) if group else rank


def _lengths(n: int, device, group) -> list[int]:
    """Every rank's n, in rank order (one gather, one read on the host)."""
    return [row[0] for row in _gathered([n], device, group)]


def _gathered(values: list[int], device, group) -> list[list[int]]:
    got = [torch.zeros(len(values), dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, torch.tensor(values, dtype=torch.int64, device=device), group=group)
    return torch.stack(got).tolist()


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _agreed(tensors: dict[str, torch.Tensor], sharded: int, group, flag: int = 0) -> list[list[int]]:
    """Every rank's shapes and dtypes of `tensors` (one gather), checked to agree but for the sequence dimension
    (`sharded`): a rank whose shard differs otherwise gets a ValueError naming it on every rank, where the
    exchange would read its bytes as another shape or dtype. Returns each rank's sequence lengths."""
    mine = [flag] + [_DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1 for t in tensors.values()]
    for t in tensors.values():
        mine += [t.dim()] + [n for d, n in enumerate(t.shape) if d != sharded] + [0] * (6 - t.dim())
    mine += [t.shape[sharded] for t in tensors.values()]
    rows = _gathered(mine, next(iter(tensors.values())).device, group)
    k = len(tensors)
    for r, row in enumerate(rows):
        if row[:-k] != rows[0][:-k]:
            def show(x):
                dtypes = [_DTYPES[i] if i >= 0 else "?" for i in x[1:1 + k]]
                return f"dtypes {dtypes}" + (", positions given" if x[0] else "")
            raise ValueError(f"rank {r} passes {', '.join(tensors)} of other shapes or dtypes than rank 0 (all but "
                             f"dimension {sharded}, the sequence, must agree; and positions on every rank or none): "
                             f"rank 0 {show(rows[0])}, shapes {[tuple(t.shape) for t in tensors.values()]} here; "
                             f"rank {r} {show(row)}")
    return [row[-k:] for row in rows]


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None,
                               mask_mod=None, *, group=None, scale: float | None = None,
                               enable_gqa: bool = False) -> torch.Tensor:
    """flex_attention over keys and values sharded across the ranks of `group` along the sequence: each rank
    passes the same query and its own shard of key and value (rank order is sequence order; shards may differ
    in length, or be empty). score_mod and mask_mod see global key positions. Each rank computes its partial
    results with the split plan's kernel, the partials are gathered, and every rank gets the whole output.
    No gradient yet."""
    rows = _agreed({"query": query, "key": key, "value": value}, 2, group)
    if len({row[0] for row in rows}) != 1:
        raise ValueError("context_parallel_attention: every rank passes the same query; its rows differ: "
                         f"{[row[0] for row in rows]}")
    lengths = [row[1] for row in rows]
    shifted, captures, compiled = _split_plan(query, key, value, score_mod, mask_mod, scale, enable_gqa)
    shifted.q_offset.fill_(0)
    shifted.kv_offset.fill_(sum(lengths[:dist.get_rank(group)]))
    captures = _inputs(captures, query.device)
    compiled.check_indices(query, key, captures)
    return run_kernels(query.device, lambda: sharded_forward(compiled.module, query, key, value, *captures,
                                                             sizes={"S": sum(lengths)}, group=group))


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None, mask_mod=None, *,
                   group=None, scale: float | None = None, enable_gqa: bool = False,
                   positions: torch.Tensor | None = None) -> torch.Tensor:
    """flex_attention with queries, keys and values all sharded along the sequence across the ranks of `group`:
    each rank keeps its query rows, and the key and value shards travel round the ring, each sent on to the next
    rank while this one computes on it. Each step adds its partial results (the split plan's, over the shard at
    hand, with score_mod and mask_mod at global positions); one combine at the end repairs them all into this
    rank's output rows. A shard that a causal mask hides from this rank's rows costs its classification only
    (its key blocks are all empty).

    Shards are contiguous in rank order (and may differ in length), unless `positions` gives this rank's
    sequence positions (of its query rows, which are also those of its keys and values; every rank's shard of
    the same length): zig-zag shards, say (rank r holding chunks r and 2W - 1 - r of 2W), which even out a
    causal mask's work across ranks. No gradient yet."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = _agreed({"query": query, "key": key, "value": value}, 2, group, int(positions is not None))
    q_lengths, kv_lengths = [row[0] for row in lengths], [row[1] for row in lengths]
    if positions is not None:
        if len(set(q_lengths + kv_lengths)) != 1 or positions.shape != (query.shape[2],):
            raise ValueError("ring_attention with positions needs shards of one length on every rank and one "
                             f"position per row: rows {q_lengths}, keys {kv_lengths}, positions "
                             f"{tuple(positions.shape)}")
    shifted, captured, compiled = _split_plan(query, key, value, score_mod, mask_mod, scale, enable_gqa,
                                              None if positions is None else query.shape[2])
    if positions is None:
        shifted.q_offset.fill_(sum(q_lengths[:rank]))
    else:
        shifted.q_positions.copy_(positions)
    config = _many_rows_config(compiled.module.CONFIG) if query.shape[2] > ROWS_OF_ONE_CHUNK else None
    nxt, prv = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
    partials = []
    held = (key, value) if positions is None else \
        (key, value, positions.to(device=key.device, dtype=torch.int32).reshape(1, 1, -1, 1))
    for step in range(world):
        source = (rank - step) % world   # the rank whose shard is at hand
        if positions is None:
            shifted.kv_offset.fill_(sum(kv_lengths[:source]))
        else:
            shifted.kv_positions.copy_(held[2].reshape(-1))
        captures = _inputs(captured, query.device)
        compiled.check_indices(query, held[0], captures)
        # launched (asynchronously on a GPU) before the exchange is posted: building a mask's block lists may
        # capture a CUDA graph, which no communication may run beside
        partials.append(run_kernels(query.device, lambda: compiled.module.forward_partials(
            query, held[0], held[1], *captures, config=config)))
        if step < world - 1:   # pass the shard (and its positions) on while the kernels run on it
            n = kv_lengths[(source - 1) % world]
            incoming = tuple(torch.empty(x.shape[:2] + (n,) + x.shape[3:], dtype=x.dtype, device=x.device)
                             for x in held)
            ops = [dist.P2POp(dist.isend, x.contiguous(), nxt, group) for x in held]
            ops += [dist.P2POp(dist.irecv, x, prv, group) for x in incoming]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            held = incoming
    joined = tuple(torch.cat(p) for p in zip(*partials))
    return run_kernels(query.device, lambda: compiled.module.combine(query, key, value, *captures, partials=joined,
                                                                     sizes={"S": sum(kv_lengths)}, config=config))
