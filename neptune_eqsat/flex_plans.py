"""The FlexAttention API's plans: each pair of callables traced once into a plan (a name), the tensors they
capture, and the callables themselves, kept while the callables live (a mask made for every batch, capturing
that batch's document ids, is dropped with them)."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import weakref
from collections import OrderedDict

import torch

from neptune_eqsat.compiled import compiler_fingerprint
from neptune_eqsat.frontend.flex_trace import Problem, problem_text, reads, trace
from neptune_eqsat.frontend.spec import Spec

BOUND_TO_PLANS: list[dict] = []   # caches keyed by (plan, ...), emptied of a plan that is dropped

def plan_key(spec: Spec, problem: Problem) -> str:
    """The cache key: the traced expressions, the inputs' dtypes and shapes (as dims), the problem (dtype, head
    dims, GQA ratio, scale, decode or prefill), not the sequence lengths."""
    text = f"{compiler_fingerprint()}|{problem_text(spec, problem)}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class _Captured:
    """Each plan's captured tensors, an attribute named by the plan. Under torch.compile a plan is made while the
    graph is traced (_plan runs then; its result is a constant of the graph): dynamo reads an object's attribute
    as it is when read, where a module-level dict it reads as it was at the graph's first lookup in it, without
    the plans made later in the same graph (a second mask, the logsumexp's plan: a KeyError)."""


_CAPTURED = _Captured()


def captures_of(plan: str) -> list[torch.Tensor]:
    """The tensors the callables of `plan` capture (the kernels' further inputs)."""
    return getattr(_CAPTURED, plan)


_CALLABLES: dict[str, tuple] = {}   # plan -> (score_mod, mask_mod, scale, enable_gqa)
_PLAN_IDS = itertools.count()
_READS: dict[str, tuple] = {}   # plan -> what its callables read when it was made
_BY_CALLABLES: dict[tuple, list[str]] = {}   # (ids of the callables) -> their plans, oldest first
PLANS_PER_CALLABLES = 16
_TRACED: OrderedDict = OrderedDict()   # (callables' ids, problem) -> (weak refs to the callables, plan)


def _ref(fn):
    try:
        return weakref.ref(fn)
    except TypeError:   # None, or a callable that takes no weak references: keep it alive
        return lambda: fn


def callables_of(plan: str) -> tuple:
    """(score_mod, mask_mod, scale, enable_gqa, lse) of a plan."""
    score_mod, mask_mod, *rest = _CALLABLES[plan]
    return (score_mod(), mask_mod(), *rest)


def check_reads(plan: str) -> None:
    """Raise where the plan's callables now read other values than when it was made: a torch.compile'd graph
    holds its plan as a constant, and dynamo guards on neither the closures nor the globals the callables read
    (a mask made per batch with the same code, a global window changed): the graph would run the old values."""
    score_mod, mask_mod = callables_of(plan)[:2]
    if (reads(score_mod), reads(mask_mod)) != _READS.get(plan):
        raise RuntimeError("flex_attention in a compiled graph: its score_mod or mask_mod now reads other values "
                           "(a closure, a global or an attribute changed) than when the graph was compiled, which "
                           "would run the old ones; call it eagerly, or keep such values in tensors the callables "
                           "index and write them in place")


def _forget(plan: str) -> None:
    """Drop a plan whose callable was collected, with its captured tensors and the modules bound to it (the
    kernels stay cached by what they compute)."""
    _CALLABLES.pop(plan, None)
    _READS.pop(plan, None)
    if hasattr(_CAPTURED, plan):
        delattr(_CAPTURED, plan)
    for table in BOUND_TO_PLANS:
        for k in [k for k in table if k[0] == plan]:
            del table[k]
    for k in [k for k, (_, name) in _TRACED.items() if name == plan]:
        del _TRACED[k]
    for k, names in list(_BY_CALLABLES.items()):
        if plan in names:
            names.remove(plan)
        if not names:
            del _BY_CALLABLES[k]


# a stand-in problem for finding what the callables capture (the captures do not depend on the shapes)
_PROBE = Problem("f16", 1, 1, 16, 16, 0.25)   # one head: a per-head table of any size is read inside it


@torch._dynamo.assume_constant_result
def make_plan(score_mod, mask_mod, scale, enable_gqa, lse=False) -> str:
    """The plan's name for these callables. Under torch.compile this runs while the model is traced and its
    result is a constant, so it takes no shapes (they may be dynamic there); it traces the callables once to
    find the tensors they capture."""
    memo = (id(score_mod), id(mask_mod), scale, enable_gqa, lse, reads(score_mod), reads(mask_mod))
    hit = _TRACED.get(memo)
    if hit is not None and hit[0][0]() is score_mod and hit[0][1]() is mask_mod:
        _TRACED.move_to_end(memo)
        return hit[1]
    probe = dataclasses.replace(_PROBE, lse=lse)
    with torch.no_grad():   # tracing saves nothing for autograd (a checkpoint counts what a forward saves)
        spec, captures = trace(score_mod, mask_mod, probe)
    # one per callables (their own captures); ":lse" tells the operator's fake output from the attention's
    name = f"{plan_key(spec, probe)}:{scale}:{enable_gqa}:{next(_PLAN_IDS)}" + (":lse" if lse else "")
    setattr(_CAPTURED, name, captures)
    _CALLABLES[name] = (_ref(score_mod), _ref(mask_mod), scale, enable_gqa, lse)
    for fn in (score_mod, mask_mod):   # a plan lives as long as its callables (a mask made per batch)
        if fn is not None:
            try:
                weakref.finalize(fn, _forget, name)
            except TypeError:   # no weak references: the plan stays
                pass
    _TRACED[memo] = ((_ref(score_mod), _ref(mask_mod)), name)
    _READS[name] = memo[5:]
    # the plans of one pair of live callables whose reads changed (a captured length rebound every decode
    # step, lens = lens + 1): the latest PLANS_PER_CALLABLES kept, each older one dropped with its tensors
    history = _BY_CALLABLES.setdefault(memo[:2], [])
    history.append(name)
    if len(history) > PLANS_PER_CALLABLES:
        _forget(history.pop(0))
    if len(_TRACED) > 256:
        _TRACED.popitem(last=False)
    return name
