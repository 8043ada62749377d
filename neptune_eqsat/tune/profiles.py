"""Device profiles: the cost model's constants for one GPU, keyed by the name the GPU reports.

Two files hold them: the user's (written by `neptune-eqsat calibrate`; `NEPTUNE_EQSAT_DEVICES`, default next to
the tuning database) and the one shipped with the package. A profile of the user's file replaces the shipped
profile of the same GPU (keeping its aliases, the short names such as `h100` that select it). A profile says
whether its numbers were measured; the shipped file may hold nominal ones. Standard library only: calibration
runs where the compiler's dependencies are absent.
"""
from __future__ import annotations

import os
from pathlib import Path

from neptune_eqsat.tune import jsonfile
from neptune_eqsat.tune.database import db_path

SHIPPED = Path(__file__).with_name("devices.json")
FIELDS = ("sms", "bandwidth", "matrix_flops", "vector_ops", "special_ops", "launch_seconds")


def user_path() -> Path:
    return Path(os.environ.get("NEPTUNE_EQSAT_DEVICES") or db_path().parent / "devices.json")


def load(path: Path) -> dict[str, dict]:
    return jsonfile.read(path)


def store(profile: dict, path: Path | None = None) -> Path:
    """Merge one profile ({"name": GPU name, field: value, ...}) into a devices file, replacing that GPU's
    profile but keeping its aliases; returns the file."""
    path = Path(path or user_path())
    record = {k: v for k, v in profile.items() if k != "name"}

    def put(profiles: dict) -> None:
        aliases = profiles.get(profile["name"], {}).get("aliases")
        profiles[profile["name"]] = {"aliases": aliases, **record} if aliases else record
    jsonfile.update(path, put)
    return path


def all_profiles() -> dict[str, dict]:
    """GPU name -> profile, each with "origin": "shipped" or the user file it came from."""
    out = {gpu: {**p, "origin": "shipped"} for gpu, p in load(SHIPPED).items()}
    user = user_path()
    for gpu, p in load(user).items():
        out[gpu] = {"aliases": out.get(gpu, {}).get("aliases", []), **p, "origin": str(user)}
    return out


def find(name: str) -> tuple[str, dict] | None:
    """(GPU name, profile) for a GPU name or an alias, in any case; None when no file has it."""
    wanted = name.strip().lower()
    profiles = all_profiles()
    for gpu, p in profiles.items():
        if gpu.lower() == wanted:
            return gpu, p
    for gpu, p in profiles.items():
        if wanted in (a.lower() for a in p.get("aliases", [])):
            return gpu, p
    return None
