"""The backward's stages (autodiff.py): values no larger than the forward's output, computed once per row by
kernels of their own (or written by the forward kernel) and read by the gradient kernels.

Three things move work out of a gradient kernel's loop:

* **Reductions no larger than the output** (a row max, a row sum, `D_i = sum_e dO * O`) become stages.
* **A positive row scale absorbed into an exponential.** Where a gradient kernel's per-element work divides by
  a positive row value `v` of the stages (the softmax's row sum) beside an exponential, the division moves into
  the exponent: `exp(u) / v = exp(u - log v)`, and `(a + b / v) * exp(u) = (a v + b) * exp(u - log v)`, with
  `a v` and the exponent's stage part (`m + log v`) computed once per row. For attention this turns the
  derived `P = exp(s - m) / l`, `dS = (dP / l - D / l) * exp(s - m)` into FlashAttention's `P = exp(s - lse)`,
  `dS = P (dP - D)`: the kernels read one row statistic where they read two, and compute no reciprocal. The
  stage holds the shift in base 2, each of its terms scaled by log2 e on its own (`m log2 e + log2 l`): the
  forward's kernel already keeps `m log2 e` (its exponentials are exp2), so a training forward writes the
  logsumexp from that max rather than a second one, and the gradient kernels subtract it as it is.
  Applied only where it removes every division by `v` and `v` is provably non-negative (where `v` is 0 the
  original is not finite either); the shift takes log v as 0 there, so that a row the mask empties, whose
  adjoint a guard sets to 0, stays 0 rather than exp(-inf - -inf).
* **Math on stages alone along the loop axis** (a guarded row value, a row value times a constant) becomes a
  stage: inside the loop such a value is a vector along the loop axis, which every thread computes again for
  each block it holds.
"""
from __future__ import annotations

import math

from neptune_eqsat import ir
from neptune_eqsat.frontend.spec import Spec
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.products import products
from neptune_eqsat.plan.stages import Stage, fresh_name, stage_dtype, sub_spec, tensor_of

LOG2E = 1 / math.log(2)
NONNEG_UNARY = ("exp", "exp2", "sqrt", "abs", "exp_or_zero", "exp2_or_zero")


def sub_spec_in_products(spec: Spec, name: str, term: Term, axes: tuple[str, ...], extra: dict) -> Spec:
    """A part of the backward: `term` in matrix-product form (`products.py`), computed by its own spec."""
    dtypes = {n: t.dtype for n, t in spec.inputs.items()} | {n: d for n, (d, _) in extra.items()}
    return sub_spec(spec, name, products(term, dtypes), axes, extra, f"part of the backward pass of {spec.name}")


