"""The Hopper GPU checks of tests/test_split_tail.py and tests/test_gluon_gradients.py (one-pass gradients
against float64) on a machine without the compiler: their specs' kernels come from a cache filled where the
compiler runs (`--fill`, with NEPTUNE_EQSAT_CACHE set on both machines).

    NEPTUNE_EQSAT_CACHE=DIR python bench/experiments/2026-11-28-split-tail/hopper_check.py --fill   # compiler
    NEPTUNE_EQSAT_CACHE=DIR PYTHONPATH=. python bench/experiments/2026-11-28-split-tail/hopper_check.py  # GPU
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ["NEPTUNE_EQSAT_COMPILE_AHEAD"] = "0"   # the first call runs the Gluon kernel, not Triton's
from bench.common import import_package  # noqa: E402

import_package()   # neptune_eqsat from this checkout, installed or not
from hopper_checks import attention_spec, check_on_hopper, listed_mask_spec  # noqa: E402
from neptune_eqsat.frontend.spec import load_spec  # noqa: E402


CHECKS = [   # (name, spec, sizes, seed, tolerance)
    ("global_pf, shared last wave", lambda: load_spec(str(ROOT / "specs" / "global_pf.py")), {"B": 1, "S": 2000},
     5, 2e-2),
    *[(f"attention causal={c} S={S}", lambda c=c: attention_spec(dim=128, heads=4, kv_heads=2, causal=c),
       {"B": 1, "S": S}, 3, 2e-2)
      for c, S in ((True, 777), (False, 256), (True, 1024))],
    *[(f"{m} S={S}", lambda m=m, S=S: listed_mask_spec(m, S), {"B": 1, "L": S, "S": S}, 5, 5e-2)
      for m, S in (("prefix", 777), ("documents", 777), ("documents", 256))],
]

if __name__ == "__main__":
    if "--fill" in sys.argv:   # the forward of each spec, and what its training step runs
        from bench.tools.flex_cache import fill_training
        from neptune_eqsat import compiled, training
        for name, make, *_ in CHECKS:
            spec = make()
            compiled.cached_source(training.spec_key(spec), spec, spec_file=spec.name)
            fill_training(spec)
            print("filled", name, flush=True)
    else:
        import torch
        print(torch.cuda.get_device_name())
        for name, make, sizes, seed, tol in CHECKS:
            check_on_hopper(make(), sizes, seed=seed, tol=tol)
            print("passed", name, flush=True)
