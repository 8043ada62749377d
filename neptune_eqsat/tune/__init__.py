"""Measured tuning (`database.py`), the device profiles of the cost model (`profiles.py`, `calibrate.py`).
Needs torch and triton only, so it runs where the kernels run."""
