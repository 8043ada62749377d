"""Rewrite rules, one family per module. Each rule carries its proof obligation; only proved rules run."""
from .algebra import RULES as ALGEBRA, algebra
from .analysis import analysis
from .reduction import RULES as REDUCTION, reduction
from .rolling import RULES as ROLLING, rolling
from .substitution import RULES as SUBSTITUTION, substitution

FAMILIES = {"algebra": (algebra, ALGEBRA), "reduction": (reduction, REDUCTION),
            "substitution": (substitution, SUBSTITUTION), "rolling": (rolling, ROLLING)}
ALL_RULES = ALGEBRA + REDUCTION + SUBSTITUTION + ROLLING

__all__ = ["FAMILIES", "ALL_RULES", "analysis"]
