"""Proof machinery: sympy derivations and proofs of rewrites (`symbolic.py`), rules as data with their proof
obligations (`rulebook.py`), and the on-disk store of proof verdicts (`verdicts.py`)."""
