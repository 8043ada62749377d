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


def test_a_compile_whose_rules_are_unchanged_proves_nothing_and_never_imports_sympy(tmp_path):
    """The first process proves the rules and derives the repairs (sympy); the second finds every verdict on
    disk, keyed by the rules' own files, and compiles the same kernel without importing sympy."""
    code = ("import sys; from neptune_eqsat.compiler import optimize; r = optimize(sys.argv[1]); "
            "print('sympy' in sys.modules, r.chosen.family, hash(r.source))")
    env = {"NEPTUNE_EQSAT_PROOF_CACHE": str(tmp_path), "PATH": "", "PYTHONHASHSEED": "0"}
    spec = str(__import__("conftest").SPECS / "softmax.py")
    first, second = (subprocess.run([sys.executable, "-c", code, spec], env=env, capture_output=True, text=True,
                                    check=True).stdout.split() for _ in range(2))
    assert first[0] == "True" and second[0] == "False"
    assert first[1:] == second[1:] == [first[1], first[2]] and first[1] == "rolled"


def test_a_rule_is_proved_again_when_the_file_that_states_it_changes(monkeypatch, tmp_path):
    from neptune_eqsat.proof import rulebook
    from neptune_eqsat.proof.rulebook import identity
    isolated(monkeypatch, tmp_path)
    source = tmp_path / "my_rules.py"
    source.write_text("def lhs(o, a, b): return o.bin('mul', a, b)\ndef rhs(o, a, b): return o.bin('mul', b, a)\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    calls = []
    real = rulebook.proves
    monkeypatch.setattr(rulebook, "proves", lambda *a: (calls.append(1), real(*a))[1])

    def fresh():
        return identity("my-commute", "algebra", "a * b = b * a", namespace["lhs"], namespace["rhs"], 2)

    assert fresh().proof[1] and fresh().proof[1] and len(calls) == 1   # the second from the store
    source.write_text(source.read_text() + "# edited\n")
    verdicts.source_digest.cache_clear()
    assert fresh().proof[1] and len(calls) == 2
