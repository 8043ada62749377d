import sys, torch, triton.testing
from bench.suite.backward import load_module, module_path
from bench.suite.attention import OPS, alibi_slopes, work
name, dtype = sys.argv[1], sys.argv[2]
dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
op = OPS[name]
mod = load_module(module_path(name, dtype, "neptune_atomic"))
kname = [k for k in mod.GRADIENT_KERNELS][0]
km = mod._module(kname)
orig_group = km._group_size
for S in (4096, 16384):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, S, 128, device="cuda", dtype=dt, generator=g) for h in (op.hq, op.hkv, op.hkv))
    grad = torch.randn(1, op.hq, S, 128, device="cuda", dtype=dt, generator=g)
    args = (q, k, v, alibi_slopes(op.hq, "cuda")) if op.mod == "alibi" else (q, k, v)
    out, saved = mod.forward_saved(*args)
    flops = 2.5 * work(op, 1, S, S)[0]
    for stages in (2, 3):
        for group in (None, 1, 2, 4, 8):
            km.CONFIG["WS_STAGES"] = stages
            km._group_size = orig_group if group is None else (lambda *a, group=group: group)
            km._REPLAYS.clear() if hasattr(km, "_REPLAYS") else None
            call = lambda: mod.backward(*args, out=out, grad_out=grad, saved=saved)
            call(); km.wait_for_compiles() if hasattr(km, "wait_for_compiles") else None
            ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
            print(f"{name} {dtype} S={S} stages={stages} group={group or 'auto'}: {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
