"""bench.suite.attention's CPU self-check (`python -m bench.suite.attention --selfcheck`): the accounting, the
float64 reference against a direct one and a row-by-row table, FlexAttention's mods, the fp16 plain math, and the
whole run loop with stand-in modules, the results files and the merge.

The operator table is read through bench.suite.attention (attention.OPS), the table its run loop uses, so a caller
that narrows it there narrows the self-check too.
"""
import json
import math
import tempfile
from pathlib import Path

import torch

from bench.suite import attention
from bench.suite.attention import parse_args, run_all, short
from bench.suite.attention_ops import (D, SAMPLED, alibi_slopes, attention_math, check_output, check_targets, keep,
                                       pairs, reference, work)
from bench.suite.attention_report import merge
from bench.suite.attention_systems import Case, flex_args

# ---------------------------------------------------------------- CPU self-check

def naive(op, q, k, v, slopes):
    """The operator table written out row by row in numpy float64, independent of attention_math."""
    import numpy as np
    q, k, v, slopes = (t.double().numpy() for t in (q, k, v, slopes))
    B, Hq, Sq, Dh = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    j = np.arange(Skv)
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            for r in range(Sq):
                i = Skv - Sq + r
                s = k[b, kv] @ q[b, h, r] / math.sqrt(Dh)
                if op.mod == "softcap":
                    s = 50 * np.tanh(s / 50)
                if op.mod == "alibi":
                    s = s + slopes[h] * (j - i)
                if op.mask == "causal":
                    s = np.where(i >= j, s, -np.inf)
                if op.mask == "window":
                    s = np.where((i >= j) & (i - j < 4096), s, -np.inf)
                p = np.exp(s - s.max())
                out[b, h, r] = p / p.sum() @ v[b, kv]
    return torch.from_numpy(out)


