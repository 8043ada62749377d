"""Proof verdicts kept on disk: reused when the question and the prover are the same, never trusted when an
entry was tampered with, and asked afresh under `reproving`."""
import json
import subprocess
import sys

import sympy as sp

from neptune_eqsat.proof import symbolic as proof
from neptune_eqsat.proof import verdicts


def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("NEPTUNE_EQSAT_PROOF_CACHE", str(tmp_path))
    verdicts._STORES.clear()


def counting(answer):
    calls = []

    def ask():
        calls.append(1)
        return answer
    return ask, calls


def test_a_verdict_is_reused_across_processes(monkeypatch, tmp_path):
    isolated(monkeypatch, tmp_path)
    code = ("import sympy as sp; from neptune_eqsat.proof import symbolic as proof; a = sp.Symbol('a', real=True); "
            "print(proof.proves(sp.exp(a) * sp.exp(-a), sp.Integer(1)))")
    env = {"NEPTUNE_EQSAT_PROOF_CACHE": str(tmp_path), "PATH": ""}
    for _ in range(2):
        assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip() == "True"
    stored = json.loads((tmp_path / "verdicts.json").read_text())
    assert len(stored) == 1 and next(iter(stored.values()))["value"] is True


def test_a_tampered_or_foreign_entry_is_proved_again(monkeypatch, tmp_path):
    isolated(monkeypatch, tmp_path)
    ask, calls = counting(False)
    assert verdicts.recall("is_zero", "x - y", ask) is False
    verdicts._save_all()
    path = tmp_path / "verdicts.json"
    stored = json.loads(path.read_text())
    for entry in stored.values():
        entry["value"] = True            # flipped by hand, the keyed hash left as it was
    path.write_text(json.dumps(stored))
    verdicts._STORES.clear()
    assert verdicts.recall("is_zero", "x - y", ask) is False and len(calls) == 2
    (tmp_path / "secret").write_bytes(b"another cache's secret, 32 bytes")   # an entry copied from elsewhere
    verdicts._STORES.clear()
    verdicts._save_all()
    assert verdicts.recall("is_zero", "x - y", ask) is False and len(calls) == 3


def test_reproving_asks_again_and_a_changed_question_is_new(monkeypatch, tmp_path):
    isolated(monkeypatch, tmp_path)
    ask, calls = counting(True)
    verdicts.recall("is_zero", "q1", ask)
    verdicts.recall("is_zero", "q1", ask)
    assert len(calls) == 1
    with verdicts.reproving():
        verdicts.recall("is_zero", "q1", ask)
    verdicts.recall("is_zero", "q2", ask)
    assert len(calls) == 3


def test_the_real_proofs_go_through_the_store(monkeypatch, tmp_path):
    isolated(monkeypatch, tmp_path)
    a, b = sp.symbols("a b", real=True)
    assert proof.proves(sp.exp(a - b), sp.exp(a) * sp.exp(-b))
    assert not proof.proves(sp.exp(a + b), sp.exp(a) + sp.exp(b))
    rep = proof.derive_repair("sum", "mul")
    again = proof.derive_repair.__wrapped__("sum", "mul")   # from the store, not the in-process memo
    assert again == rep and again.proved and again.factor == rep.factor
    assert len(verdicts._store().new) >= 3
