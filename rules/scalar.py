"""Cheaper per-element work: exponentials in base 2 with the log2(e) factor folded into existing constants.

exp(a) = exp2(a * log2 e); the factor then moves through differences, masks (where(p, a, -inf)), the
empty-row guard where(m == -inf, 0, m), running maxima and prev, until it meets the score's scale and folds
into one constant. A difference x - max_j x gets the guard too (guard-partial-max): the cost model prices the
unguarded form as a risk in plans whose maxima are partial. tanh and the logistic function become
logistic2(x) = 1 / (1 + 2^x) (one exp2 and one reciprocal, saturating to 0 or 1 instead of overflowing), whose
argument's factor folds the same way, and a cap that multiplies tanh distributes over 1 - 2 logistic2. A positive
factor also moves out of a maximum and out of a mask's -inf (max-pull-positive-constant, constant-out-of-mask):
the maximum of the raw scores, scaled once per row, leaves the exponent s*k - m*k reading s*k once. Each rule
is proved; which forms win is the cost model's choice.
"""
import functools
import math
from types import SimpleNamespace

from neptune_eqsat.proof.lazy import sympy as sp
from egglog import String, f64, rule, union, var

from neptune_eqsat.ir.eterm import ETerm
from neptune_eqsat.proof.symbolic import SymOps, proves
from neptune_eqsat.proof.rulebook import EggOps, Rule, evaluate_both, make_ruleset

F = "scalar"
LOG2E = 1.0 / math.log(2.0)
NEG_INF = ETerm.const(-math.inf)
C = ETerm.const
a, b, x, p, m = (var(n, ETerm) for n in ("a", "b", "x", "p", "matched"))
k, k2 = var("k", f64), var("k2", f64)
ax = var("ax", String)


@functools.lru_cache(maxsize=None)
def _symbols() -> SimpleNamespace:
    """The obligations' sympy symbols, made on first use (a compile that finds its verdicts in the cache never
    imports sympy)."""
    a, b, c, k, k2, y1, y2 = sp.symbols("a b c k k2 y1 y2", real=True)
    return SimpleNamespace(a=a, b=b, c=c, k=k, k2=k2, y1=y1, y2=y2, ap=sp.Symbol("a'", real=True),
                           kpos=sp.Symbol("k", positive=True))


def _rw(name: str, lhs, rhs, *conds):
    return lambda: [rule(m == lhs, *conds, name=name).then(union(m).with_(rhs))]


def _proved(statement: str, sides):
    """The obligation lhs = rhs, with (lhs, rhs) = sides(symbols) built when it is proved."""
    def check() -> tuple[str, bool]:
        return statement, proves(*sides(_symbols()))
    return check


def _sym_guard(v):
    """where(v == -inf, 0, v) in sympy."""
    return sp.Piecewise((0, sp.Eq(v, -sp.oo)), (v, True))


def _empty_guard_obligation() -> tuple[str, bool]:
    """where(a == -inf, 0, a) * k = where(a*k == -inf, 0, a*k) for k > 0, over the reals and at a = -inf, +inf."""
    s = _symbols()

    def guarded(v, scale_inside: bool):
        return _sym_guard(v * s.kpos) if scale_inside else _sym_guard(v) * s.kpos
    finite = proves(guarded(s.a, False), guarded(s.a, True))
    infinite = all(sp.simplify(guarded(v, False)) == sp.simplify(guarded(v, True)) for v in (-sp.oo, sp.oo))
    return "where(a == -inf, 0, a)*k = where(a*k == -inf, 0, a*k), k > 0, a real or +-inf", finite and infinite


def _mask_scale_obligation() -> tuple[str, bool]:
    """where(c, a*k, -inf) = where(c, a, -inf) * k for k > 0: equal where c holds, and -inf*k = -inf."""
    s = _symbols()   # (the difference of the two sides is -inf - -inf where c fails: compared branch by branch)
    left = sp.Piecewise((s.a * s.kpos, sp.Ne(s.c, 0)), (-sp.oo, True))
    right = sp.piecewise_fold(sp.Piecewise((s.a, sp.Ne(s.c, 0)), (-sp.oo, True)) * s.kpos)
    same = isinstance(right, sp.Piecewise) and len(left.args) == len(right.args) and all(
        cl == cr and (ol == orr or ol.is_finite is not False and proves(ol, orr))
        for (ol, cl), (orr, cr) in zip(left.args, right.args))
    return "where(c, a*k, -inf) = where(c, a, -inf)*k, k > 0", bool(same)


def _partial_max_guard_obligation() -> tuple[str, bool]:
    """x - max_j x = x - where(max_j x == -inf, 0, max_j x): equal for a finite max; where the max is -inf every
    x is -inf, and the written form is undefined (-inf - -inf) while the guarded one is -inf (exp of it 0)."""
    s = _symbols()
    finite = proves(s.a - s.b, s.a - _sym_guard(s.b))
    empty = (-sp.oo - (-sp.oo)) is sp.nan and sp.simplify(-sp.oo - _sym_guard(-sp.oo)) == -sp.oo
    return ("x - m = x - where(m == -inf, 0, m) for m = max_j x finite; at m = -inf (every x -inf) the left "
            "side is undefined and the right -inf"), bool(finite and empty)


