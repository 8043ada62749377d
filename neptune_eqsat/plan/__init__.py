"""The planner: saturate the e-graph (`saturate.py`), extract and price plans (`extract.py`, `cost.py`), schedule
them (`schedule.py`, `layout.py`, `combine.py`); and the backward specs of a spec (`autodiff.py`,
`derivatives.py`)."""
