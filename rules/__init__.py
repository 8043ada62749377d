"""Rewrite rules, one family per module. Each rule carries its proof obligation; only proved rules run."""
from .algebra import RULES as ALGEBRA, algebra
from .analysis import analysis
from .reduction import RULES as REDUCTION, reduction
from .rolling import RULES as ROLLING, rolling
from .scalar import RULES as SCALAR, scalar
from .splitk import RULES as SPLITK, splitk
from .substitution import RULES as SUBSTITUTION, substitution

FAMILIES = {"algebra": (algebra, ALGEBRA), "reduction": (reduction, REDUCTION),
            "substitution": (substitution, SUBSTITUTION), "rolling": (rolling, ROLLING), "scalar": (scalar, SCALAR),
            "splitk": (splitk, SPLITK)}
ALL_RULES = ALGEBRA + REDUCTION + SUBSTITUTION + ROLLING + SCALAR + SPLITK

__all__ = ["FAMILIES", "ALL_RULES", "analysis"]
