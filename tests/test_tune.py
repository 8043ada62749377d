"""Tuning: the config grid, the time budget, the database (merged under a lock, replaced atomically) and
optimize baking a stored config into the module. Timings here come from a stand-in clock (no GPU)."""
import json
import multiprocessing

import triton

from neptune_eqsat import tune
from neptune_eqsat.compiler import optimize
from neptune_eqsat.cost import Device

from conftest import SPECS


def test_grid_starts_at_the_default_and_covers_the_tunables():
    grid = tune.candidates({"BLOCK_I": 128, "BLOCK_J": 128, "num_warps": 8, "num_stages": 3, "CHUNKS": 0})
    assert grid[0] == {"BLOCK_I": 128, "BLOCK_J": 128, "num_warps": 8, "num_stages": 3, "CHUNKS": 0}
    assert {c["BLOCK_J"] for c in grid} == {64, 128, 256} and {c["CHUNKS"] for c in grid} >= {0, 8, 32}


def test_tune_picks_the_fastest_and_respects_the_budget():
    def forward(*inputs, config):
        return config
    timings = []

    def measure(fn):
        cfg = fn()
        if cfg["num_stages"] == 4 and cfg["BLOCK_J"] == 256:
            raise RuntimeError("out of shared memory")   # a config that fails is skipped
        ms = 1.0 + abs(cfg["BLOCK_J"] - 64) / 64 + (0 if cfg["num_warps"] == 8 else 0.5)
        timings.append(ms)
        return ms
    res = tune.tune(forward, [], {"BLOCK_J": 128, "num_warps": 4, "num_stages": 3}, measure=measure, progress=None)
    assert res.best["BLOCK_J"] == 64 and res.best["num_warps"] == 8 and res.best_ms == 1.0
    assert res.default_ms == 2.5 and any(t[1] == float("inf") for t in res.tried)
    short = tune.tune(forward, [], {"BLOCK_J": 128, "num_warps": 4, "num_stages": 3}, budget=0.0, measure=measure,
                      progress=None)
    assert len(short.tried) == 1 and "time budget" in short.stopped


def _store_many(args):
    path, n = args
    for k in range(20):
        tune.store(f"key{n}-{k}", {"config": {"BLOCK_J": k}, "ms": 1.0}, path)


def test_database_merges_concurrent_writers(tmp_path):
    path = tmp_path / "db.json"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_store_many, [(path, n) for n in range(4)])
    db = json.loads(path.read_text())
    assert len(db) == 80


def test_optimize_uses_the_stored_config_for_this_gpu_and_shape_bucket():
    sizes = {"B": 1, "S": 3000}
    key = tune.db_key("causal_pf", sizes, "Test GPU", triton.__version__)
    tune.store(key, {"config": {"BLOCK_J": 64, "num_warps": 4}, "ms": 0.5})
    res = optimize(str(SPECS / "causal_pf.py"), sizes={"S": 4096}, device=Device(name="Test GPU"))
    assert res.tuned == {"BLOCK_J": 64, "num_warps": 4}     # 3000 and 4096 share a bucket
    assert "'BLOCK_J': 64" in res.source and "tuning database" in res.explain()
    other = optimize(str(SPECS / "causal_pf.py"), sizes={"S": 4096}, device=Device(name="Other GPU"))
    assert other.tuned is None and "'BLOCK_J': 128" in other.source
