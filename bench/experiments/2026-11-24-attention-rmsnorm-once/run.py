"""attention_rmsnorm before (the weighted values summed twice) and after (once, renamed): outputs against the
float64 evaluation of the spec, then times in turns. The two modules are `neptune-eqsat optimize
specs/attention_rmsnorm.py` at the commits before and after, saved as bench/generated/rmsnorm/before.py and
after.py. Run from the repository root on a GPU: python bench/experiments/2026-11-24-attention-rmsnorm-once/run.py"""
import importlib.util, sys, torch, triton
sys.path.insert(0, ".")
from neptune_eqsat.spec import load_spec
from neptune_eqsat.frontend.reference import evaluate

def load(p, name):
    s = importlib.util.spec_from_file_location(name, p); m = importlib.util.module_from_spec(s); s.loader.exec_module(m); return m

mods = {n: load(f"bench/generated/rmsnorm/{n}.py", n) for n in ("before", "after")}
spec = load_spec("specs/attention_rmsnorm.py")
print(torch.cuda.get_device_name())
for S in (1024, 4096, 16384):
    g = torch.Generator(device="cuda").manual_seed(S)
    q, k, v = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    w = torch.rand(128, device="cuda", generator=g) + 0.5
    outs = {n: m.forward(q, k, v, w) for n, m in mods.items()}
    if S <= 4096:
        ref = evaluate(spec, {"q": q.double(), "k": k.double(), "v": v.double(), "g": w.double()})
        errs = {n: (o.double().cpu() - ref.cpu()).abs().max().item() for n, o in outs.items()}
        del ref
        torch.cuda.empty_cache()
    else:
        errs = {"after-vs-before": (outs["after"].double() - outs["before"].double()).abs().max().item()}
    times = {n: [] for n in mods}
    for _ in range(3):
        for n, m in mods.items():
            times[n].append(triton.testing.do_bench(lambda: m.forward(q, k, v, w), warmup=50, rep=300))
    med = {n: sorted(t)[1] for n, t in times.items()}
    print(f"S={S:6d} before {med['before']:.4f} ms  after {med['after']:.4f} ms  after/before speed {med['before']/med['after']:.3f}x  max err {errs}")
