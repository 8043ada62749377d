"""How much host time does a training step through neptune_eqsat.flex_attention take, against its kernels'
time and against FlexAttention's? For each operator: the backward alone (the forward's graph kept, as
bench.suite.backward times it) and a whole step (forward with gradients wanted, then backward), each timed
with do_bench (median) and by the host alone (perf_counter over calls issued without waiting for the GPU),
beside torch.compile'd FlexAttention timed the same way; then cProfile over backward calls of the first
operator (--profile).

    NEPTUNE_EQSAT_CACHE=bench/flex_cache PYTHONPATH=. python bench/experiments/2026-11-28-api-host-time/api_host.py \
        [--ops causal_pf,global_pf] [--seqs 1024,4096] [--dtype bf16] [--profile] [--no-flex]

Run from another checkout's root (PYTHONPATH=. there) to time that checkout's API in its own process.
"""
import argparse
import cProfile
import io
import pstats
import time

import torch
import triton.testing

from bench.suite.attention import D, OPS, alibi_slopes
from bench.suite.attention_systems import api_callables, flex_args, Case, import_package


def host_ms(call, n=30):
    """Host time per call: n calls issued back to back, timed before the GPU is waited for."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return host


def calls(system, op, S, dt):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, op.hq, S, D, device="cuda", dtype=dt, generator=g).requires_grad_()
    k, v = (torch.randn(1, op.hkv, S, D, device="cuda", dtype=dt, generator=g).requires_grad_() for _ in range(2))
    grad = torch.randn(1, op.hq, S, D, device="cuda", dtype=dt, generator=g)
    slopes = alibi_slopes(op.hq, "cuda")
    if system == "neptune_api":
        mod, mask = api_callables(op, slopes, 0)
        api = import_package().flex_attention
        fn = lambda: api(q, k, v, score_mod=mod, mask_mod=mask, enable_gqa=op.hq != op.hkv)   # noqa: E731
    else:
        from torch.nn.attention.flex_attention import flex_attention
        mod, block_mask, gqa = flex_args(Case(op, q, k, v, slopes, "cuda"))
        torch._dynamo.reset()
        compiled = torch.compile(flex_attention, dynamic=False)
        fn = lambda: compiled(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)   # noqa: E731
    out = fn()

    def backward():
        return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    def step():
        return torch.autograd.grad(fn(), (q, k, v), grad)
    for c in (backward, step, backward, step):
        c()
    if system == "neptune_api":
        import_package().wait_for_compiles()
    return backward, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="causal_pf,global_pf,alibi_pf,softcap_pf")
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--layers", action="store_true", help="host time per call of each layer of the backward")
    args = ap.parse_args()
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    systems = ["neptune_api"] + ([] if args.no_flex else ["flex"])
    print(torch.cuda.get_device_name(), args.dtype, "B=1 D=128; ms per call: do_bench median / host alone")
    print(f"{'op':12} {'S':>6} {'system':12} {'backward':>10} {'host':>7} {'step':>8} {'host':>7}")
    for name in args.ops.split(","):
        for S in map(int, args.seqs.split(",")):
            for system in systems:
                backward, step = calls(system, OPS[name], S, dt)
                row = []
                for c in (backward, step):
                    row += [triton.testing.do_bench(c, warmup=25, rep=200, return_mode="median"), host_ms(c)]
                print(f"{name:12} {S:6} {system:12} {row[0]:10.3f} {row[1]:7.3f} {row[2]:8.3f} {row[3]:7.3f}",
                      flush=True)
    if args.layers:
        layers(OPS[args.ops.split(",")[0]], int(args.seqs.split(",")[0]), dt)
    if args.profile:
        backward, _ = calls("neptune_api", OPS[args.ops.split(",")[0]], int(args.seqs.split(",")[-1]), dt)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            backward()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        print(s.getvalue())


def layers(op, S, dt, n=50):
    """Host time per backward call spent inside each layer (nested: each includes those below it), by timing
    wrappers put around the API's functions."""
    from neptune_eqsat import flex, training
    spent = {}

    def timed(owner, name, label):
        real = getattr(owner, name)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)
    timed(flex, "run_backward", "run_backward")
    timed(training.CompiledBackward, "grads", "  grads")
    timed(training, "run_spec", "    run_spec")
    timed(training, "run_kernels", "      module forward")
    backward, _ = calls("neptune_api", op, S, dt)
    from neptune_eqsat import compiled
    for n, module in enumerate(compiled._MEMORY.values()):   # inside the generated modules' replays
        for name in ("_signature", "_replay", "_redescribe", "_run", "_current_stream", "_capturing"):
            if hasattr(module, name):
                timed(module, name, f"          {name} (module {n})")
    backward()
    spent.clear()
    total = host_ms(backward, n)
    print(f"{op.name} S={S}: host per backward call {total:.3f} ms; inside:")
    for label, s in spent.items():
        print(f"  {label:32} {s / n * 1e3:.3f} ms")
    engine_baseline(q_like=torch.empty(1, op.hq, S, D, device="cuda", dtype=dt), n=n)


def engine_baseline(q_like, n):
    """The autograd engine's own host time: autograd.grad through a Function whose backward returns tensors
    made beforehand (three inputs, as attention's q, k, v)."""
    made = [torch.empty_like(q_like) for _ in range(3)]

    class Given(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q.clone()

        @staticmethod
        def backward(ctx, grad):
            return tuple(made)
    xs = [torch.empty_like(q_like).requires_grad_() for _ in range(3)]
    out, grad = Given.apply(*xs), torch.empty_like(q_like)
    call = lambda: torch.autograd.grad(out, xs, grad, retain_graph=True)   # noqa: E731
    call()
    print(f"autograd.grad through a Function returning given tensors: {host_ms(call, n):.3f} ms host a call")


if __name__ == "__main__":
    main()
