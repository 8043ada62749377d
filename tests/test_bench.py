"""The benchmark's own CPU self-check: its run loop, WRONG/FAIL/skip handling, the results files, the merge of
runs (a later run replacing the shapes it measured again) and the accounting of work."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_selfcheck_passes_for_every_op_but_the_long_window(monkeypatch, capsys):
    """The self-check in this process, without the sliding-window operator (its reference is checked at a length
    past the 4096-key window, most of the self-check's time; the slow test below runs it)."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.suite import attention
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(attention, "OPS", {n: op for n, op in attention.OPS.items() if n != "window_pf"})
    monkeypatch.setattr(attention, "free", lambda device: None)   # a garbage collection per system: memory only
    attention.selfcheck()
    out = capsys.readouterr().out
    assert "selfcheck passed" in out and "causal_pf   reference (chunked = direct = table)" in out


@pytest.mark.slow
def test_the_benchmark_selfcheck_passes():
    done = subprocess.run([sys.executable, "-m", "bench.suite.attention", "--selfcheck"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "selfcheck passed" in done.stdout
