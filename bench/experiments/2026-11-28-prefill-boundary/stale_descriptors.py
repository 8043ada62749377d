"""Does ptxas reuse a matrix-product descriptor across a skipped key loop? Reads the SASS of a compiled Gluon
prefill kernel (cuobjdump -sass) and, for every A B^T group after a consumer's first, finds the branch that skips
the loop before it: where that skipped loop's preheader sets the register of the second k-step's descriptor
and nothing on the path from the branch's target sets it again, the group multiplies from a stale descriptor
(what made the two buffers of A fault with ptxas 12.8: results/h200/2026-11-28-output-buffer/ptxas_bisect.txt).

    python bench/experiments/2026-11-28-prefill-boundary/stale_descriptors.py KERNEL.sass

A heuristic over the SASS text, standard library only: it flags the faulting build and passes the 12.9 build of
the same kernel and the kernels that run correctly, which is all it was checked on.
"""
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def instructions(sass: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.search, sass.splitlines()) if m]


def product_groups(ins):
    """(first, second) instruction indexes of each A B^T group: its first k-step (no accumulator in) and the
    next k-step reading both operands from shared memory."""
    groups = []
    for k, (_, text) in enumerate(ins):
        if "HGMMA" in text and "RZ, !UPT" in text:
            groups.append([k])
        elif groups and len(groups[-1]) == 1 and re.search(r"HGMMA.*gdesc\[UR\d+\], R\d+$", text):
            groups[-1].append(k)
    return [g for g in groups if len(g) == 2]


def stale_groups(ins) -> list[str]:
    found = []
    groups = product_groups(ins)
    for before, (first, second) in zip(groups, groups[1:]):
        reg = int(re.search(r"gdesc\[UR(\d+)\]", ins[second][1]).group(1))
        skips = [(a, int(m.group(1), 16)) for a, text in ins[:before[0]]
                 for m in [re.search(r"BRA (0x[0-9a-f]+)", text)]
                 if m and ins[before[0]][0] < int(m.group(1), 16) <= ins[first][0]]
        if not skips:
            continue
        branch, target = min(skips, key=lambda s: s[1])
        sets = re.compile(rf"(@!?U?P\d+ )?\S+ UR({reg}|{reg + 1}),")

        def set_in(lo, hi):
            return any(lo <= a < hi and sets.match(text) for a, text in ins)
        if set_in(branch, target) and not set_in(target, ins[second][0]):
            found.append(f"A B^T at {ins[first][0]:#x}: UR{reg} set only in the loop skipped from {branch:#x}")
    return found


if __name__ == "__main__":
    stale = stale_groups(instructions(open(sys.argv[1]).read()))
    print("\n".join(stale) or "no stale descriptors")
    sys.exit(1 if stale else 0)
