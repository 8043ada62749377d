"""Analytic plan cost: global-memory bytes, matrix and vector work, launches and parallelism.

A scheduled term is priced per program and pass: every distinct value computed inside the loop (shared
values once, as the kernel computes them once) is charged per block of the loop axis, loads by their bytes,
in-tile matrix products by their flops, other operations by their element count (transcendentals on their
own unit). The totals over all programs are turned into time with a roofline of the device, divided by how
well the programs fill the device's SMs. The device's constants come from its profile (`profiles.py`:
measured by `neptune-eqsat calibrate`, or nominal) or from the nominal presets.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.tune import profiles
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import Schedule
from neptune_eqsat.runtime.configs import split_count

TRANSCENDENTAL = set(ops.named("un", transcendental=True))
# an fp32 atomic add into global memory, priced as this many bytes moved per byte added (read, add, write
# back in L2)
ATOMIC_WEIGHT = 2


@dataclass(frozen=True)
class Device:
    name: str = "H100 SXM (nominal)"
    sms: int = 132
    bandwidth: float = 3.0e12      # bytes / s
    matrix_flops: float = 600e12   # fp16 tensor-core flop / s
    vector_ops: float = 60e12      # fp32 ops / s
    special_ops: float = 4e12      # transcendental ops / s
    launch_seconds: float = 4e-6
    source: str = field(default="nominal preset", compare=False)   # where the numbers come from, for --explain

    @staticmethod
    def from_profile(gpu: str, profile: dict) -> "Device":
        origin = profile.get("origin", "")
        where = "shipped with the package" if origin == "shipped" else f"from {origin}" if origin else ""
        kind = "measured" if profile.get("measured") else "nominal"
        numbers = {f: _number(f, profile[f]) for f in profiles.FIELDS if f in profile}
        return Device(name=gpu, **numbers, source=f"{kind} profile {where}".strip())

    @staticmethod
    def detect() -> "Device":
        """The GPU here, priced by its profile when one exists, else by nominal numbers with its SM count;
        without a GPU, the h100 preset. Without an NVIDIA driver there is no GPU to ask torch about (importing
        torch would take longer than the rest of a compile)."""
        if "torch" not in sys.modules and not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl")):
            return PRESETS["h100"]
        try:
            import torch
            gpu = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
        except Exception:  # no usable GPU here
            gpu = None
        if gpu is None:
            return PRESETS["h100"]
        found = profiles.find(gpu.name)
        if found is not None:
            return Device.from_profile(*found)
        return Device(name=gpu.name, sms=gpu.multi_processor_count, source="nominal numbers, this GPU's SM count")


def _number(field_name: str, value) -> int | float:
    return int(value) if field_name == "sms" else float(value)


NOMINAL = {
    "h100": Device(),
    "h200": Device(name="H200 (nominal)", bandwidth=4.3e12),
}


class _Presets(Mapping):
    """Devices by name: a GPU name or alias in the device profiles (the user's file, then the shipped one), else
    a nominal preset. The files are read at each lookup, so a new calibration counts at once."""

    def __getitem__(self, name: str) -> Device:
        found = profiles.find(name)
        return Device.from_profile(*found) if found else NOMINAL[name.strip().lower()]

    def __iter__(self):
        known = profiles.all_profiles()
        names = [*NOMINAL, *(a for p in known.values() for a in p.get("aliases", [])), *known]
        return iter(dict.fromkeys(names))

    def __len__(self) -> int:
        return sum(1 for _ in self)


PRESETS = _Presets()


def parse_device(text: str) -> Device:
    """A device name and/or field overrides: "h200", "NVIDIA H100 80GB HBM3", "sms=66", "h100,sms=114".

    A name is one of PRESETS; without one, the h100 preset. Measured plan times and configs (the tuning
    database) are read under the device's name, so overriding a number makes a hypothetical device with no
    measurements of its own, unless `name=GPU NAME` says whose measurements to read."""
    from dataclasses import fields, replace
    numeric = [f.name for f in fields(Device) if f.name not in ("name", "source")]
    base, overrides = None, {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq:
            if key not in PRESETS:
                raise ValueError(f"unknown device {key!r}: one of {', '.join(PRESETS)} or FIELD=VALUE")
            base = PRESETS[key]
        elif key == "name":
            overrides["name"] = value
        elif key in numeric:
            try:
                overrides[key] = _number(key, value)
            except ValueError:
                raise ValueError(f"device field {key}: {value!r} is not a number") from None
            if not (overrides[key] >= 0 if key == "launch_seconds" else overrides[key] > 0):   # counts and rates
                raise ValueError(f"device field {key}: must be {'at least 0' if key == 'launch_seconds' else 'positive'}"
                                 f", got {value}")
        else:
            raise ValueError(f"unknown device field {key!r}: one of {', '.join(numeric + ['name'])}")
    dev = base or PRESETS["h100"]
    changed = ", ".join(f"{k}={v}" for k, v in overrides.items() if k != "name")
    if not changed:
        return replace(dev, **overrides)
    return replace(dev, **{"name": f"{dev.name} ({changed})", **overrides}, source=f"{dev.source}, with {changed}")


@dataclass
class PlanCost:
    seconds: float
    bytes: float
    matrix_flops: float
    vector_ops: float
    special_ops: float
    passes: int
    programs: int
    launches: int = 1
    chunks: int = 1
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        split = f" chunks={self.chunks}" if self.chunks > 1 else ""
        return (f"{self.seconds * 1e6:9.1f} us  passes={self.passes} programs={self.programs}{split} "
                f"bytes={self.bytes / 1e6:.1f}MB mma={self.matrix_flops / 1e9:.1f}GF "
                f"vector={self.vector_ops / 1e9:.2f}G special={self.special_ops / 1e9:.2f}G")


def plan_cost(sched: Schedule, sizes: dict[str, int], device: Device | None = None,
              block_rows: int = 128, block_loop: int = 64) -> PlanCost:
    device = device or Device()
    spec = sched.spec
    if sched.split and sched.row and block_rows > 16:
        block_rows = 16   # split plans serve few rows: the smallest tile the matrix units take

    def ext(a: str) -> int:
        e = spec.extent(a)
        return e if isinstance(e, int) else sizes.get(e.name, 4096)

    def tile(a: str) -> int:
        if a == sched.row:
            return min(block_rows, ext(a))
        if a == sched.loop:
            return min(block_loop, ext(a))
        return ext(a)

    def elems(t: Term) -> int:
        axes = t.free & ({sched.row, sched.loop, sched.col} | set(sched.inner))
        return math.prod(tile(a) for a in axes if a)

    def elems_out(t: Term) -> int:   # a reduction's result per program (its row and column tile)
        return math.prod(tile(a) for a in t.free & {sched.row, sched.col} if a)

    programs = math.prod(ext(g) for g in sched.grid) * (math.ceil(ext(sched.row) / block_rows) if sched.row else 1)
    tot = {"bytes": 0.0, "mma": 0.0, "vec": 0.0, "sfu": 0.0}

    def charge(values: list[Term], times: float) -> None:
        for t in values:
            n = elems(t) * times
            if t.op == "load":
                tot["bytes"] += n * ir.DTYPE_BYTES[spec.inputs[t.attrs[0]].dtype]
            elif ir.is_reduction(t) and t.attrs[0] == "sum" and _is_product(t.args[0], t.attrs[1]):
                tot["mma"] += 2 * n * tile(t.attrs[1])
            elif t.op == "un" and t.attrs[0] in TRANSCENDENTAL:
                tot["sfu"] += n
            elif t.op in ("un", "bin", "where", "cast", "red", "roll"):
                tot["vec"] += n * (elems(t.args[0]) / max(elems(t), 1) if ir.is_reduction(t) else 1)

    iters = math.ceil(ext(sched.loop) / tile(sched.loop)) if sched.loop else 0
    chunks = split_count(programs, iters, device.sms) if sched.split else 1
    if sched.split:   # each chunk's partial results are written, then read back by the combine
        for r in sched.reductions:
            tot["bytes"] += 2 * 4 * chunks * programs * elems_out(r)
    rows_programs, programs, iters = programs, programs * chunks, math.ceil(iters / chunks)
    charged: set[Term] = set()
    for p in range(sched.passes):
        per_block: list[Term] = []
        for r in sched.in_pass(p):
            for a in r.args:
                for t in ir.walk(a):
                    if sched.loop in t.free or any(x.op == "acc" for x in ir.walk(t)) or t is r:
                        if t not in per_block and not (ir.is_reduction(t) and t.attrs[1] == sched.loop):
                            per_block.append(t)
            per_block.append(r)
        charge(per_block, iters * programs)
        charged |= set(per_block)
    accumulated = [sched.term.args[k + 1] for k in sched.accumulated]
    for t in accumulated:   # computed at every block (what the passes share, once), added atomically in fp32
        charge([x for x in dict.fromkeys(ir.walk(t)) if sched.loop in x.free and x not in charged], iters * programs)
        tot["bytes"] += ATOMIC_WEIGHT * 4 * iters * programs * elems(t)
    out_values = [t for t in ir.walk(sched.term) if not (ir.is_reduction(t) and t.attrs[1] == sched.loop)
                  and not any(x.op == "acc" for x in ir.walk(t))]
    if sched.writes_loop:
        charge([t for t in out_values if sched.loop in t.free], iters * programs)
    else:
        charge([t for t in out_values if not t.free & {sched.loop}], rows_programs)
    out_elems = math.prod(ext(a) for a in spec.output_axes)
    tot["bytes"] += out_elems * ir.DTYPE_BYTES[spec.output_dtype]
    tot["bytes"] += sum(math.prod(ext(a) for a in o.axes) * ir.DTYPE_BYTES[o.dtype] for k, o in enumerate(spec.also)
                        if k not in sched.accumulated)
    compute = tot["mma"] / device.matrix_flops + tot["vec"] / device.vector_ops + tot["sfu"] / device.special_ops
    memory = tot["bytes"] / device.bandwidth
    waves = math.ceil(programs / device.sms)
    fill = programs / (waves * device.sms)
    launches = 1   # a split plan's partials are combined in the same launch, by each tile's last chunk program
    seconds = max(compute, memory) / fill + launches * device.launch_seconds
    notes = [f"{programs} programs on {device.sms} SMs: {fill:.0%} filled"]
    if sched.split:
        notes.append(f"{sched.loop} split into {chunks} chunks (partials combined by each tile's last chunk program)")
    return PlanCost(seconds, tot["bytes"], tot["mma"], tot["vec"], tot["sfu"], sched.passes, programs, launches,
                    chunks, notes)


def _is_product(body: Term, k: str) -> bool:
    return body.op == "bin" and body.attrs[0] == "mul" and all(k in a.free for a in body.args)