def _partial_min_guard_obligation() -> tuple[str, bool]:
    """min_j x - x = where(min_j x == inf, 0, min_j x) - x: equal for a finite min; where the min is +inf every
    x is +inf, and the written form is undefined (inf - inf) while the guarded one is -inf (exp of it 0)."""
    s = _symbols()
    guarded = lambda v: sp.Piecewise((0, sp.Eq(v, sp.oo)), (v, True))   # noqa: E731
    finite = proves(s.b - s.a, guarded(s.b) - s.a)
    empty = (sp.oo - sp.oo) is sp.nan and sp.simplify(guarded(sp.oo) - sp.oo) == -sp.oo
    return ("m - x = where(m == inf, 0, m) - x for m = min_j x finite; at m = inf (every x inf) the left side is "
            "undefined and the right -inf"), bool(finite and empty)


def _tanh_as_logistic2(o, a):
    """tanh(a) = 1 - 2 / (1 + e^(2a)), with e^(2a) = 2^(a * 2 log2 e)."""
    return o.bin("sub", o.const(1.0), o.bin("mul", o.un("logistic2", o.bin("mul", a, o.const(2.0 * LOG2E))),
                                            o.const(2.0)))


def _over_one_plus_exp2(o, a, b):
    return o.bin("div", a, o.bin("add", o.const(1.0), o.un("exp2", b)))


def _times_logistic2(o, a, b):
    return o.bin("mul", a, o.un("logistic2", b))


def guard(v):
    """where(v == -inf, 0, v): a maximum read as 0 when its row is empty."""
    return ETerm.where(ETerm.bin("eq", v, NEG_INF), C(0.0), v)


