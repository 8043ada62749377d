"""Analyses the other families read: the free axes of a value and the axes of the reductions it uses.

They add no e-nodes; they are run to a fixpoint before every rewriting step.
"""
from egglog import String, eq, f64, i64, rule, ruleset, set_, var

from neptune_eqsat.ir.eterm import (AxisSet, ETerm, deps, extent, free, nonpositive, running_max, running_min,
                                    whole_count)

analysis = ruleset(name="analysis")
RULES: list = []  # no rewrites: nothing to prove

e, a, b, c = (var(n, ETerm) for n in "eabc")
s, n, j = (var(x, String) for x in ("s", "n", "j"))
v = var("v", f64)
fa, fb, fc = (var(x, AxisSet) for x in ("fa", "fb", "fc"))
NONE = AxisSet.empty()

for leaf, axes in ((ETerm.axis(n), AxisSet(n)), (ETerm.dim(n), NONE), (ETerm.const(v), NONE), (ETerm.acc(), NONE)):
    analysis.append(rule(e == leaf).then(set_(free(e)).to(axes), set_(deps(e)).to(NONE)))

for table in (free, deps):
    for node in (ETerm.un(s, a), ETerm.cast(s, a), ETerm.prev(s, a)):
        analysis.append(rule(e == node, table(a) == fa).then(set_(table(e)).to(fa)))
    analysis.append(rule(e == ETerm.bin(s, a, b), table(a) == fa, table(b) == fb).then(set_(table(e)).to(fa | fb)))
    analysis.append(rule(e == ETerm.where(a, b, c), table(a) == fa, table(b) == fb, table(c) == fc)
                    .then(set_(table(e)).to(fa | fb | fc)))

analysis.append(rule(e == ETerm.red(s, j, a), free(a) == fa).then(set_(free(e)).to(fa.remove(j))))
analysis.append(rule(e == ETerm.red(s, j, a), deps(a) == fa).then(set_(deps(e)).to(fa.insert(j))))
analysis.append(rule(e == ETerm.roll(s, j, a, b), free(a) == fa).then(set_(free(e)).to(fa.remove(j))))
analysis.append(rule(e == ETerm.roll(s, j, a, b), deps(a) == fa).then(set_(deps(e)).to(fa.insert(j))))
analysis.append(rule(e == ETerm.split(s, j, n, a, b), free(a) == fa).then(set_(free(e)).to(fa.remove(j))))
analysis.append(rule(e == ETerm.split(s, j, n, a, b), deps(a) == fa).then(set_(deps(e)).to(fa.insert(j))))

# Values known to be <= 0, so that exp of them cannot overflow: x - max_j x (also with the max of an empty
# row read as 0), the running max before minus after, constants <= 0, and where/max/min of such values.
M = ETerm.red("max", j, a)
for top in (ETerm.bin("sub", a, M),
            ETerm.bin("sub", a, ETerm.where(ETerm.bin("eq", M, ETerm.const(float("-inf"))), ETerm.const(0.0), M)),
            ETerm.bin("sub", ETerm.prev(j, M), M)):
    analysis.append(rule(e == top).then(set_(nonpositive(e)).to(1)))
MIN = ETerm.red("min", j, a)   # and a soft-min's min_j x - x, guarded or not, and its repair
for top in (ETerm.bin("sub", MIN, a),
            ETerm.bin("sub", ETerm.where(ETerm.bin("eq", MIN, ETerm.const(float("inf"))), ETerm.const(0.0), MIN), a),
            ETerm.bin("sub", MIN, ETerm.prev(j, MIN))):
    analysis.append(rule(e == top).then(set_(nonpositive(e)).to(1)))
analysis.append(rule(e == ETerm.const(v), v <= 0.0).then(set_(nonpositive(e)).to(1)))
analysis.append(rule(e == ETerm.where(c, a, b), eq(nonpositive(a)).to(i64(1)), eq(nonpositive(b)).to(i64(1)))
                .then(set_(nonpositive(e)).to(1)))
for fn in ("max", "min", "add"):
    analysis.append(rule(e == ETerm.bin(fn, a, b), eq(nonpositive(a)).to(i64(1)), eq(nonpositive(b)).to(i64(1)))
                    .then(set_(nonpositive(e)).to(1)))
analysis.append(rule(e == ETerm.bin("mul", a, ETerm.const(v)), eq(nonpositive(a)).to(i64(1)), v >= 0.0)
                .then(set_(nonpositive(e)).to(1)))

analysis.append(rule(e == ETerm.dim(n), eq(extent(j)).to(n)).then(set_(whole_count(e)).to(1)))

# Maxima that are -inf while every element seen is -inf: a partial max in a rolled block or a split chunk, and
# what the scalar rules make of one (a positive multiple, the value as a block began).
for top in (ETerm.red("max", j, a), ETerm.roll("max", j, a, b), ETerm.split("max", j, n, a, b)):
    analysis.append(rule(e == top).then(set_(running_max(e)).to(1)))
analysis.append(rule(e == ETerm.bin("mul", a, ETerm.const(v)), eq(running_max(a)).to(i64(1)), v > 0.0)
                .then(set_(running_max(e)).to(1)))
analysis.append(rule(e == ETerm.prev(j, a), eq(running_max(a)).to(i64(1))).then(set_(running_max(e)).to(1)))
# and minima, +inf while every element seen is +inf (a soft-min's min_j x - x)
for top in (ETerm.red("min", j, a), ETerm.roll("min", j, a, b), ETerm.split("min", j, n, a, b)):
    analysis.append(rule(e == top).then(set_(running_min(e)).to(1)))
analysis.append(rule(e == ETerm.bin("mul", a, ETerm.const(v)), eq(running_min(a)).to(i64(1)), v > 0.0)
                .then(set_(running_min(e)).to(1)))
analysis.append(rule(e == ETerm.prev(j, a), eq(running_min(a)).to(i64(1))).then(set_(running_min(e)).to(1)))