class Stager:
    """Replaces each reduction no larger than the output (free axes among the output's) by a read of a stage
    that computes it once: saved values of the forward (a row max, a row sum) and row statistics of the
    adjoint. A stage's own spec reads the stages inside it, so none is computed twice."""

    def __init__(self, spec: Spec, bw, extra: dict, grad_name: str):
        self.spec, self.bw, self.extra, self.grad_name = spec, bw, extra, grad_name
        self.out_axes = set(spec.output_axes)
        self.done: dict[Term, Term] = {}    # a stage's value -> its read
        self.terms: dict[str, Term] = {}    # stage -> its value (reading other stages), as its spec computes it
        self.saved: dict[str, Term] = {}    # saved stage -> its value as the forward has it

    def replace(self, t: Term) -> Term:
        if t.op == "red" and t.free <= self.out_axes:
            return self.stage(t)
        if not t.args:
            return t
        return Term(t.op, t.attrs, tuple(self.replace(a) for a in t.args), t.origin)

    def stage(self, r: Term) -> Term:
        """A read of the stage computing r: a reduction, or math on other stages."""
        if r not in self.done:
            inner = Term(r.op, r.attrs, (self.replace(r.args[0]),), r.origin) if r.op == "red" else r
            axes = tuple(a for a in self.spec.output_axes if a in r.free)
            reads = {x.attrs[0] for x in ir.walk(inner) if x.op == "load"}
            reads_grad = self.grad_name in reads or not reads <= set(self.saved) | set(self.spec.inputs)
            name = fresh_name(self.spec, f"{'stat' if reads_grad else 'saved'}{len(self.bw.stages)}", self.extra)
            self.bw.stages.append(Stage(name, sub_spec_in_products(self.spec, name, inner, axes, self.extra), axes))
            self.extra[name] = tensor_of(self.spec, axes, stage_dtype(self.spec))
            self.terms[name] = self.bw.stages[-1].spec.output_term   # (in matrix-product form)
            what = "a row statistic of the adjoint" if reads_grad else "a value of the forward, saved"
            if not reads_grad:   # as the forward has it: the stages it reads replaced by their values
                self.saved[name] = ir.substitute(r, {load: self.saved[load.attrs[0]] for load in self.done.values()
                                                     if load.attrs[0] in self.saved})
            self.bw.notes.append(f"{name}[{', '.join(axes)}] = {ir.show(r)[:90]}: {what}, computed once")
            self.done[r] = ir.load(name, *(ir.axis(a) for a in axes))
        return self.done[r]

    # ---- moving work out of a gradient kernel's loop ----------------------------------------------------------
    def out_of_loop(self, t: Term, loop: str) -> Term:
        """t (a gradient kernel's summand, the kernel looping over `loop`) with its row scales absorbed into its
        exponentials and its math on stages along the loop axis read from stages."""
        for v in dict.fromkeys(x.args[1] for x in ir.walk(t) if _is_div(x) and self._scale(x.args[1])):
            absorbed = self._absorbed(t, v)
            if absorbed is not None and not any(_is_div(x) and x.args[1] == v for x in ir.walk(absorbed)):
                note = f"{ir.show(v)[:60]}: a row scale absorbed into the exponentials (non-negative)"
                if note not in self.bw.notes:
                    self.bw.notes.append(note)
                t = absorbed
        return self.hoist(t, loop)

    def hoist(self, t: Term, loop: str) -> Term:
        """t with its math on stages alone that varies along `loop` read from stages of its own. (A division by
        such a value stays one: as a product with a reciprocal read from a stage, the reciprocal could be rounded
        to 16 bits on its own where the product meets the tensor cores, products.py.)"""
        if t.op in ("load", "const", "axis", "dim") or loop not in t.free:
            return t
        if t.op == "bin" and t.attrs[0] == "mul" and {a.op for a in t.args} == {"load", "const"}:
            return t   # a stage read times a constant: the e-graph folds the constant into the kernel's own
        if self._on_stages(t):
            return self.stage(t)
        return Term(t.op, t.attrs, tuple(self.hoist(a, loop) for a in t.args), t.origin)

    def _on_stages(self, t: Term) -> bool:
        """Is t a computation on stages and constants alone?"""
        if t.op == "load":
            return t in self.done.values()
        return t.op == "const" or (t.op not in ("red", "axis", "dim") and bool(t.args)
                                   and all(self._on_stages(a) for a in t.args))

    def _scale(self, v: Term) -> bool:
        """A row value of the stages, provably non-negative: a scale that can move into an exponent."""
        return self._on_stages(v) and v.op != "const" and self._nonneg(v)

    def _nonneg(self, t: Term) -> bool:
        if t.op == "const":
            return t.attrs[0] >= 0
        if t.op == "load":
            name = t.attrs[0]
            return name in self.terms and self._nonneg(self.terms[name])
        if t.op == "un":
            return t.attrs[0] in NONNEG_UNARY
        if t.op in ("red", "cast"):
            return (t.op == "cast" or t.attrs[0] in ("sum", "max", "min")) and self._nonneg(t.args[0])
        if t.op == "bin":
            return t.attrs[0] in ("add", "mul", "div", "max", "min") and all(self._nonneg(a) for a in t.args)
        if t.op == "where":
            return self._nonneg(t.args[1]) and self._nonneg(t.args[2])
        return False

    def _absorbed(self, t: Term, v: Term) -> Term | None:
        """t with `exp(u) / v` as exp(u - log v) and `a * exp(u)` as `(a v) * exp(u - log v)` where a divides
        by v (a / v times v cancels); None where nothing changed."""
        def go(x: Term) -> Term:
            if _is_div(x) and x.args[1] == v and _exponential(x.args[0]):
                return self._shifted(go(x.args[0]), v)
            if x.op == "bin" and x.attrs[0] == "mul":
                for e, a in ((x.args[1], x.args[0]), (x.args[0], x.args[1])):
                    if _exponential(e) and any(_is_div(y) and y.args[1] == v for y in ir.walk(a)):
                        scaled = self._times(a, v)
                        if scaled is not None:
                            return ir.bin("mul", go(scaled), self._shifted(go(e), v))
            return Term(x.op, x.attrs, tuple(go(a) for a in x.args), x.origin) if x.args else x
        out = go(t)
        return None if out == t else out

    def _times(self, a: Term, v: Term) -> Term | None:
        """a * v with the division by v cancelled, or None where a is not of that form; casts only round, so
        they are dropped (the product's operands are rounded again where they meet the tensor cores)."""
        if a.op == "cast":
            return self._times(a.args[0], v)
        if _is_div(a) and a.args[1] == v:
            return a.args[0]
        if a.op == "bin" and a.attrs[0] in ("add", "sub"):
            parts = [self._times(x, v) for x in a.args]
            return None if None in parts else ir.bin(a.attrs[0], *parts)
        if a == ir.const(0.0):
            return a
        if self._on_stages(a):   # a value of the stages: one stage of a v
            return self.stage(self._times_value(a, v))
        if a.op == "where":   # where(c, x, y) v = where(c, x v, y v)
            parts = [self._times(x, v) for x in a.args[1:]]
            return None if None in parts else ir.where(a.args[0], *parts)
        if a.op == "red" and a.attrs[0] == "sum" and a.attrs[1] not in v.free:   # (sum_e x) v = sum_e x v
            inner = self._times(a.args[0], v)
            return None if inner is None else Term(a.op, a.attrs, (inner,), a.origin)
        if a.op == "un" and a.attrs[0] == "neg":
            inner = self._times(a.args[0], v)
            return None if inner is None else ir.un("neg", inner)
        if a.op == "bin" and a.attrs[0] == "mul":
            for k in (0, 1):
                inner = self._times(a.args[k], v)
                if inner is not None:
                    return ir.bin("mul", *(inner if j == k else a.args[j] for j in (0, 1)))
            return None
        return None

    def _times_value(self, a: Term, v: Term) -> Term:
        """a v for a value a of the stages, through its selections, cancelled where a stage divides by v."""
        if a == ir.const(0.0):
            return a
        if a.op == "where":
            return ir.where(a.args[0], *(self._times_value(x, v) for x in a.args[1:]))
        term = self.terms.get(a.attrs[0]) if a.op == "load" else None
        return term.args[0] if term is not None and _is_div(term) and term.args[1] == v else ir.bin("mul", a, v)

    def _shifted(self, e: Term, v: Term) -> Term:
        """exp(u) (under casts) as exp(u - log v), the exponent's terms on stages gathered into one stage that
        holds them in base 2 (see the module's docstring)."""
        if e.op == "cast":
            return ir.cast(e.attrs[0], self._shifted(e.args[0], v))
        fn, u = e.attrs[0], e.args[0]
        natural = fn in ("exp", "exp_or_zero")   # the stage holds the shift in base 2, each term scaled on its own
        terms = _signed_terms(u)
        staged = [(s, x) for s, x in terms if self._on_stages(x)]
        rest = [(s, x) for s, x in terms if not self._on_stages(x)]
        # log2 v, less the exponent's terms on stages; 0 where v is: a row whose every exponential is 0 (all masked)
        # keeps a finite shift, since exp(where(mask, s, -inf) - shift) is 0 there only while the shift is finite
        # (rules/algebra.py mask-absorbed-by-exp; a shift of -inf made those zeros NaN)
        shift = ir.where(ir.bin("eq", v, ir.const(0.0)), ir.const(0.0),
                         ir.bin("mul", ir.un("log", v), ir.const(LOG2E)))
        for s, x in staged:
            shift = ir.bin("sub" if s > 0 else "add", shift, ir.bin("mul", x, ir.const(LOG2E)) if natural else x)
        out = None
        for s, x in rest:
            out = (x if s > 0 else ir.un("neg", x)) if out is None else ir.bin("add" if s > 0 else "sub", out, x)
        read = self.stage(shift)
        return ir.un(fn, ir.bin("sub", out if out is not None else ir.const(0.0),
                                ir.bin("mul", read, ir.const(math.log(2))) if natural else read))


def _is_div(t: Term) -> bool:
    return t.op == "bin" and t.attrs[0] == "div"


def _exponential(t: Term) -> bool:
    while t.op == "cast":
        t = t.args[0]
    return t.op == "un" and t.attrs[0] in ("exp", "exp2", "exp_or_zero", "exp2_or_zero")


def _signed_terms(u: Term, sign: int = 1) -> list[tuple[int, Term]]:
    """u as a sum of signed terms (over add, sub and neg)."""
    if u.op == "bin" and u.attrs[0] in ("add", "sub"):
        return _signed_terms(u.args[0], sign) + _signed_terms(u.args[1], sign if u.attrs[0] == "add" else -sign)
    if u.op == "un" and u.attrs[0] == "neg":
        return _signed_terms(u.args[0], -sign)
    return [(sign, u)]
