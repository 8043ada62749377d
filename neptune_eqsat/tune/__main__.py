"""python -m neptune_eqsat.tune KERNEL.py --spec NAME --shape B=1,S=4096: tune a generated module on the GPU."""
from neptune_eqsat.tune.database import _main

_main()
