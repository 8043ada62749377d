"""Fill neptune_eqsat.flex_attention's kernel cache for the benchmark's ten operators, on a machine with the
compiler (egglog), so that a GPU machine with only torch and triton runs `--systems neptune_api` from it.

    NEPTUNE_EQSAT_CACHE=bench/flex_cache python -m bench.tools.flex_cache

The cache key does not contain the sequence lengths: prefill and decode each need one kernel per operator.
"""
import os
import sys

import torch

from bench.common import import_package
from bench.suite.attention import D, OPS, alibi_slopes, api_callables

import_package()   # neptune_eqsat from this checkout
from neptune_eqsat import compiled, flex  # noqa: E402


def main() -> None:
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


if __name__ == "__main__":
    if "NEPTUNE_EQSAT_CACHE" not in os.environ:
        sys.exit("set NEPTUNE_EQSAT_CACHE to the folder to fill")
    main()
