"""The benchmark's own CPU self-check: its run loop, WRONG/FAIL/skip handling, the results files, the merge of
runs (a later run replacing the shapes it measured again) and the accounting of work."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_selfcheck_passes():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--selfcheck"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "selfcheck passed" in done.stdout
