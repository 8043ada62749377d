"""The attention benchmark's reporting: rows grouped by shape, neptune's ratios and their geomeans, results.md,
results.png, and the merge of several runs' results.json.
"""
import json
import math
import sys
from pathlib import Path

from bench.suite.attention_ops import COMPILERS, D, SYSTEMS, TOL, UNITS, metric
from bench.suite.attention_systems import COPY_ROW, READ_ROW

# ---------------------------------------------------------------- reporting

def groups(rows):
    """Rows grouped by (mode, op, B, Skv) in the order measured: {key: {system: row}}."""
    out = {}
    for r in rows:
        out.setdefault((r["mode"], r["op"], r["B"], r["Skv"]), {})[r["system"]] = r
    return out


def _timed(by_system, name):
    """The system's metric, None where it has no correct timing."""
    r = by_system.get(name)
    return metric(r) if r and r["status"] == "ok" else None


def ratios(by_system):
    """(neptune / best compiler, neptune / cuDNN), None where a side has no correct timing."""
    compilers = [x for x in (_timed(by_system, c) for c in COMPILERS) if x is not None]
    best = max(compilers) if compilers else None
    nep = _timed(by_system, "neptune")
    return (nep / best if nep and best else None), over(by_system, "sdpa_cudnn")


def over(by_system, name):
    """neptune / the system `name`, None where either has no correct timing."""
    nep, other = _timed(by_system, "neptune"), _timed(by_system, name)
    return nep / other if nep and other else None


def geomean(xs):
    xs = [x for x in xs if x]
    return dict(geomean=math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None, n=len(xs))


def summary(rows):
    out = {}
    by_shape = groups(rows)
    for mode in ("prefill", "decode", "all"):
        rs = [ratios(g) for (m, *_), g in by_shape.items() if mode in ("all", m)]
        out[mode] = dict(neptune_over_best_compiler=geomean([a for a, _ in rs]),
                         neptune_over_cudnn=geomean([b for _, b in rs]))
    return out


def fmt_ratio(x):
    return f"{x:.2f}×" if x else "—"


def cell(row):
    if row is None:
        return "—"
    return f"{metric(row):.1f}" if row["status"] == "ok" else {"wrong": "WRONG", "failed": "FAIL"}[row["status"]]


