"""JSON files that several processes update (the tuning database, device profiles).

An update reads the whole file, changes it and writes it back under an exclusive lock, through a temporary file
renamed over the old one: concurrent writers merge instead of losing each other's entries, and a reader never
sees a half-written file. Standard library only: the tuning and calibration tools run where the compiler's
dependencies are absent.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable


def read(path: Path) -> dict:
    """The file's object; {} when it does not exist or is not JSON (e.g. cut short by a crash before the rename
    scheme existed)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def update(path: Path, change: Callable[[dict], None]) -> dict:
    """Apply `change` to the file's object in place and write it back atomically; returns the new object."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:   # no POSIX locks: the rename still keeps the file whole
            pass
        data = read(path)
        change(data)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    return data
