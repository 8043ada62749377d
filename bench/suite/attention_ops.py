"""The attention benchmark's operators and what is checked and counted of them: the operator table, the shared
semantics (masks, score mods, the plain math), the float64 reference and the output check, the work of a shape.

bench.suite.attention runs them; the systems (bench.suite.attention_systems) and the reporting
(bench.suite.attention_report) build on this module.
"""
import math
from dataclasses import dataclass

try:
    import torch
except ImportError:  # --help still works; running says what is missing
    torch = None

D, WINDOW, CAP, TOL = 128, 4096, 50.0, 2e-2
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16} if torch is not None else {}
TOLS = {"fp16": TOL, "bf16": 5e-2}   # bf16 keeps 8 bits of mantissa to fp16's 11
DTYPE = "fp16"   # the inputs' dtype of a run (--dtype)
FULL_CHECK = 2 ** 27     # B*Hq*Sq*Skv up to which every (batch, head) is checked against float64
SAMPLED = 4              # otherwise this many fixed random (batch, head) pairs, all their query rows
REF_CHUNK = 2 ** 25      # float64 score elements per reference chunk (256 MiB)


@dataclass(frozen=True)
class Op:
    name: str
    mode: str            # "prefill" (Sq = Skv = S) or "decode" (Sq = 1 at position Skv - 1)
    hq: int
    hkv: int
    mask: str | None     # None, "causal" (i >= j) or "window" (i >= j and i - j < WINDOW)
    mod: str | None      # None, "alibi" (s + slope[h] * (j - i)) or "softcap" (CAP * tanh(s / CAP))


OPS = {op.name: op for op in [
    Op("global_pf", "prefill", 32, 32, None, None),
    Op("causal_pf", "prefill", 32, 32, "causal", None),
    Op("gqa_pf", "prefill", 64, 8, "causal", None),
    Op("alibi_pf", "prefill", 32, 32, "causal", "alibi"),
    Op("softcap_pf", "prefill", 32, 16, "causal", "softcap"),
    Op("window_pf", "prefill", 32, 8, "window", "softcap"),
    Op("causal_dc", "decode", 32, 32, None, None),
    Op("gqa_dc", "decode", 64, 8, None, None),
    Op("alibi_dc", "decode", 32, 32, None, "alibi"),
    Op("softcap_dc", "decode", 32, 16, None, "softcap"),
]}
SYSTEMS = ["neptune", "flex", "inductor", "sdpa_cudnn", "sdpa_flash", "sdpa_mem_eff", "eager", "neptune_api", "fa4"]
DEFAULT_SYSTEMS = SYSTEMS[:-3]
COMPILERS = ("flex", "inductor")   # best compiler = the faster of these two
UNITS = {"prefill": "TFLOP/s", "decode": "GB/s"}


# ---------------------------------------------------------------- semantics (shared by every system and the reference)

def keep(mask, i, j):
    """Whether query position i may attend to key position j (tensors); None when nothing is masked."""
    if mask == "causal":
        return i >= j
    if mask == "window":
        return (i >= j) & (i - j < WINDOW)
    return None


def score_mod(mod, s, slope, i, j):
    """The score modification, applied to scores already scaled by 1/sqrt(D), at query i, key j."""
    if mod == "alibi":
        return s + slope * (j - i)
    if mod == "softcap":
        return CAP * torch.tanh(s / CAP)
    return s


def attention_math(op, q, k, v, slopes, q_offset=None):
    """The plain math in q's dtype with fp32 scores (float64 stays float64): eager, inductor and the reference.
    q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D], slopes [Hq]; query row r sits at position q_offset + r
    (default Skv - Sq: prefill rows at 0.., a decode row at Skv - 1)."""
    Sq, Skv = q.shape[-2], k.shape[-2]
    if q_offset is None:
        q_offset = Skv - Sq
    if k.shape[1] != q.shape[1]:   # query head h reads kv head h // (Hq / Hkv)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = q @ k.transpose(-1, -2)
    s = (s if s.dtype == torch.float64 else s.float()) / math.sqrt(q.shape[-1])
    i = torch.arange(Sq, device=q.device)[:, None] + q_offset
    j = torch.arange(Skv, device=q.device)[None, :]
    s = score_mod(op.mod, s, slopes.to(s.dtype)[:, None, None], i, j)
    allowed = keep(op.mask, i, j)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1).to(q.dtype) @ v


def alibi_slopes(hq, device):
    return torch.tensor([2 ** (-8 * (h + 1) / hq) for h in range(hq)], device=device, dtype=torch.float32)


# ---------------------------------------------------------------- reference and check

def check_targets(B, Hq, Sq, Skv):
    """The (batch, head) pairs checked: all of them for small shapes, else SAMPLED fixed random ones."""
    if B * Hq * Sq * Skv <= FULL_CHECK:
        return [(b, h) for b in range(B) for h in range(Hq)]
    picked = torch.randperm(B * Hq, generator=torch.Generator().manual_seed(1234))[:SAMPLED].sort().values
    return [(int(x) // Hq, int(x) % Hq) for x in picked]


def reference(op, q, k, v, slopes, targets, chunk_elems=REF_CHUNK):
    """float64 outputs {(b, h): [Sq, D]} for the targets, computed per head in query chunks of chunk_elems scores."""
    Sq, Skv = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    rows = max(1, chunk_elems // Skv)
    refs = {}
    for b, h in targets:
        kh = k[b, h // group].double()[None, None]
        vh = v[b, h // group].double()[None, None]
        slope = slopes[h:h + 1].double()
        refs[(b, h)] = torch.cat([
            attention_math(op, q[b, h, r:r + rows].double()[None, None], kh, vh, slope, q_offset=Skv - Sq + r)[0, 0]
            for r in range(0, Sq, rows)])
    return refs


def check_output(out, refs, shape):
    """(max abs error over the checked heads, None) or (error or None, why the output is wrong)."""
    if not torch.is_tensor(out):
        return None, f"returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(shape):
        return None, f"shape {tuple(out.shape)}, expected {tuple(shape)}"
    if out.dtype != DTYPES[DTYPE]:
        return None, f"dtype {out.dtype}, expected {DTYPES[DTYPE]}"
    err = torch.stack([(out[b, h].double() - r).abs().max() for (b, h), r in refs.items()]).max().item()
    tol = TOLS[DTYPE]
    return err, None if err <= tol else f"max abs error {err:.3g} > {tol}"   # NaN fails too


# ---------------------------------------------------------------- metrics

def pairs(mask, Sq, Skv):
    """Unmasked (query, key) pairs; query row r sits at position Skv - Sq + r."""
    if mask is None:
        return Sq * Skv
    width = WINDOW if mask == "window" else Skv
    return sum(min(i + 1, width) for i in range(Skv - Sq, Skv))


def work(op, B, Sq, Skv):
    """(useful FLOPs 4*B*Hq*pairs*D, bytes of Q, K, V and O in fp16)."""
    flops = 4 * B * op.hq * pairs(op.mask, Sq, Skv) * D
    nbytes = 2 * (2 * B * op.hq * Sq * D + 2 * B * op.hkv * Skv * D)
    return flops, nbytes


def metric(row):
    return row["tflops"] if row["mode"] == "prefill" else row["gbs"]

