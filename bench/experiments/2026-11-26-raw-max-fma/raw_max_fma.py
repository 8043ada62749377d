"""Does the Gluon prefill kernel gain from FlashAttention-3's per-element form of the softmax? Its row max is
taken over the raw scores and scaled once per row (c * max(s) = max(c * s) exactly for c > 0, rounding being
monotone), so that each element's exponent s * c - m has a multiply used once, which the compiler contracts with
the subtraction into one fused multiply-add (FFMA) instead of a multiply and a subtraction:

With --ftz instead (or --both), every exp2 of the consumer is the flush-to-zero form (`ex2.approx.ftz.f32`, one
MUFU instruction, as FlashAttention compiles with fast math), which differs from IEEE exp2 only in results below
2^-126, flushed to 0:

    PYTHONPATH=. python bench/experiments/2026-11-26-raw-max-fma/raw_max_fma.py bench/generated/global_pf.py OUT_DIR [--ftz|--both]
    python -m bench.tools.compare_modules --before DIR_OF_THE_MODULE --after OUT_DIR --ops global_pf

writes OUT_DIR/<module name> with the consumer of the Gluon kernel edited (every key loop). Imports only the
standard library.
"""
import re
import sys
from pathlib import Path

SCALED = r"(?P<ind>\n\s+)(?P<t>t\d+) = \(qk \* (?P<c>[0-9.e-]+)\)(?P=ind)"
MASKED = re.compile(SCALED + r"(?P<w>t\d+) = gl.where\(valid_j\[None, :\], (?P=t), float\('-inf'\)\)(?P=ind)"
                    r"r1 = gl.maximum\(r1, gl.max\((?P=w), axis=1\)\)")
UNMASKED = re.compile(SCALED + r"r1 = gl.maximum\(r1, gl.max\((?P=t), axis=1\)\)")


def edit(consumer: str) -> str:
    scaled = {}

    def masked(m):
        scaled[m["t"]] = m["c"]
        return (f"{m['ind']}{m['w']} = gl.where(valid_j[None, :], qk, float('-inf'))"
                f"{m['ind']}r1 = gl.maximum(r1, gl.max({m['w']}, axis=1) * {m['c']})")

    def unmasked(m):
        scaled[m["t"]] = m["c"]
        return f"{m['ind']}r1 = gl.maximum(r1, gl.max(qk, axis=1) * {m['c']})"
    consumer = UNMASKED.sub(unmasked, MASKED.sub(masked, consumer))
    for t, c in scaled.items():   # the exponent's argument: the scaled score, recomputed where it is used
        consumer = consumer.replace(f"({t} - ", f"(qk * {c} - ")
    assert scaled, "no scaled score feeding a row max in the consumer: not the form this edit addresses"
    return consumer


FTZ_EXP2 = '''@gluon.jit
def _exp2_ftz(x):
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


'''


def main():
    module, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), (sys.argv[3:] or ["--raw-max"])[0]
    src = module.read_text()
    name = module.stem
    a, b = src.index(f"def {name}_consumer"), src.index(f"def {name}_gluon_kernel")
    consumer = src[a:b]
    if mode in ("--raw-max", "--both"):
        consumer = edit(consumer)
    helper = ""
    if mode in ("--ftz", "--both"):
        consumer, helper = consumer.replace("gl.exp2(", "_exp2_ftz("), FTZ_EXP2
    decorator = src.rindex("@gluon.jit", 0, a)   # the helper goes above the consumer and its decorator
    out.mkdir(parents=True, exist_ok=True)
    (out / module.name).write_text(src[:decorator] + helper + src[decorator:a] + consumer + src[b:])


if __name__ == "__main__":
    main()