RULES = [
    Rule("exp-as-exp2", F, "exp(a) = exp2(a * log2 e): the hardware exponential is base 2",
         _rw("exp-as-exp2", ETerm.un("exp", a), ETerm.un("exp2", ETerm.bin("mul", a, C(LOG2E)))),
         _proved("exp(a) = 2**(a / log(2))", lambda s: (sp.exp(s.a), 2 ** (s.a / sp.log(2))))),
    Rule("guarded-exp-as-exp2", F, "exp_or_zero(a) = exp2_or_zero(a * log2 e)",
         _rw("guarded-exp-as-exp2", ETerm.un("exp_or_zero", a),
             ETerm.un("exp2_or_zero", ETerm.bin("mul", a, C(LOG2E)))),
         _proved("exp(a) = 2**(a / log(2)) (overflow to 0 alike)", lambda s: (sp.exp(s.a), 2 ** (s.a / sp.log(2))))),
    Rule("fold-constant-factors", F, "(a * k) * k2 = a * (k*k2)",
         _rw("fold-constant-factors", ETerm.bin("mul", ETerm.bin("mul", a, C(k)), C(k2)),
             ETerm.bin("mul", a, C(k * k2))),
         _proved("(a*k)*k2 = a*(k*k2)", lambda s: ((s.a * s.k) * s.k2, s.a * (s.k * s.k2)))),
    Rule("constant-product", F, "k * k2 = (k*k2): constants multiply before the kernel runs",
         _rw("constant-product", ETerm.bin("mul", C(k), C(k2)), C(k * k2)),
         _proved("k*k2 = (k*k2), one constant computed (in f64) when the rule fires",
                 lambda s: (s.k * s.k2, sp.Mul(s.k, s.k2)))),
    Rule("tanh-as-logistic2", F, "tanh(a) = 1 - 2 logistic2(a * 2 log2 e): one exp2 and a reciprocal, and the "
         "factor folds into the score's scale",
         _rw("tanh-as-logistic2", ETerm.un("tanh", a), _tanh_as_logistic2(EggOps(), a)),
         _proved("tanh(a) = 1 - 2/(1 + 2**(2a / log(2)))",
                 lambda s: (sp.tanh(s.a), 1 - 2 / (1 + 2 ** (2 * s.a / sp.log(2))))),
         evaluate_both(lambda o, a: o.un("tanh", a), _tanh_as_logistic2), 1),
    Rule("logistic2-of-exp2", F, "a / (1 + exp2(b)) = a * logistic2(b): the logistic function (sigmoid) "
         "without an exp2 that may overflow",
         _rw("logistic2-of-exp2", _over_one_plus_exp2(EggOps(), a, b), _times_logistic2(EggOps(), a, b)),
         _proved("a/(1 + 2**b) = a * logistic2(b)",
                 lambda s: (s.a / (1 + 2 ** s.b), s.a * SymOps().un("logistic2", s.b))),
         evaluate_both(_over_one_plus_exp2, _times_logistic2), 2),
    Rule("times-one", F, "1 * a = a", _rw("times-one", ETerm.bin("mul", C(1.0), a), a),
         _proved("1*a = a", lambda s: (1 * s.a, s.a))),
    Rule("constant-over-difference", F, "(a - b) * k = a*k - b*k",
         _rw("constant-over-difference", ETerm.bin("mul", ETerm.bin("sub", a, b), C(k)),
             ETerm.bin("sub", ETerm.bin("mul", a, C(k)), ETerm.bin("mul", b, C(k)))),
         _proved("(a - b)*k = a*k - b*k", lambda s: ((s.a - s.b) * s.k, s.a * s.k - s.b * s.k))),
    Rule("constant-into-mask", F, "where(p, a, k2) * k = where(p, a*k, k2*k): a masked value scales with it",
         _rw("constant-into-mask", ETerm.bin("mul", ETerm.where(p, a, C(k2)), C(k)),
             ETerm.where(p, ETerm.bin("mul", a, C(k)), C(k2 * k))),
         _proved("where(c, a, k2)*k = where(c, a*k, k2*k)",
                 lambda s: (sp.Piecewise((s.a, sp.Ne(s.c, 0)), (s.k2, True)) * s.k,
                            sp.Piecewise((s.a * s.k, sp.Ne(s.c, 0)), (s.k2 * s.k, True))))),
    Rule("constant-into-empty-guard", F, "where(a == -inf, 0, a) * k = where(a*k == -inf, 0, a*k) for k > 0",
         _rw("constant-into-empty-guard", ETerm.bin("mul", guard(a), C(k)), guard(ETerm.bin("mul", a, C(k))),
             k > f64(0.0)),
         _empty_guard_obligation),
    Rule("guard-partial-max", F, "x - max_j x = x - where(max_j x == -inf, 0, max_j x): a rolled block or a "
         "split chunk whose elements are all -inf has a partial max of -inf, and exp(x - max) there must be 0, "
         "not NaN",
         _rw("guard-partial-max", ETerm.bin("sub", x, ETerm.red("max", ax, x)),
             ETerm.bin("sub", x, guard(ETerm.red("max", ax, x)))),
         _partial_max_guard_obligation),
    Rule("guard-partial-min", F, "min_j x - x = where(min_j x == inf, 0, min_j x) - x: a rolled block or a split "
         "chunk whose elements are all +inf (a soft-min's mask) has a partial min of +inf, and exp(min - x) there "
         "must be 0, not NaN",
         _rw("guard-partial-min", ETerm.bin("sub", ETerm.red("min", ax, x), x),
             ETerm.bin("sub", ETerm.where(ETerm.bin("eq", ETerm.red("min", ax, x), C(float("inf"))), C(0.0),
                                          ETerm.red("min", ax, x)), x)),
         _partial_min_guard_obligation),
    Rule("max-push-positive-constant", F, "max_j(x) * k = max_j(x * k) for a constant k > 0",
         _rw("max-push-positive-constant", ETerm.bin("mul", ETerm.red("max", ax, x), C(k)),
             ETerm.red("max", ax, ETerm.bin("mul", x, C(k))), k > f64(0.0)),
         _proved("max(y1, y2)*k = max(y1*k, y2*k), k > 0",
                 lambda s: (sp.Max(s.y1, s.y2) * s.kpos, sp.Max(s.y1 * s.kpos, s.y2 * s.kpos)))),
    # the other way: a maximum over unscaled values, scaled once per row. The exponent x*k - max_j(x)*k then
    # uses x*k once, which compiles to one fused multiply-add per element, where x*k read by the maximum and
    # the difference is a multiply and a subtraction
    Rule("max-pull-positive-constant", F, "max_j(x * k) = max_j(x) * k for a constant k > 0",
         _rw("max-pull-positive-constant", ETerm.red("max", ax, ETerm.bin("mul", x, C(k))),
             ETerm.bin("mul", ETerm.red("max", ax, x), C(k)), k > f64(0.0)),
         _proved("max(y1*k, y2*k) = max(y1, y2)*k, k > 0",
                 lambda s: (sp.Max(s.y1 * s.kpos, s.y2 * s.kpos), sp.Max(s.y1, s.y2) * s.kpos))),
    Rule("constant-out-of-mask", F, "where(p, a*k, -inf) = where(p, a, -inf) * k for a constant k > 0: a masked "
         "score's maximum can be taken before its scale",
         _rw("constant-out-of-mask", ETerm.where(p, ETerm.bin("mul", a, C(k)), NEG_INF),
             ETerm.bin("mul", ETerm.where(p, a, NEG_INF), C(k)), k > f64(0.0)),
         _mask_scale_obligation),
    Rule("prev-of-scaled", F, "prev_j(a) * k = prev_j(a * k)",
         _rw("prev-of-scaled", ETerm.bin("mul", ETerm.prev(ax, a), C(k)), ETerm.prev(ax, ETerm.bin("mul", a, C(k)))),
         _proved("prev_j(a)*k = prev_j(a*k): prev_j reads each running value as the block began (a -> a'), k "
                 "reads none", lambda s: (s.ap * s.k, (s.a * s.k).subs(s.a, s.ap)))),
]

scalar = make_ruleset("scalar", RULES)
