"""Measured tuning of a generated module's tunables, and the tuning database.

A generated module exposes CONFIG (block sizes, warps, stages and, for split plans, the chunk count). `tune`
times a grid around it on the GPU (warm-up, then the median of repeated runs), within a time budget, and
returns the fastest. Results are kept in a JSON database keyed by spec, shape bucket (each size rounded up to
a power of two), GPU name and Triton version; writes merge under a file lock and replace the file atomically,
so several processes may tune at once. An entry holds one record per plan family (the family the module's PLAN
names: rolled, unfused, split, ...), its best config and measured seconds, so the plans of one spec can be
timed one after another (`neptune-eqsat optimize --plan FAMILY`) and compared. `neptune-eqsat optimize` ranks
plans by these measured times where it has them, and bakes the chosen family's config into the module's CONFIG.
Needs torch and triton only (no compiler), so it can run where the kernels run:

    python -m neptune_eqsat.tune.database KERNEL.py --spec causal_pf --shape B=1,S=4096
"""
from __future__ import annotations

import itertools
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from neptune_eqsat.runtime.configs import GLUON_KEYS, bucket
from neptune_eqsat.tune import jsonfile

BUDGET_SECONDS = 60.0
UNKNOWN_FAMILY = "unknown"


def db_path() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "neptune_eqsat" / "tuning.json"
    return Path(os.environ.get("NEPTUNE_EQSAT_TUNING_DB", default))



def key_prefix(spec_name: str, sizes: dict[str, int], gpu: str) -> str:
    """The start shared by the database keys of this spec, shape bucket and GPU (any Triton version)."""
    return f"{spec_name}|{bucket(sizes)}|{gpu}|"


def db_key(spec_name: str, sizes: dict[str, int], gpu: str, triton_version: str) -> str:
    return f"{key_prefix(spec_name, sizes, gpu)}triton {triton_version}"


def load_db(path: Path | None = None) -> dict:
    return jsonfile.read(path or db_path())


def store(key: str, entry: dict, path: Path | None = None) -> None:
    """Set one whole entry (merged with other writers' entries under the file's lock)."""
    jsonfile.update(path or db_path(), lambda db: db.__setitem__(key, entry))


def store_plan(key: str, family: str, record: dict, path: Path | None = None) -> None:
    """Set the record of one plan family in an entry, keeping the entry's other families (and an old entry's
    family-less config)."""
    jsonfile.update(path or db_path(), lambda db: db.setdefault(key, {}).setdefault("plans", {}).__setitem__(
        family, record))


def plan_family(plan: str) -> str:
    """The family a generated module's PLAN names: 'split+packed: 1 pass(es) over j ...' -> 'split+packed'."""
    family, colon, _ = plan.partition(":")
    return family.strip() if colon and family.strip() else UNKNOWN_FAMILY


def entry_plans(entry: dict) -> dict[str, dict]:
    """family -> record ({"config", "seconds", ...}). An entry written before families were recorded holds one
    config of unknown family: its config is still used, its time is never compared with a plan's."""
    plans = dict(entry.get("plans", {}))
    if "config" in entry:
        plans.setdefault(UNKNOWN_FAMILY, {"config": entry["config"], "seconds": entry.get("ms", math.nan) / 1e3})
    return plans


def _triton_version(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in key.rpartition("triton ")[2].split("."))


def measured_plans(spec_name: str, sizes: dict[str, int], gpu: str, path: Path | None = None) -> dict[str, dict]:
    """family -> record measured for this spec, shape bucket and GPU; each family's record comes from the entry
    of the Triton version here, else from the newest other version. Each record also names its database key."""
    return _plans_under(load_db(path), key_prefix(spec_name, sizes, gpu))


def _plans_under(db: dict, prefix: str) -> dict[str, dict]:
    """measured_plans of the entries whose keys start with `prefix` (spec|bucket|GPU|)."""
    entries = [(k, v) for k, v in db.items() if k.startswith(prefix)]
    if not entries:   # the usual case: nothing measured, and no import of Triton (a tenth of a second) to say so
        return {}
    import triton
    here = f"{prefix}triton {triton.__version__}"
    entries.sort(key=lambda kv: (kv[0] == here, _triton_version(kv[0])))
    out: dict[str, dict] = {}
    for key, entry in entries:   # the preferred entries come last and override
        out.update({family: {**record, "key": key} for family, record in entry_plans(entry).items()})
    return out


def plan_times(plans: dict[str, dict]) -> dict[str, float]:
    """family -> measured seconds, from measured_plans: the times extraction may rank plans by."""
    return {f: r["seconds"] for f, r in plans.items()
            if f != UNKNOWN_FAMILY and math.isfinite(r.get("seconds", math.nan))}


def config_for(plans: dict[str, dict], family: str | None) -> dict | None:
    """From measured_plans: the config of `family` (the plan that will be generated), else a config of unknown
    family from an old entry. Without a family: the config of the plan measured fastest, as the measured ranking
    would choose it."""
    if family is None:
        times = plan_times(plans)
        record = plans[min(times, key=times.get)] if times else plans.get(UNKNOWN_FAMILY)
    else:
        record = plans.get(family) or plans.get(UNKNOWN_FAMILY)
    return record["config"] if record else None


