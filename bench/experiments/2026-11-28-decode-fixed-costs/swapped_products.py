"""Does a decode kernel of packed rows (grouped-query: 8 query rows of a key/value head, padded to 16) read its
cache faster when its two products run with the operands swapped? Triton gives a product of 16 rows the
warp-level instruction (mma.sync, operands staged through registers); the transposed product, keys x rows,
has 64+ rows and gets the warpgroup's (wgmma, operands read from shared memory), so pipelined loads could go
straight from the copy to the tensor cores.

    python bench/experiments/2026-11-28-decode-fixed-costs/swapped_products.py GENERATED_DIR OUT_DIR [OPS]

writes OUT_DIR/<op>.py for each decode module (default gqa_dc,softcap_dc): the split kernel's every
`tl.dot(a, b[, acc])` computed as `tl.trans(tl.dot(tl.trans(b), tl.trans(a)[, tl.trans(acc)]))`, the same sums.
Then time both folders with `bench/experiments/2026-11-28-decode-configs/decode_configs.py GENERATED_DIR
OUT_DIR --configs ...` (every output checked against float64 first). Standard library only.
"""
import re
import sys
from pathlib import Path

PRODUCT = re.compile(r"tl\.dot\((\w+), (\w+)\)")
ACCUMULATED = re.compile(r"tl\.dot\((\w+), (\w+), (\w+)\)")


def swapped(source: str, op: str) -> str:
    head, sep, kernel = source.partition(f"def {op}_kernel(")   # the split kernel (not its combine)
    kernel = PRODUCT.sub(r"tl.trans(tl.dot(tl.trans(\2), tl.trans(\1)))", kernel)
    kernel = ACCUMULATED.sub(r"tl.trans(tl.dot(tl.trans(\2), tl.trans(\1), tl.trans(\3)))", kernel)
    return head + sep + kernel


if __name__ == "__main__":
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for op in (sys.argv[3] if len(sys.argv) > 3 else "gqa_dc,softcap_dc").split(","):
        (out / f"{op}.py").write_text(swapped((src / f"{op}.py").read_text(), op))
