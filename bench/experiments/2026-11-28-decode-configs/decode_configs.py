"""Decode modules under a few configs, side by side with a copy and a read of the same bytes: do loads pipelined
through descriptors (num_stages 2-3, USE_TMA 1), which the tuner picked for causal and ALiBi decode at KV = 32k,
also help the grouped-query kernels (packed rows), whose short tuning runs never reached them?

    PYTHONPATH=. python bench/experiments/2026-11-28-decode-configs/decode_configs.py MODULES_DIR
                        [--ops gqa_dc,softcap_dc] [--kv 32768] [--rounds 3] [--configs 'NAME={...};...']

Each config is merged over the module's own (the tuned config of the shape's bucket); every output is checked
against float64 by the suite (a wrong one is not timed). Imports only torch and triton (and the bench helpers).
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
ap.add_argument("modules")
ap.add_argument("--ops", default="gqa_dc,softcap_dc")
ap.add_argument("--kv", default="32768")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--configs", default="", help="NAME=JSON;...: instead of the pipelined grid")
args = ap.parse_args()
configs = ({n: json.loads(c) for n, _, c in (i.partition("=") for i in args.configs.split(";"))} if args.configs
           else PIPELINED)
timer = attention.cuda_timer(50, 300)
for op_name in args.ops.split(","):
    module = attention.load_module(Path(args.modules) / f"{op_name}.py")
    names = ["tuned"]
    attention.BUILDERS["tuned"] = lambda case, m=module: neptune(dataclasses.replace(case, module=m))
    for name, cfg in configs.items():
        entry = types.SimpleNamespace(forward=lambda *a, f=module.forward, c=cfg: f(*a, config=c))
        attention.BUILDERS[name] = lambda case, m=entry: neptune(dataclasses.replace(case, module=m))
        names.append(name)
    for kv in map(int, args.kv.split(",")):
        attention.bench_shape([], attention.OPS[op_name], 1, kv, names, timer=timer, rounds=args.rounds)