def markdown(results):
    rows = results["rows"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    by_shape = groups(rows)
    dev, config = results["device"], results.get("config", {})
    lines = [f"# Attention benchmark: {dev.get('device', '?')} (torch {dev.get('torch', '?')}, "
             f"triton {dev.get('triton', '?')})", "",
             f"{config.get('dtype', 'fp16')}, D = {D}; median of triton.testing.do_bench; outputs checked against "
             f"float64 (max abs error <= {config.get('tol', TOL)}). best compiler = max(flex, inductor). WRONG = output off, not timed; "
             "FAIL = see below; — = not expressible.", ""]
    for mode in ("prefill", "decode"):
        keys = [key for key in by_shape if key[0] == mode]
        if not keys:
            continue
        fa4 = "fa4" in systems
        lines += [f"## {mode.capitalize()} ({UNITS[mode]})", "",
                  "| op | B | " + ("S" if mode == "prefill" else "KV") + " | " + " | ".join(systems)
                  + " | neptune / best compiler | neptune / cuDNN |" + (" neptune / FA4 |" if fa4 else ""),
                  "|---|---|---|" + "---|" * (len(systems) + 2 + fa4)]
        for key in keys:
            g = by_shape[key]
            cells = [cell(g.get(s)) for s in systems]
            lines.append(f"| {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " | "
                         + " | ".join(map(fmt_ratio, ratios(g) + ((over(g, "fa4"),) if fa4 else ()))) + " |")
        lines.append("")
        copy = dev.get("copy_gbs")
        if mode == "decode" and copy:
            longest = max(key[3] for key in keys)
            shares = [f"{key[1]} B{key[2]} {metric(by_shape[key]['neptune']) / copy:.0%}" for key in keys
                      if key[3] == longest and by_shape[key].get("neptune", {}).get("status") == "ok"]
            lines += [f"Device copy bandwidth (1 GiB device to device, read + write): {copy:.0f} GB/s. "
                      f"neptune at KV = {longest}: " + ", ".join(shares) + " of it.", ""]
            same = [f"{key[1]} B{key[2]} KV {key[3]}: {metric(g['neptune']) / metric(g[COPY_ROW]):.0%} "
                    f"(copy {metric(g[COPY_ROW]):.0f} GB/s)" for key in keys for g in [by_shape[key]]
                    if COPY_ROW in g and g.get("neptune", {}).get("status") == "ok"]
            if same:
                lines += ["A copy of the same bytes (half read, half written), timed the same way, carries the "
                          "timer's cache flush too; neptune's share of it: " + ", ".join(same) + ".", ""]
            read = [f"{key[1]} B{key[2]} KV {key[3]}: {metric(g['neptune']) / metric(g[READ_ROW]):.0%} "
                    f"(read {metric(g[READ_ROW]):.0f} GB/s, {metric(g[READ_ROW]) / copy:.0%} of the copy bandwidth)"
                    for key in keys for g in [by_shape[key]]
                    if READ_ROW in g and g.get("neptune", {}).get("status") == "ok"]
            if read:
                lines += ["A kernel that only reads the same K and V (`same_bytes_read`, read-once hint), timed the "
                          "same way; neptune's share of it: " + ", ".join(read) + ".", ""]
    lines += ["## Geomean", ""]
    for mode, s in results["summary"].items():
        bc, cu = s["neptune_over_best_compiler"], s["neptune_over_cudnn"]
        lines.append(f"- {mode}: neptune / best compiler {fmt_ratio(bc['geomean'])} (n = {bc['n']}), "
                     f"neptune / cuDNN {fmt_ratio(cu['geomean'])} (n = {cu['n']})")
    problems = [r for r in rows if r["status"] != "ok"]
    if problems or results["skipped"] or results["errors"]:
        lines += ["", "## Failures, wrong outputs, skipped ops", ""]
        lines += [f"- {r['op']} B{r['B']} S{r['Skv']} {r['system']}: {r['status'].upper()} {r['error']}" for r in problems]
        lines += [f"- {s['op']}: skipped, {s['reason']}" for s in results["skipped"]]
        lines += [f"- {e['op']} B{e['B']} S{e['S']}: setup failed, {e['error']}" for e in results["errors"]]
    return "\n".join(lines) + "\n"


def plot(results, path):
    """Grouped bars, one panel per mode; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by_shape = groups(results["rows"])
    modes = [m for m in ("prefill", "decode") if any(key[0] == m for key in by_shape)]
    if not modes:
        return False
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in results["rows"])]
    fig, axes = plt.subplots(len(modes), 1, figsize=(14, 4.5 * len(modes)), squeeze=False)
    width = 0.8 / len(systems)
    for ax, mode in zip(axes[:, 0], modes):
        keys = [key for key in by_shape if key[0] == mode]
        for n, s in enumerate(systems):
            ys = [metric(by_shape[key][s]) if s in by_shape[key] and by_shape[key][s]["status"] == "ok" else 0
                  for key in keys]
            ax.bar([x + (n - (len(systems) - 1) / 2) * width for x in range(len(keys))], ys, width, label=s)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{op}\nB{B} {'S' if mode == 'prefill' else 'KV'}{S}" for _, op, B, S in keys],
                           fontsize=7)
        ax.set_ylabel(UNITS[mode])
        ax.set_title(f"{mode} ({results['device'].get('device', '?')})")
        ax.legend(fontsize=7, ncol=len(systems))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_results(results, out_dir, plot_png):
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "results.md").write_text(markdown(results))
    if plot_png and not plot(results, out_dir / "results.png"):
        print("results.png not written (matplotlib missing or nothing measured)")


def merge(dirs, out_dir):
    """One result out of runs on the same GPU model: rows joined, geomeans over all of them. A shape measured
    again in a later run takes all its rows from that run, so the systems of a shape are always compared within
    one run; the device fields (copy bandwidth among them) are the last run's."""
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in dirs]
    gpus = {r["device"].get("device") for r in runs}
    if len(gpus) != 1:
        sys.exit(f"--merge: the runs were made on different GPUs ({', '.join(map(str, gpus))})")
    merged = dict(device={**runs[-1]["device"], "merged_from": [str(d) for d in dirs],
                          "dates": [r["device"].get("date") for r in runs]},
                  config=runs[-1]["config"], modules={}, skipped=[], errors=[], rows=[], summary={})
    shape = lambda r: (r["mode"], r["op"], r["B"], r["Skv"])   # noqa: E731
    for n, r in enumerate(runs):
        later = {shape(x) for x in sum((run["rows"] for run in runs[n + 1:]), [])}
        merged["rows"] += [x for x in r["rows"] if shape(x) not in later]
        merged["skipped"] += r["skipped"]
        merged["errors"] += r["errors"]
        merged["modules"].update(r["modules"])
    merged["summary"] = summary(merged["rows"])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(merged, out_dir, plot_png=True)
    print(markdown(merged))
