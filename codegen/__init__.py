"""Term -> Triton: kernel body (kernel.py), mask predicates as loop bounds (masks.py), module and launcher (module.py)."""
