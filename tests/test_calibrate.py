"""Calibration: the microbenchmarks' accounting (with a stand-in timer, kernels under the interpreter), device
profiles stored and merged atomically, and the cost model finding them by GPU name or alias."""
import json
import multiprocessing
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from neptune_eqsat.tune import calibrate
from neptune_eqsat.tune import profiles
from neptune_eqsat.plan.cost import NOMINAL, PRESETS, Device, parse_device

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def own_devices_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NEPTUNE_EQSAT_DEVICES", str(tmp_path / "devices.json"))
    return tmp_path / "devices.json"


def run_once(seconds):
    """A timer that runs the benchmark once (here, on the CPU) and reports `seconds`."""
    def timer(fn):
        timer.result = fn()
        return seconds
    return timer


def test_bandwidth_counts_bytes_read_and_written():
    timer = run_once(1e-3)
    rate = calibrate.memory_bandwidth(timer, "cpu", nbytes=4096)
    assert rate == 2 * 4096 / 1e-3
    assert torch.equal(timer.result, torch.ones(2048, dtype=torch.float16))   # the copy happened


def test_matrix_rate_counts_two_flops_per_multiply_add():
    timer = run_once(2e-3)
    assert calibrate.matrix_rate(timer, "cpu", n=32) == 2 * 32 ** 3 / 2e-3
    assert timer.result.shape == (32, 32) and timer.result.dtype == torch.float16


def test_vector_and_special_rates_count_every_chain_step():
    assert calibrate.vector_rate(run_once(1e-3), "cpu", n=1000, iterations=8) == 2 * 4 * 8 * 1000 / 1e-3
    assert calibrate.special_rate(run_once(1e-3), "cpu", n=1000, iterations=8) == 4 * 8 * 1000 / 1e-3


def test_chain_kernels_do_the_counted_steps():
    n, iterations = 1000, 3
    x = torch.rand(n)
    out = torch.empty_like(x)
    calibrate._multiply_add_chains[(1,)](x, out, n, 0.5, 0.25, ITERATIONS=iterations, BLOCK=1024)
    chains = [x + k for k in range(4)]
    for _ in range(iterations):
        chains = [c * 0.5 + 0.25 for c in chains]
    assert torch.allclose(out, sum(chains), atol=1e-5)
    calibrate._exp2_chains[(1,)](x, out, n, ITERATIONS=iterations, BLOCK=1024)
    chains = [x + k / 4 for k in range(4)]
    for _ in range(iterations):
        chains = [torch.exp2(-c) for c in chains]
    assert torch.allclose(out, sum(chains), atol=1e-5)


def test_launch_overhead_is_per_launch(monkeypatch):
    launched = []

    class Counting:   # stands in for the trivial kernel: counts launches and their arguments
        def __getitem__(self, grid):
            return lambda *args: launched.append(len(args))
    monkeypatch.setattr(calibrate, "_trivial", Counting())
    assert calibrate.launch_overhead(run_once(1e-3), "cpu", launches=5) == pytest.approx(2e-4)
    assert launched == [calibrate.TRIVIAL_KERNEL_TENSORS + calibrate.TRIVIAL_KERNEL_INTS] * 5


def test_trivial_kernel_runs():
    tensors = [torch.ones(16) for _ in range(calibrate.TRIVIAL_KERNEL_TENSORS)]
    calibrate._trivial[(1,)](*tensors, *range(16, 16 * (calibrate.TRIVIAL_KERNEL_INTS + 1), 16))
    assert tensors[0][0] == 0 and tensors[0][1] == 1


def test_calibrate_stores_a_measured_profile_and_reports_the_one_it_replaces(monkeypatch, own_devices_file):
    measured = {"name": H100, "sms": 132, "bandwidth": 2.9e12, "matrix_flops": 7.1e14, "vector_ops": 5.2e13,
                "special_ops": 3.3e12, "launch_seconds": 6.5e-6, "measured": True}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(calibrate, "measure", lambda: dict(measured))
    report = calibrate.calibrate()
    assert "(was: measured profile)" in report and "2900" in report and "6.5" in report   # GB/s, us
    stored = json.loads(own_devices_file.read_text())[H100]
    assert stored["measured"] is True and stored["bandwidth"] == 2.9e12
    dev = parse_device("h100")   # the alias of the shipped profile now selects the measured one
    assert dev.name == H100 and dev.bandwidth == 2.9e12 and dev.launch_seconds == 6.5e-6
    assert dev.source.startswith("measured profile from")
    measured["bandwidth"] = 3.1e12
    assert "was: measured profile" in calibrate.calibrate(own_devices_file)   # replaces its own measurement
    assert profiles.load(own_devices_file)[H100]["bandwidth"] == 3.1e12


