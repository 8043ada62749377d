"""Generate the benchmark's modules (bench/generated/<op>.py) from the specs, with the tuning databases committed
under bench/tuning/ baked into their tables: the modules the latest figures were measured with.

    python -m bench.suite.generate_modules [--ops global_pf,...] [--tuning h100,h200] [--out bench/generated]
                                           [--dtype bf16]

--tuning names databases of bench/tuning/ (h100 for bench/tuning/h100.json) or paths to any tuning.json (a
`python -m neptune_eqsat.tune` run's, say). The databases are joined in the order given (a later one's entry for
the same spec, shape bucket, GPU and Triton version replaces an earlier one's) into a temporary file that
`neptune-eqsat optimize` reads through NEPTUNE_EQSAT_TUNING_DB. Runs where the compiler runs (egglog needed, no GPU).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import common
from bench.suite.attention import OPS

# each GPU's curated database: bench/tuning/h100.json joins (in this order) the tuning runs of
# results/h100/: 2026-11-22-tuning-gluon, 2026-11-22-tile-order, 2026-11-22-tuning-stream, 2026-11-23-tuning-batch,
# 2026-11-23-tuning-batch-small, 2026-11-27-one-warp-producer-raw-max/tuning; h200.json those of results/h200/:
# 2026-11-23-tuning-decode, 2026-11-23-tuning-1k, 2026-11-28-output-buffer, 2026-11-28-tuning-decode-4k,
# 2026-11-28-tile-groups, 2026-11-28-planned-tiles
TUNING = ("h100", "h200")


def joined_databases(folders: list[str]) -> dict:
    db = {}
    for name in folders:
        path = common.TUNING / f"{name}.json" if (common.TUNING / f"{name}.json").exists() else Path(name)
        db.update(json.loads(path.read_text()))
    return db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--tuning", default=",".join(TUNING), help="names in bench/tuning/ or paths of tuning databases")
    ap.add_argument("--out", default=str(common.GENERATED))
    ap.add_argument("--dtype", default=None, help="compile the specs in this dtype (bf16, f32) instead of fp16")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "tuning.json"
        db.write_text(json.dumps(joined_databases(args.tuning.split(","))))
        env = {**os.environ, "NEPTUNE_EQSAT_TUNING_DB": str(db)}
        for op in args.ops.split(","):
            # relative paths: the module's header names the command that made it
            spec, module = (os.path.relpath(p) for p in (common.SPECS / f"{op}.py", out / f"{op}.py"))
            dtype = ["--dtype", args.dtype] if args.dtype else []
            subprocess.run([sys.executable, "-m", "neptune_eqsat.cli", "optimize", spec, "-o", module, *dtype],
                           env=env, check=True)


if __name__ == "__main__":
    main()
