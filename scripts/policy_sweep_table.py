#!/usr/bin/python3
"""The table and the bars of scripts/policy-sweep.sh, from the JSON of its replays.

    policy_sweep_table.py DIR ALLOCATORS TRACE...

DIR holds TRACE's replays as <trace file name>.r<round>.json (`sdalloc replay --json`, every
allocator of the comma-separated ALLOCATORS in each). Prints one Markdown row per trace, then
the traces that miss a bar (docs/pools.md) and on how many every bar holds. Exits 0 either way:
a miss is a finding, not an error; a missing or malformed file is an error (status 1).
"""

import glob
import json
import os
import re
import statistics
import sys

CLASSIFIERS = ("rec_tv_", "torchvision_")


def total(result):
    return sum(result["pass_seconds"])


def steady(result):
    """The median of passes 3-5 (of the passes after the second, however many there are)."""
    later = result["pass_seconds"][2:5] or result["pass_seconds"][-1:]
    return statistics.median(later)


def late_calls(result):
    """Calls to the memory under the allocator after pass 2 (None: not counted)."""
    calls = result.get("pass_memory_calls") or []
    return sum(calls[2:]) if len(calls) > 2 else None


def load(out_dir, trace):
    name = os.path.basename(trace)
    paths = sorted(glob.glob(os.path.join(out_dir, glob.escape(name) + ".r*.json")))
    if not paths:
        raise SystemExit(f"policy_sweep_table: no replays of {name} in {out_dir}")
    return [json.load(open(p)) for p in paths]


def by_allocator(runs, allocator):
    return [r for run in runs for r in run["results"] if r["allocator"] == allocator and r["ran"]]


def ratio_to(results, baseline, measure):
    """The median over rounds of measure(result) / measure(baseline of the same round)."""
    pairs = [(r, b) for r, b in zip(results, baseline)]
    return statistics.median(measure(r) / measure(b) for r, b in pairs) if pairs else None


def cell(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def main(out_dir, allocators, traces):
    head = ["trace", "peak live MiB"] + [f"{a} x" for a in allocators]
    timed = [a for a in ("vmm", "pool") if a in allocators and "tcmalloc" in allocators]
    for a in timed:
        head += [f"{a} total", f"{a} steady"]
    counted = [a for a in ("vmm", "pool") if a in allocators]
    head += [f"{a} calls after pass 2" for a in counted]
    rows, figures = [], []
    for trace in traces:
        runs = load(out_dir, trace)
        name = re.sub(r"\.csv(\.gz)?$", "", os.path.basename(trace))
        got = {a: by_allocator(runs, a) for a in allocators}
        f = {"name": name, "passes": runs[0]["passes"]}
        row = [name, f"{runs[0]['peak_live'] / 2**20:.1f}"]
        for a in allocators:
            f[f"{a} x"] = statistics.median(r["ratio"] for r in got[a]) if got[a] else None
            row.append(cell(f[f"{a} x"]))
        for a in timed:
            f[f"{a} total"] = ratio_to(got[a], got["tcmalloc"], total)
            f[f"{a} steady"] = ratio_to(got[a], got["tcmalloc"], steady)
            row += [cell(f[f"{a} total"], 2), cell(f[f"{a} steady"], 2)]
        for a in counted:
            calls = [late_calls(r) for r in got[a]]
            f[f"{a} late"] = max(calls) if calls and None not in calls else None
            row.append("-" if f[f"{a} late"] is None else str(f[f"{a} late"]))
        rows.append(row)
        figures.append(f)
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{len(traces)} traces, --touch, {figures[0]['passes'] if figures else 0} passes, "
          f"medians of {len(runs) if traces else 0} rounds; JSON in {out_dir}")
    if not all(a in allocators for a in ("vmm", "pool", "planned", "torch-native", "tcmalloc")):
        return
    print("\nAgainst the bars (docs/pools.md):")
    held = 0
    for f in figures:
        misses = []
        nan = float("nan")
        get = lambda key: nan if f.get(key) is None else f[key]  # noqa: E731
        if not get("vmm x") <= 1.05:
            misses.append(f"vmm {get('vmm x'):.3f} x live > 1.05")
        classifier = f["name"].startswith(CLASSIFIERS)
        total_bar, steady_bar = (1.5, 1.5) if classifier else (1.10, 1.25)
        if not get("vmm total") <= total_bar:
            misses.append(f"vmm total {get('vmm total'):.2f} x tcmalloc's > {total_bar}")
        if not get("vmm steady") <= steady_bar:
            misses.append(f"vmm steady pass {get('vmm steady'):.2f} x tcmalloc's > {steady_bar}")
        if not get("pool x") <= get("torch-native x"):
            misses.append(f"pool {get('pool x'):.3f} x live > torch-native's "
                          f"{get('torch-native x'):.3f}")
        if f["passes"] > 2 and f.get("pool late") != 0:
            misses.append(f"pool: {f.get('pool late')} segment calls after pass 2")
        if not get("planned x") <= 1.0005:
            misses.append(f"planned {get('planned x'):.3f} x live")
        if misses:
            print(f"- {f['name']}: " + "; ".join(misses))
        else:
            held += 1
    print(f"all bars hold on {held} of {len(figures)} traces")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3:])
