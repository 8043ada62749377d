"""Decode modules under a few configs, side by side with a copy and a read of the same bytes: do loads pipelined
through descriptors (num_stages 2-3, USE_TMA 1), which the tuner picked for causal and ALiBi decode at KV = 32k,
also help the grouped-query kernels (packed rows), whose short tuning runs never reached them?

    PYTHONPATH=. python bench/experiments/2026-11-28-decode-configs/decode_configs.py MODULES_DIR [DIR ...]
                        [--ops gqa_dc,softcap_dc] [--kv 32768] [--rounds 3] [--configs 'NAME={...};...']

Each config is merged over the module's own (the tuned config of the shape's bucket); every output is checked
against float64 by the suite (a wrong one is not timed). With several folders (e.g. modules with an edited
kernel beside the generated ones) each folder's module runs its tuned config and every config, named
FOLDER:NAME, all timed in turns. Imports only torch and triton (and the bench helpers).
"""
import argparse
import dataclasses
import json
import types
from pathlib import Path

from bench.suite import attention
from bench.suite.attention_systems import neptune

PIPELINED = {f"s{s}_tma{t}_c{c}": dict(num_stages=s, USE_TMA=t, STREAM=0 if s > 1 else 1, CHUNKS=c)
             for s in (2, 3) for t in (0, 1) for c in (0, 16)}

ap = argparse.ArgumentParser()
ap.add_argument("modules", nargs="+")
ap.add_argument("--ops", default="gqa_dc,softcap_dc")
ap.add_argument("--kv", default="32768")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--configs", default="", help="NAME=JSON;...: instead of the pipelined grid ('none': no config)")
args = ap.parse_args()
configs = ({} if args.configs == "none" else
           {n: json.loads(c) for n, _, c in (i.partition("=") for i in args.configs.split(";"))} if args.configs
           else PIPELINED)
timer = attention.cuda_timer(50, 300)
for op_name in args.ops.split(","):
    names = []
    for folder in args.modules:
        module = attention.load_module(Path(folder) / f"{op_name}.py")
        prefix = f"{Path(folder).name}:" if len(args.modules) > 1 else ""
        for name, cfg in {"tuned": None, **configs}.items():
            call = (module.forward if cfg is None else
                    lambda *a, f=module.forward, c=cfg: f(*a, config=c))
            entry = types.SimpleNamespace(forward=call)
            attention.BUILDERS[prefix + name] = lambda case, m=entry: neptune(dataclasses.replace(case, module=m))
            names.append(prefix + name)
    for kv in map(int, args.kv.split(",")):
        attention.bench_shape([], attention.OPS[op_name], 1, kv, names, timer=timer, rounds=args.rounds)
