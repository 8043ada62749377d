"""Generate the benchmark's modules (bench/generated/<op>.py) from the specs, with the tuning databases committed
under bench/results/ baked into their tables: the modules the latest figures were measured with.

    python bench/generate_modules.py [--ops global_pf,...] [--tuning h100-tuning-gluon,...] [--out bench/generated]
                                     [--dtype bf16]

The databases are joined in the order given (a later one's entry for the same spec, shape bucket, GPU and
Triton version replaces an earlier one's) into a temporary file that `neptune-eqsat optimize` reads through
NEPTUNE_EQSAT_TUNING_DB. Runs where the compiler runs (egglog needed, no GPU).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attention import OPS

HERE = Path(__file__).resolve().parent
TUNING = ("h100-tuning-gluon", "h100-tile-order", "h100-tuning-stream", "h200-tuning-decode", "h100-tuning-batch",
          "h100-tuning-batch-small", "h200-tuning-1k")


def joined_databases(folders: list[str]) -> dict:
    db = {}
    for folder in folders:
        db.update(json.loads((HERE / "results" / folder / "tuning.json").read_text()))
    return db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--tuning", default=",".join(TUNING), help="folders of bench/results/ holding a tuning.json")
    ap.add_argument("--out", default=str(HERE / "generated"))
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
            spec, module = (os.path.relpath(p) for p in (HERE.parent / "specs" / f"{op}.py", out / f"{op}.py"))
            dtype = ["--dtype", args.dtype] if args.dtype else []
            subprocess.run([sys.executable, "-m", "neptune_eqsat.cli", "optimize", spec, "-o", module, *dtype],
                           env=env, check=True)


if __name__ == "__main__":
    main()