def test_calibrate_refuses_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="has none"):
        calibrate.calibrate()


def _store_profiles(args):
    path, n = args
    for k in range(10):
        profiles.store({"name": f"GPU {n}-{k}", "sms": k, "bandwidth": 1e12, "measured": True}, path)


def test_profiles_round_trip_and_merge_concurrent_writers(tmp_path):
    path = tmp_path / "devices.json"
    profiles.store({"name": "GPU A", "sms": 10, "bandwidth": 1e12, "aliases": ["a"]}, path)
    profiles.store({"name": "GPU A", "sms": 12, "bandwidth": 2e12}, path)   # replaces, keeps the aliases
    assert profiles.load(path) == {"GPU A": {"aliases": ["a"], "sms": 12, "bandwidth": 2e12}}
    # fresh interpreters: a fork of this process, whose other threads may hold locks, can hang
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_store_profiles, [(path, n) for n in range(4)])
    loaded = profiles.load(path)
    assert len(loaded) == 41 and loaded["GPU 3-7"]["sms"] == 7
    assert not list(tmp_path.glob("*.tmp"))   # every write was renamed into place


@pytest.mark.parametrize("gpu, alias, bandwidth", [(H100, "h100", (2e12, 4e12)), ("NVIDIA H200", "h200", (3.5e12, 5e12))])
def test_shipped_profiles_are_measured_and_selected_by_alias_or_gpu_name(gpu, alias, bandwidth):
    shipped = profiles.load(profiles.SHIPPED)[gpu]
    assert shipped["measured"] is True and alias in shipped["aliases"]
    assert bandwidth[0] < shipped["bandwidth"] < bandwidth[1] and 3e14 < shipped["matrix_flops"] < 1e15
    for name in (alias, alias.upper(), gpu, gpu.lower()):
        dev = PRESETS[name]
        assert dev.name == gpu and dev.sms == 132 and dev.source == "measured profile shipped with the package"
    assert parse_device(alias) != NOMINAL[alias]   # the profile, not the nominal preset


def test_a_name_without_a_profile_takes_the_nominal_preset(own_devices_file, monkeypatch, tmp_path):
    monkeypatch.setattr(profiles, "SHIPPED", tmp_path / "none.json")
    assert parse_device("h200") == NOMINAL["h200"] and parse_device("H100") == NOMINAL["h100"]


def test_parse_device_takes_user_profiles_first(own_devices_file):
    profiles.store({"name": "Lab GPU X", "sms": 66, "bandwidth": 1.5e12, "matrix_flops": 2e14,
                    "vector_ops": 2e13, "special_ops": 1e12, "launch_seconds": 5e-6, "measured": True})
    dev = parse_device("Lab GPU X")
    assert (dev.name, dev.sms, dev.bandwidth, dev.launch_seconds) == ("Lab GPU X", 66, 1.5e12, 5e-6)
    assert "Lab GPU X" in list(PRESETS)
    tweaked = parse_device("Lab GPU X,sms=33")
    assert tweaked.sms == 33 and tweaked.bandwidth == 1.5e12 and tweaked.name != "Lab GPU X"   # hypothetical
    assert parse_device("Lab GPU X,sms=33,name=Lab GPU X").name == "Lab GPU X"
    with pytest.raises(ValueError, match="unknown device 'Lab GPU Y': one of h100, h200, .*Lab GPU X"):
        parse_device("Lab GPU Y")


def test_detect_uses_the_profile_of_the_gpu_present(monkeypatch):
    profiles.store({"name": "Lab GPU X", "sms": 66, "bandwidth": 1.5e12, "measured": True})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = SimpleNamespace(name="Lab GPU X", multi_processor_count=66)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpu)
    assert Device.detect().bandwidth == 1.5e12
    gpu.name, gpu.multi_processor_count = "Unprofiled GPU", 20
    dev = Device.detect()
    assert (dev.name, dev.sms, dev.bandwidth) == ("Unprofiled GPU", 20, Device().bandwidth)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Device.detect().name == H100   # no GPU: the h100 preset


def test_calibration_imports_no_compiler():
    code = ("import sys; sys.modules['egglog'] = None; sys.modules['click'] = None\n"
            "import neptune_eqsat.tune.calibrate, neptune_eqsat.tune.database\n"
            "print(sorted(m for m in sys.modules if m.startswith('neptune_eqsat.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "neptune_eqsat.tune.calibrate" in out
    assert not {"neptune_eqsat.compiler", "neptune_eqsat.plan.extract", "neptune_eqsat.plan.saturate"} & set(eval(out))
