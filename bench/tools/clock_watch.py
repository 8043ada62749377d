"""Watch the GPU's SM clock, power and temperature while one kernel runs back to back: tells a kernel that got
slower from a GPU that clocked down under sustained load (long prefill calls draw the most power).

    python -m bench.tools.clock_watch [--op causal_pf] [--S 16384] [--seconds 15]

Runs the generated module (bench/generated/<op>.py), then SDPA's cuDNN backend for the same causal shape, each
for --seconds, timing every call with CUDA events and sampling NVML every 0.2 s. Prints per second: calls'
median time, SM clock, power and temperature. Imports torch, triton and pynvml (nvidia-ml-py).
"""
import argparse
import statistics
import threading
import time

import pynvml
import torch

from bench.common import GENERATED, HEADS, cudnn_attention, load


def sampler(handle, samples, stop):
    while not stop.is_set():
        samples.append((time.time(), pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)))
        time.sleep(0.2)


def watch(name, fn, seconds, handle):
    fn()
    torch.cuda.synchronize()
    samples, calls, stop = [], [], threading.Event()
    thread = threading.Thread(target=sampler, args=(handle, samples, stop))
    thread.start()
    start = time.time()
    while time.time() - start < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        calls.append((time.time() - start, a.elapsed_time(b)))
    stop.set()
    thread.join()
    for sec in range(int(seconds)):
        ms = [t for at, t in calls if sec <= at < sec + 1]
        s = [x for x in samples if sec <= x[0] - start < sec + 1]
        if ms and s:
            print(f"{name:8s} s{sec:02d}  {statistics.median(ms):7.3f} ms  SM {statistics.median(x[1] for x in s):5.0f} MHz"
                  f"  {statistics.median(x[2] for x in s):5.0f} W  {max(x[3] for x in s):3d} C", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="causal_pf")
    ap.add_argument("--S", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    print(torch.cuda.get_device_name(), "power limit",
          pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3, "W", flush=True)
    hq, hk = HEADS.get(args.op, (32, 32))
    q = torch.randn(1, hq, args.S, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, hk, args.S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    mod = load(GENERATED / f"{args.op}.py")
    watch("neptune", lambda: mod.forward(q, k, v), args.seconds, handle)
    watch("cudnn", lambda: cudnn_attention(q, k, v, causal=True), args.seconds, handle)


if __name__ == "__main__":
    main()
