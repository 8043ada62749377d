"""Proof results kept on disk, so that a compile does not prove every rule again.

sympy takes seconds to discharge the rules' obligations, and their answers only change when an obligation
or the code that proves it changes. Each verdict is stored under a hash of what was asked (the sympy
expression, written out in full; for a rule's whole obligation, the rule and the file that states it) and of
the proving code (symbolic.py, rulebook.py, the ops' sympy forms and the sympy version), so a changed rule or
prover asks again. Each entry carries a keyed hash (HMAC) of its key and answer under a secret made for
this cache: an entry edited by hand, copied from elsewhere or damaged fails the check and is proved again,
never trusted. `neptune-eqsat rules check` always proves afresh (`reproving`), and stores what it finds.

The cache lives in NEPTUNE_EQSAT_PROOF_CACHE (a folder; default ~/.cache/neptune_eqsat/proofs).
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

_LOCK = threading.Lock()
_STATE = {"reprove": False}


def folder() -> Path:
    default = Path.home() / ".cache" / "neptune_eqsat" / "proofs"
    return Path(os.environ.get("NEPTUNE_EQSAT_PROOF_CACHE", default))


@lru_cache(maxsize=None)
def _code() -> str:
    """The proving code: the sympy version (read without importing sympy), the prover, the rule records and the
    ops' sympy forms."""
    from importlib.metadata import version
    here = Path(__file__).resolve().parent
    h = hashlib.sha256(version("sympy").encode())
    for path in (here / "symbolic.py", here / "rulebook.py", here.parent / "ir" / "ops.py"):
        h.update(path.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=None)
def source_digest(path: str) -> str:
    """A hash of one source file: a rule's verdict is kept under the file that states it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _Store:
    def __init__(self, where: Path):
        self.where = where
        self.entries: dict[str, dict] = {}
        self.new: dict[str, dict] = {}
        self.secret = b""
        try:
            self.secret = self._secret()
            self.entries = json.loads((where / "verdicts.json").read_text())
        except (OSError, ValueError):
            self.entries = {}

    def _secret(self) -> bytes:
        self.where.mkdir(parents=True, exist_ok=True)
        path = self.where / "secret"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
        return path.read_bytes()

    def _mac(self, key: str, value) -> str:
        return hmac.new(self.secret, f"{key}|{json.dumps(value, sort_keys=True)}".encode(), "sha256").hexdigest()

    def get(self, key: str):
        entry = self.new.get(key) or self.entries.get(key)
        if not self.secret or not isinstance(entry, dict) or "value" not in entry:
            return None
        if not hmac.compare_digest(str(entry.get("mac", "")), self._mac(key, entry["value"])):
            return None   # edited, copied or damaged: prove again
        return entry["value"]

    def put(self, key: str, value) -> None:
        if self.secret:
            self.new[key] = {"value": value, "mac": self._mac(key, value)}

    def save(self) -> None:
        """Write the new verdicts, joined with what other processes stored meanwhile (atomic replace)."""
        if not self.new:
            return
        with contextlib.suppress(OSError, ValueError):
            path = self.where / "verdicts.json"
            try:
                on_disk = json.loads(path.read_text())
            except (OSError, ValueError):
                on_disk = {}
            on_disk.update(self.new)
            fd, tmp = tempfile.mkstemp(dir=self.where, prefix=".verdicts.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(on_disk, f)
            os.replace(tmp, path)
            self.entries, self.new = on_disk, {}


_STORES: dict[Path, _Store] = {}


def _store() -> _Store:
    where = folder()
    with _LOCK:
        if where not in _STORES:
            _STORES[where] = _Store(where)
        return _STORES[where]


def key(kind: str, question: str) -> str:
    return hashlib.sha256(f"{_code()}|{kind}|{question}".encode()).hexdigest()


def recall(kind: str, question: str, answer):
    """The stored answer to `question`, else answer() (stored for next time). `answer` must return plain JSON
    data."""
    k = key(kind, question)
    store = _store()
    if not _STATE["reprove"]:
        found = store.get(k)
        if found is not None:
            return found
    value = answer()
    store.put(k, value)
    return value


@contextlib.contextmanager
def reproving():
    """Prove everything afresh inside the block (the stored verdicts are replaced by the new ones)."""
    saved = _STATE["reprove"]
    _STATE["reprove"] = True
    try:
        yield
    finally:
        _STATE["reprove"] = saved


@atexit.register
def _save_all() -> None:
    for store in list(_STORES.values()):
        store.save()
