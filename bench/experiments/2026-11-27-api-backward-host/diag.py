import sys, time, torch, triton.testing
from bench.suite import backward as B
from bench.suite.attention import OPS, alibi_slopes
dt = torch.float16
def main():
  for name in sys.argv[1].split(","):
      op = OPS[name]; S = 4096
      g = torch.Generator(device="cuda").manual_seed(0)
      q, k, v = (torch.randn(1, h, S, 128, device="cuda", dtype=dt, generator=g).requires_grad_() for h in (op.hq, op.hkv, op.hkv))
      slopes = alibi_slopes(op.hq, "cuda"); grad = torch.randn(1, op.hq, S, 128, device="cuda", dtype=dt, generator=g)
      call = B.api_step(op, q, k, v, slopes, grad, False)
      print(name, "do_bench ms", [round(triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median"), 3) for _ in range(3)], flush=True)
      torch.cuda.synchronize(); t = time.perf_counter()
      for _ in range(20): call()
      t1 = time.perf_counter() - t; torch.cuda.synchronize(); t2 = time.perf_counter() - t
      print(name, "host per call %.3f ms; with GPU %.3f ms" % (t1 / 20 * 1e3, t2 / 20 * 1e3), flush=True)
      with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
          for _ in range(5): call()
          torch.cuda.synchronize()
      print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)


def cprof(name="causal_pf"):
    import cProfile, pstats
    op = OPS[name]; S = 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, S, 128, device="cuda", dtype=dt, generator=g).requires_grad_() for h in (op.hq, op.hkv, op.hkv))
    slopes = alibi_slopes(op.hq, "cuda"); grad = torch.randn(1, op.hq, S, 128, device="cuda", dtype=dt, generator=g)
    call = B.api_step(op, q, k, v, slopes, grad, False)
    for _ in range(10): call()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): call()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "tottime").print_stats(40)


if __name__ == "__main__":
    cprof(sys.argv[1]) if sys.argv[2:3] == ["cprof"] else main()
