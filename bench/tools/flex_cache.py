"""Fill neptune_eqsat.flex_attention's kernel cache for the benchmark's ten operators, on a machine with the
compiler (egglog), so that a GPU machine with only torch and triton runs `--systems neptune_api` from it.

    NEPTUNE_EQSAT_CACHE=bench/flex_cache python -m bench.tools.flex_cache
    NEPTUNE_EQSAT_CACHE=bench/flex_cache python -m bench.tools.flex_cache --backward [--dtype bf16] [--ops ...]
    NEPTUNE_EQSAT_CACHE=bench/flex_cache python -m bench.tools.flex_cache --masks [NAME,...] --seqs 4096,16384 \
        [--dtype bf16]

The cache key does not contain the sequence lengths: prefill and decode each need one kernel per operator.
--backward fills what a training step of the prefill operators runs (the forward writing the row values, the
backward's stages and gradient kernels) for both backwards a GPU may take, the one pass and the two passes
(training.backward_for_device), by running the step under Triton's interpreter on short sequences.
--masks fills a training step of bench.suite.masks' prefill masks at the given lengths (their traced specs hold
lengths and tables of that size): the sources only, made without running a kernel.
"""
import argparse
import os
import sys

import torch

from bench.common import import_package
from bench.suite.attention import D, OPS, alibi_slopes, api_callables

import_package()   # neptune_eqsat from this checkout
from neptune_eqsat import compiled, flex, training  # noqa: E402


def forward_kernels() -> None:
    for op in OPS.values():
        decode = op.mode == "decode"
        q = torch.empty(1, op.hq, 1 if decode else 64, D, dtype=torch.float16)
        k = torch.empty(1, op.hkv, 64, D, dtype=torch.float16)
        offset = torch.tensor(63) if decode else 0
        mod, mask = api_callables(op, alibi_slopes(op.hq, "cpu"), offset)
        problem = flex._problem(q, k, k, None, op.hq != op.hkv)
        spec = flex.trace(mod, mask, problem)[0]
        # the source only: importing it compiled needs a GPU (its Gluon kernels), the machine it is made for
        print(f"{op.name}: {compiled.cached_source(flex.plan_key(spec, problem), spec)}", flush=True)


def training_kernels(dtype: torch.dtype, names: list[str], seq: int = 32) -> None:
    suits = training.one_pass_suits
    for name in names:
        op = OPS[name]
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, seq, D, dtype=dtype, generator=g).requires_grad_()
                   for h in (op.hq, op.hkv, op.hkv))
        mod, mask = api_callables(op, alibi_slopes(op.hq, "cpu"), 0)
        for one_pass in (True, False):
            training.one_pass_suits = lambda device, one_pass=one_pass: one_pass
            for kept in flex._BY_SHAPE.values():   # the backward chosen for the device before
                kept.backwards.clear()
            try:
                out = flex.flex_attention(q, k, v, score_mod=mod, mask_mod=mask, enable_gqa=op.hq != op.hkv)
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            finally:
                training.one_pass_suits = suits
            print(f"{name} {dtype} {'one pass' if one_pass else 'two passes'}: cached", flush=True)


def fill_training(spec, wrt=("q", "k", "v")) -> None:
    """The sources a training step of `spec` runs, whichever backward the GPU takes: the forward writing the saved
    values (or the stages computing them), and the stages and gradient kernels of the one pass and of the two
    passes. A spec the compiler refuses is reported: the API then takes another path (forward_outputs' stages)."""
    from neptune_eqsat.frontend.spec import SpecError

    def fill(s):
        try:
            compiled.cached_source(training.spec_key(s), s, spec_file=s.name)
        except SpecError as e:
            print(f"  {s.name}: {str(e).splitlines()[0][:120]}")
    derived = training._derivation(spec)
    for stage in derived.stages:
        fill(stage.spec)
    fill(derived.forward_spec())
    for one_pass in (True, False):
        plan = training.CompiledBackward(spec, wrt, accumulate=one_pass).plan
        for s in [st.spec for st in plan.stages] + [kernel.spec for kernel in plan.kernels]:
            fill(s)


def mask_training_sources(names: list[str], seqs: list[int], dtype: torch.dtype, heads: int = 32) -> None:
    """The modules a training step of each mask runs at each length (fill_training, and the forward)."""
    from bench.suite.masks import masks
    for S in seqs:
        for name, (mask_mod, score_mod, hkv, *decode) in masks(S, "cpu").items():
            if decode or (names and name not in names):
                continue
            q, k = torch.empty(1, heads, S, D, dtype=dtype), torch.empty(1, hkv, S, D, dtype=dtype)
            problem = flex._problem(q, k, k, None, heads != hkv)
            spec = flex.trace(score_mod, mask_mod, problem)[0]
            compiled.cached_source(flex.plan_key(spec, problem), spec)
            fill_training(spec)
            print(f"{name} S={S} {dtype}: cached", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backward", action="store_true", help="the prefill operators' training step")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--ops", default=",".join(n for n, op in OPS.items() if op.mode == "prefill"))
    p.add_argument("--masks", nargs="?", const="", default=None, help="bench.suite.masks' masks (all if none named)")
    p.add_argument("--seqs", default="4096,16384")
    args = p.parse_args()
    if args.masks is not None:
        mask_training_sources([n for n in args.masks.split(",") if n], [int(x) for x in args.seqs.split(",")],
                              {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype])
    elif args.backward:
        training_kernels({"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype], args.ops.split(","))
    else:
        forward_kernels()


if __name__ == "__main__":
    if "NEPTUNE_EQSAT_CACHE" not in os.environ:
        sys.exit("set NEPTUNE_EQSAT_CACHE to the folder to fill")
    main()
