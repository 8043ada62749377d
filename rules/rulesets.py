"""The families' egglog rulesets, of the proved rules of each family module, and the list of every rule."""
from neptune_eqsat.proof.rulebook import RuleDeclarationError, make_ruleset

from .algebra import RULES as ALGEBRA, algebra
from .reduction import RULES as REDUCTION, reduction
from .moments import RULES as MOMENTS, SPLIT_RULES as MOMENT_SPLITS
from .rolling import RULES as ROLLING
from .scalar import RULES as SCALAR, scalar
from .splitk import RULES as SPLITK
from .statistics import RULES as STATISTICS
from .substitution import RULES as SUBSTITUTION, substitution

ROLLING = ROLLING + MOMENTS   # the moments' rolling update runs in the rolling family's step
rolling = make_ruleset("rolling", ROLLING)
SPLITK = SPLITK + MOMENT_SPLITS
splitk = make_ruleset("splitk", SPLITK)

FAMILIES = {"algebra": (algebra, ALGEBRA), "reduction": (reduction, REDUCTION),
            "substitution": (substitution, SUBSTITUTION), "rolling": (rolling, ROLLING), "scalar": (scalar, SCALAR),
            "splitk": (splitk, SPLITK)}
# rules applied to terms outside the e-graph (by the stager), proved and checked as the others are
TERM_FAMILIES = {"statistics": STATISTICS}
ALL_RULES = ALGEBRA + REDUCTION + SUBSTITUTION + ROLLING + SCALAR + SPLITK + STATISTICS


def _names_once(rules) -> None:
    """Each rule name once: egglog refuses a second rule of a name (a panic, at the first compile), and the
    command line selects rules by name."""
    seen: dict[str, str] = {}
    for r in rules:
        if r.name in seen:
            raise RuleDeclarationError(f"rule {r.name!r} is declared twice (families {seen[r.name]} and "
                                       f"{r.family}): give the new rule a name of its own, or remove the old one")
        seen[r.name] = r.family


_names_once(ALL_RULES)
