"""Where a consumer of the Gluon gradient kernel (gluon_gradients.py) waits for its warpgroup products: a block's
products are issued first and each waited for just before its first use; loads that read nothing computed go
out while they run, and 16-bit tiles that read no product in flight are computed before a wait."""
from __future__ import annotations

import re

from .gluon_gradient_writer import GradientWriter


def block_with_waits(w: GradientWriter, lines: list[str], blk: str) -> list[str]:
    """A block's lines with its products issued first and each waited for before its first use (products
    complete in the order issued)."""
    issued = w.block_products.get(blk, [])
    pending = [var for var, _, _ in issued]
    out = [f"{var} = warpgroup_mma({w.row_tile(rp)}, {w.loop_tile(lp)}.permute((1, 0)), zeros_s, use_acc=False, "
           "is_async=True)" for var, rp, lp in issued]
    # loads that read nothing computed in the block go out while the products run (a load issued after a wait
    # leaves the tensor cores idle for its latency)
    loop = w.s.loop
    made = {m.group(1) for m in (re.match(r"(\w+) = ", x) for x in lines) if m} - {f"offs_{loop}", f"valid_{loop}"}
    early = [x for x in lines if " = gl.load(" in x and not made & (set(re.findall(r"\b\w+\b", x.split(" = ", 1)[1])))]
    lines = [x for x in lines if x not in early]
    offsets = (f"offs_{loop} ", f"valid_{loop} ", "if EVEN:", "else:", f"    valid_{loop} ")
    at = next(k for k, x in enumerate(lines) if not x.startswith(offsets))
    lines = lines[:at] + early + lines[at:]
    while lines:
        line = lines.pop(0)
        waited = [v for v in pending if re.search(rf"\b{v}\b", line)]
        if waited:
            narrowed = _narrowed_before([line] + lines, pending)   # (line reads a product: it is not among them)
            out += narrowed
            lines = [x for x in lines if x not in narrowed]
        for var in waited:
            at = pending.index(var)
            out.append(f"{var} = warpgroup_mma_wait(num_outstanding={len(pending) - at - 1}, deps=({var},))")
            del pending[:at + 1]
        out.append(line)
        m = re.match(r"(\w+) = warpgroup_mma\(", line)
        if m:
            pending.append(m.group(1))
    return out


_NARROWING = re.compile(r"(t\d+) = (\w+\.to\(gl\.(float16|bfloat16)\)|_packed_b?f16_gl\(\w+\))$")


def _narrowed_before(lines: list[str], pending: list[str]) -> list[str]:
    """The lines of the 16-bit tiles among `lines` that read no product in flight, with the lines they need:
    computed before a wait rather than after it, so a tile waits in 16 bits and the fp32 values it came from
    are not held across the wait (a soft-cap's derivative factor from its tanh, beside dS)."""
    defs = {m.group(1): k for k, m in enumerate(re.match(r"(t\d+) = ", x) for x in lines) if m}
    needs: dict[int, set[int] | None] = {}

    def chain(k: int) -> set[int] | None:   # the lines line k needs, or None where one reads a product in flight
        if k not in needs:
            rhs = lines[k].split(" = ", 1)[1]
            names = set(re.findall(r"\b\w+\b", rhs))
            if names & set(pending) or not re.match(r"t\d+ = ", lines[k]):
                needs[k] = None
            else:
                found = {k}
                for d in (defs[n] for n in names if n in defs):
                    sub = chain(d)
                    if sub is None:
                        found = None
                        break
                    found |= sub
                needs[k] = found
        return needs[k]
    picked: set[int] = set()
    for k, x in enumerate(lines):
        if _NARROWING.match(x) and chain(k) is not None:
            picked |= chain(k)
    return [lines[k] for k in sorted(picked)]