def selfcheck():
    """On CPU: pairs and bytes against brute force and hand counts, the chunked float64 reference against a direct
    one and against the row-by-row table, FlexAttention's mods (eager) against the reference, the fp16 plain math
    within TOL, and the whole run loop with stand-in modules (one right, one wrong, one missing)."""
    torch.manual_seed(0)
    # accounting
    for mask in (None, "causal", "window"):
        for Sq, Skv in ((37, 37), (1, 53), (4200, 4200), (1, 5000), (10, 4500)):
            i = torch.arange(Sq)[:, None] + (Skv - Sq)
            allowed = keep(mask, i, torch.arange(Skv)[None, :])
            brute = Sq * Skv if allowed is None else int(allowed.sum())
            assert pairs(mask, Sq, Skv) == brute, (mask, Sq, Skv)
    assert pairs("causal", 4, 4) == 10 and pairs("window", 8192, 8192) == 4096 * 4097 // 2 + 4096 * 4096
    assert work(attention.OPS["causal_pf"], 1, 4, 4) == (4 * 32 * 10 * 128, 2 * (2 * 32 * 4 * 128 + 2 * 32 * 4 * 128))
    assert work(attention.OPS["gqa_dc"], 2, 1, 64)[1] == 2 * (2 * 2 * 64 * 1 * 128 + 2 * 2 * 8 * 64 * 128)
    assert work(attention.OPS["gqa_dc"], 2, 1, 64)[0] == 4 * 2 * 64 * 64 * 128
    print("selfcheck: pairs, FLOPs and bytes ok")
    # reference: chunked vs direct vs the table, every op, small head counts with the op's group
    for op in attention.OPS.values():
        group = op.hq // op.hkv
        shapes_ = [(2, 2 * group, 2, 37 if op.mode == "prefill" else 1, 53 if op.mode == "decode" else 37)]
        if op.mask == "window":
            shapes_.append((1, group, 1, 4200, 4200))
        for B, Hq, Hkv, Sq, Skv in shapes_:
            q, k, v = (torch.randn(B, H, S, D) for H, S in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
            slopes = alibi_slopes(Hq, "cpu")
            direct = attention_math(op, q.double(), k.double(), v.double(), slopes.double())
            targets = [(b, h) for b in range(B) for h in range(Hq)]
            chunked = reference(op, q, k, v, slopes, targets, chunk_elems=5 * Skv)
            table = naive(op, q, k, v, slopes)
            for (b, h), r in chunked.items():
                assert torch.allclose(r, direct[b, h], atol=1e-10), (op.name, b, h, "chunked")
                assert torch.allclose(r, table[b, h], atol=1e-10), (op.name, b, h, "table")
            half = attention_math(op, q.half(), k.half(), v.half(), slopes)
            assert check_output(half, chunked, q.shape)[1] is None, (op.name, "fp16 math")
            try:
                from torch.nn.attention.flex_attention import flex_attention
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mod, block_mask, gqa = flex_args(Case(op, q, k, v, slopes, "cpu"))
                    got = flex_attention(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)
                assert (got.double() - direct).abs().max() < 1e-4, (op.name, "flex")
                flex_ok = "flex ok"
            except ImportError as e:
                flex_ok = f"flex not checked ({short(e)})"
        print(f"selfcheck: {op.name:11s} reference (chunked = direct = table), fp16 math ok, {flex_ok}")
    t = check_targets(32, 64, 8192, 8192)
    assert len(t) == SAMPLED == len(set(t)) and t == check_targets(32, 64, 8192, 8192)
    assert all(0 <= b < 32 and 0 <= h < 64 for b, h in t) and len(check_targets(1, 64, 1, 32768)) == 64
    # the run loop on CPU with stand-in modules
    right = ("import math, torch\nNAME = 'stand-in'\nPLAN = 'plain torch'\n"
             "def forward(q, k, v):\n"
             "    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])\n"
             "    return (torch.softmax(s, -1) @ v.float()).half()\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "global_pf.py").write_text(right)
        (Path(tmp) / "causal_pf.py").write_text(right)       # ignores the causal mask: must come out WRONG
        (Path(tmp) / "causal_dc.py").write_text(right)       # decode with no mask: right
        (Path(tmp) / "softcap_dc.py").write_text("def forward(q, k, v):\n    raise RuntimeError('boom')\n")
        args = parse_args(["--ops", "global_pf,causal_pf,alibi_pf,causal_dc,softcap_dc", "--seqs", "64",
                           "--kv", "96", "--modules", tmp, "--out", str(Path(tmp) / "out"),
                           "--systems", "neptune,eager,sdpa_cudnn", "--rounds", "3"])
        calls = {}

        def timer(fn):   # every call's second timing is an outlier the median must drop
            calls[fn] = calls.get(fn, 0) + 1
            return 9.0 if calls[fn] == 2 else 1.0
        results = run_all(args, "cpu", timer=timer, info=dict(device="cpu"))
        status = {(r["op"], r["system"]): r["status"] for r in results["rows"]}
        assert status == {("global_pf", "neptune"): "ok", ("global_pf", "eager"): "ok",
                          ("global_pf", "sdpa_cudnn"): "failed", ("causal_pf", "neptune"): "wrong",
                          ("causal_pf", "eager"): "ok", ("causal_pf", "sdpa_cudnn"): "failed",
                          ("causal_dc", "neptune"): "ok", ("causal_dc", "eager"): "ok",
                          ("causal_dc", "sdpa_cudnn"): "failed", ("softcap_dc", "neptune"): "failed",
                          ("softcap_dc", "eager"): "ok"}, status
        assert [s["op"] for s in results["skipped"]] == ["alibi_pf"]
        timed = [r for r in results["rows"] if r["status"] == "ok"]
        assert all(len(r["round_ms"]) == 3 and r["ms"] == 1.0 for r in timed), timed   # medians, not the 9 ms
        assert results["modules"]["global_pf"]["NAME"] == "stand-in"
        row = next(r for r in results["rows"] if r["op"] == "global_pf" and r["system"] == "neptune")
        assert row["flops"] == 4 * 32 * 64 * 64 * 128 and abs(row["tflops"] - row["flops"] / 1e9) < 1e-9
        saved = json.loads((Path(tmp) / "out" / "results.json").read_text())
        assert len(saved["rows"]) == len(results["rows"])
        assert "| global_pf | 1 | 64 |" in (Path(tmp) / "out" / "results.md").read_text()
        # a later run replaces the rows of the shapes it measured again, and adds the others
        later = dict(saved, rows=[dict(r, ms=7.5) for r in saved["rows"] if r["op"] == "global_pf"])
        (Path(tmp) / "later").mkdir()
        (Path(tmp) / "later" / "results.json").write_text(json.dumps(later))
        merge([Path(tmp) / "out", Path(tmp) / "later"], Path(tmp) / "merged")
        joined = json.loads((Path(tmp) / "merged" / "results.json").read_text())
        assert len(joined["rows"]) == len(results["rows"])
        assert all((r["ms"] == 7.5) == (r["op"] == "global_pf") for r in joined["rows"] if r["ms"] is not None)
        assert joined["summary"]["all"]["neptune_over_best_compiler"]["n"] == 0   # no compiler ran here
    print("selfcheck: run loop, WRONG/FAIL/skip handling, results.json and results.md ok")
    print("selfcheck passed")
