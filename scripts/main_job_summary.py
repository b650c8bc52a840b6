#!/usr/bin/python3
"""scripts/main_job_summary.py JSON... - the main job's table and what it means.

scripts/run-main-job.sh replays the bundled trace in more than one `sdalloc replay` run (the
allocators that give memory back to the kernel take a minute a pass on a small VM, so they
get fewer passes) and hands their --json files here. This prints one table over all of them,
with each row's pass count, then a few lines in plain language: how close each allocator came
to the least memory possible, and how its time compares with tcmalloc's.

Every run must have replayed the same trace (same event count and peak live), else exit 1.
"""

import json
import statistics
import sys


def size(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for row in [header] + rows:
        cells = [str(c).ljust(w) if i in (0, len(row) - 1) else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def load(paths):
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as file:
            runs.append(json.load(file))
    first = runs[0]
    for run in runs[1:]:
        if (run["events"], run["peak_live"]) != (first["events"], first["peak_live"]):
            sys.exit(f"main_job_summary: {paths[0]} and the other runs replayed different "
                     "traces")
    return runs


def main(paths):
    if not paths:
        sys.exit("usage: main_job_summary.py REPLAY_JSON...")
    runs = load(paths)
    first = runs[0]
    print(f"trace:      {first['trace']}")
    print(f"events:     {first['events']} per pass ({first['allocations']} allocations)"
          + (", every 4 KiB page written" if first["touch"] else ""))
    print(f"peak live:  {size(first['peak_live'])}, the least any allocator can hold")
    print()
    rows, ran = [], {}
    for run in runs:
        for r in run["results"]:
            if not r["ran"]:
                rows.append([r["allocator"], run["passes"], "-", "-", "-", "-", r["problem"]])
                continue
            seconds = statistics.median(r["pass_seconds"])
            ran[r["allocator"]] = (r["ratio"], seconds)
            rows.append([r["allocator"], run["passes"], size(r["peak_reserved"]),
                         f"{r['ratio']:.3f}", f"{seconds:.3f}", f"{r['pass_seconds'][0]:.3f}",
                         r["counters"]])
    print(table(["allocator", "passes", "peak held", "x live", "s/pass", "1st pass s", "notes"],
                rows))
    print()
    print(reading(ran))


def times(x):
    return f"{x:.2f} x" if x < 10 else f"{x:.0f} x"


def reading(ran):
    """The table in plain words, from the figures of the allocators that ran."""
    ours = {name: ran[name] for name in ("pool", "planned", "vmm") if name in ran}
    others = {name: value for name, value in ran.items() if name not in ours}
    lines = ["What the table means:",
             "- x live is peak held / peak live: 1.000 is the least any allocator can hold, "
             "1.100 holds 10 % more."]
    held = ", ".join(f"{name} {ratio:.3f}" for name, (ratio, _) in ours.items())
    rest = ", ".join(f"{name} {ratio:.3f}" for name, (ratio, _) in others.items())
    if held:
        lines.append(f"  sdalloc's modes held {held}" + (f"; {rest}." if rest else "."))
    if ran.get("tcmalloc", (0, 0))[1] > 0:
        base = ran["tcmalloc"][1]
        against = ", ".join(f"{name} {times(seconds / base)}" for name, (_, seconds)
                            in ran.items() if name != "tcmalloc")
        lines.append("- s/pass is the median time of a pass (the 1st pass also faults the "
                     "memory in). Against")
        lines.append(f"  tcmalloc's {base:.3f} s a pass: {against}.")
    giving_back = [name for name in ("glibc", "jemalloc", "mimalloc") if name in ran]
    if giving_back:
        verb = "hands" if len(giving_back) == 1 else "hand"
        lines.append(f"- {', '.join(giving_back)} {verb} large freed blocks back to the kernel, "
                     "so each pass faults them in")
        lines.append("  again: that is the time it takes. sdalloc and tcmalloc keep the memory "
                     "and reuse it.")
    if ours and "tcmalloc" in ran and max(r for r, _ in ours.values()) < ran["tcmalloc"][0]:
        lines.append("- Every sdalloc mode held less than tcmalloc, closer to the least "
                     "possible.")
    lines.append("- Everything (jemalloc and mimalloc too, 3 passes each; 5-25 min on a 2-core VM): "
                 "scripts/run-main-job.sh --full")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
