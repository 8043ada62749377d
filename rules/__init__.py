"""Rewrite rules, one family per module. Each rule carries its proof obligation; only proved rules run.

The families' egglog rulesets (rulesets.py) are built when first asked for: a family module alone imports
without egglog, as the stager's statistics rules do (plan/stages.py), so a machine whose kernel cache another
filled derives and runs a backward pass without the e-graph.
"""
BUILT = ("FAMILIES", "TERM_FAMILIES", "ALL_RULES")

__all__ = list(BUILT)


def __getattr__(name: str):
    if name in BUILT:
        from . import rulesets
        return getattr(rulesets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