def configs_by_gpu(spec_name: str, family: str, path: Path | None = None) -> dict[str, dict[str, dict]]:
    """GPU name -> shape bucket -> the config measured best for `family` (or of unknown family) at that bucket
    on that GPU: the tables a generated module picks its tunables from by the GPU and shape of each call."""
    db, tables = load_db(path), {}
    for key in db:
        parts = key.split("|")
        if len(parts) == 4 and parts[0] == spec_name and parts[1] not in tables.get(parts[2], {}):
            config = config_for(_plans_under(db, f"{spec_name}|{parts[1]}|{parts[2]}|"), family)
            if config:
                tables.setdefault(parts[2], {})[parts[1]] = config
    return tables


def stored_config(spec_name: str, sizes: dict[str, int], gpu: str, family: str | None = None) -> dict | None:
    """The best measured config for this spec, shape bucket and GPU, of `family` (see config_for)."""
    return config_for(measured_plans(spec_name, sizes, gpu), family)




def candidates(config: dict) -> list[dict]:
    """Configs around a module's CONFIG: each block size halved and doubled, warps, stages, the order of row
    blocks, loads through tensor descriptors or pointers, read-once load hints, chunk counts and, in a module
    with a Gluon kernel, which kernel runs (the other kernel's tunables then stay at their defaults)."""
    axes: dict[str, list] = {}
    for k, v in config.items():
        if k.startswith("BLOCK_"):
            axes[k] = sorted({max(16, v // 2), v, min(256, v * 2)})
        elif k == "num_warps":
            axes[k] = [4, 8]
        elif k == "num_stages":
            axes[k] = [1, 2, 3, 4]
        elif k == "ROW_ORDER":
            axes[k] = [0, 1, 2]
        elif k == "WS_ORDER":   # 3, the forward kernel's grouped order (a gradient kernel's ORDER 1 groups already)
            axes[k] = [1, 2, 3] if "WS_PERSISTENT" in config else [1, 2]
        elif k in ("USE_TMA", "STREAM", "WS_PERSISTENT", "WS_OUT_BUF"):
            axes[k] = [0, 1]
        elif k == "CHUNKS":
            axes[k] = [0, 2, 4, 8, 16, 32]
        elif k == "BACKEND":
            axes[k] = ["gluon", "triton"]
        elif k == "WS_BLOCK_J":
            axes[k] = [64, 128]
        elif k == "WS_STAGES":
            axes[k] = [2, 3]
    for k, values in axes.items():   # the start's own value too (a stored or hand-set config can hold any)
        if config[k] not in values:
            axes[k] = [config[k]] + values
    keys = list(axes)
    base = {k: config[k] for k in keys}
    grid, seen = [], set()
    for vals in itertools.product(*(axes[k] for k in keys)):
        cfg = dict(zip(keys, vals))
        if "BACKEND" in cfg:   # only the running kernel's tunables vary
            unused = ([k for k in keys if k in GLUON_KEYS] if cfg["BACKEND"] != "gluon"
                      else [k for k in keys if k not in GLUON_KEYS + ("BACKEND",)])
            cfg.update({k: base[k] for k in unused})
        if tuple(cfg.values()) not in seen:
            seen.add(tuple(cfg.values()))
            grid.append(cfg)
    # the current default first (the baseline), then configs by how many tunables they change, so a search
    # cut short by its budget has tried every single change first
    grid.sort(key=lambda c: sum(c[k] != base[k] for k in keys))
    return grid


@dataclass
class Tuned:
    best: dict
    best_ms: float
    default_ms: float   # the search's first config: in tune_module, the one a call of the shape ran before
    tried: list = field(default_factory=list)   # (config, ms); inf where it failed (e.g. out of shared memory)
    stopped: str = "grid done"


def measure_gpu(fn) -> float:
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tune(forward, inputs: list, config: dict, budget: float = BUDGET_SECONDS, measure=measure_gpu,
         progress=sys.stderr, seeds: list[dict] = ()) -> Tuned:
    """Search the configs around `config` (see candidates), the `seeds` (configs measured best before) right
    after the default, for at most `budget` seconds, then confirm the fastest few."""
    grid = candidates(config)
    keys = list(grid[0])
    seeded = [{k: seed.get(k, config[k]) for k in keys} for seed in seeds]
    grid = grid[:1] + [c for n, c in enumerate(seeded) if c != grid[0] and c not in seeded[:n]] + [
        c for c in grid[1:] if c not in seeded]
    tried: list = []
    t0 = time.perf_counter()
    stopped = "grid done"
    for n, cfg in enumerate(grid):
        if n and time.perf_counter() - t0 > budget:   # the default is always measured
            stopped = f"time budget ({budget:g} s) after {n} of {len(grid)} configs"
            break
        tried.append((cfg, _timed(forward, inputs, cfg, measure)))
        if progress is not None:
            done = int(30 * (n + 1) / len(grid))
            best = min(t for _, t in tried)
            progress.write(f"\r[{'#' * done}{'.' * (30 - done)}] {n + 1}/{len(grid)} best {best:.4f} ms")
            progress.flush()
    if progress is not None:
        progress.write("\n")
    best_cfg, best_ms, default_ms = confirm(forward, inputs, tried, measure)
    return Tuned(best_cfg, best_ms, default_ms, tried, stopped)


def _timed(forward, inputs: list, cfg: dict, measure) -> float:
    try:
        return measure(lambda: forward(*inputs, config=cfg))
    except Exception:   # a config may not compile or fit; it is skipped
        return math.inf


def confirm(forward, inputs: list, tried: list, measure, finalists: int = 3, rounds: int = 2):
    """(config, ms, default's ms): the search's fastest few and the default timed again, in turns, for `rounds`
    rounds; each keeps the median of its times (the search's and these). One timing of a short kernel moves by
    a few percent between calls, so the single fastest of many timings is partly luck; taking turns also spreads
    slow drifts of the clock over all finalists alike. The finalists are compiled already, so this adds
    (finalists + 1) x rounds timings, a second or two, to the search's budget."""
    ranked = sorted((t for t in tried[1:] if math.isfinite(t[1])), key=lambda t: t[1])[:finalists]
    pool = [tried[0]] + [t for t in ranked if t[0] != tried[0][0]]
    if len(pool) == 1:
        return min(tried, key=lambda t: t[1]) + (tried[0][1],)
    times = {n: [ms] for n, (_, ms) in enumerate(pool)}
    for _ in range(rounds):
        for n, (cfg, _) in enumerate(pool):
            times[n].append(_timed(forward, inputs, cfg, measure))
    median = {n: sorted(ts)[len(ts) // 2] for n, ts in times.items()}
    best = min(median, key=median.get)
    return pool[best][0], median[best], median[0]


def tune_module(module, spec_name: str, sizes: dict[str, int], inputs: list, budget: float = BUDGET_SECONDS,
                measure=measure_gpu, gpu: str | None = None, progress=sys.stderr) -> tuple[str, Tuned]:
    """Tune a loaded generated module on `inputs` and store the result under the module's plan family; returns
    (database key, result)."""
    import triton
    if gpu is None:
        import torch
        gpu = torch.cuda.get_device_name()
    config = dict(module.CONFIG)
    # a call of this shape runs the config measured for its bucket (on this GPU, else on the module's own): the
    # search starts from it, so the first timing is what a call ran before tuning and the single changes tried
    # first are its neighbours (a module's CONFIG can be a long shape's, far from a short one's best)
    earlier = module._tuned_config(gpu, bucket(sizes)) if hasattr(module, "_tuned_config") else None
    if earlier:   # (the grid varies the tunables alone; the call merges them over the module's whole config)
        config.update({k: v for k, v in earlier.items() if k in config})
    result = tune(module.forward, inputs, config, budget, measure, progress)
    key = db_key(spec_name, sizes, gpu, triton.__version__)
    if math.isfinite(result.best_ms):
        store_plan(key, plan_family(getattr(module, "PLAN", "")),
                   {"config": result.best, "seconds": result.best_ms / 1e3, "default_seconds": result.default_ms / 1e3,
                    "shape": dict(sizes), "configs_tried": len(result.tried), "stopped": result.stopped})
    return key, result


def _main(argv=None) -> None:
    import argparse
    import importlib.util

    ap = argparse.ArgumentParser(description="Tune a generated module on this GPU and store the result.")
    ap.add_argument("module")
    ap.add_argument("--spec", required=True, help="spec name (the database key)")
    ap.add_argument("--shape", required=True, help="sizes, e.g. B=1,S=4096")
    ap.add_argument("--budget", type=float, default=BUDGET_SECONDS)
    args = ap.parse_args(argv)
    try:
        sizes = {k.strip(): int(v) for k, v in (p.split("=") for p in args.shape.split(","))}
    except ValueError:
        ap.error(f"--shape {args.shape!r}: expected NAME=INT,..., e.g. B=1,S=4096")
    import torch
    if not torch.cuda.is_available():   # tuning times kernels: the interpreter's times say nothing of a GPU's
        ap.error("tuning measures kernels on a GPU, and torch sees none here")
    spec = importlib.util.spec_from_file_location("tuned_module", args.module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    inputs = random_inputs_for(mod, sizes)
    key, result = tune_module(mod, args.spec, sizes, inputs, args.budget)
    family = plan_family(getattr(mod, "PLAN", ""))
    print(f"{key} [{family} plan]: best {result.best_ms:.4f} ms {result.best} (before {result.default_ms:.4f} ms; "
          f"{len(result.tried)} configs, {result.stopped})")


def random_inputs_for(mod, sizes: dict[str, int], device: str = "cuda") -> list:
    """Random inputs for a generated module, from its INPUTS table."""
    import torch
    g = torch.Generator().manual_seed(0)
    out = []
    for dtype, shape in mod.INPUTS.values():
        dims = [d if isinstance(d, int) else sizes[d] for d in shape]
        out.append(torch.randn(dims, generator=g).to(device=device, dtype=getattr(torch, dtype)))
    return out


if __name__ == "__main__":
    _main()
