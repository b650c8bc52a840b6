#!/usr/bin/python3
"""The planned arena's first pass and total against vmm's, on every bundled trace, as a table.

    scripts/planned_first_pass.py [-n PASSES] [-r ROUNDS] [-k SUBSTRING]... [TRACE...]

For each trace (default: every data/traces/*.csv and *.csv.gz, then each /work/shared/traces
trace whose name is not among them) runs `sdalloc replay -q --touch -n PASSES -a vmm,planned`
ROUNDS times (default 5 passes, 3 rounds; both allocators in each run, so a busy machine slows
them alike) and prints one Markdown row per trace: vmm's and planned's first pass and total
over the passes in seconds (medians over the rounds) with planned / vmm (the median of each
round's ratio), planned's peak reserved / peak live, and planned's calls to the memory after
pass 1 (the most of any round). Then how many traces meet each bar of issue 48's item 3
(docs/planned_arena.md): first pass <= 1.5 x vmm's, total <= vmm's, no memory call after pass
1, and which miss it.

-k keeps only the traces whose file name contains SUBSTRING (any of them, if given several):
a subset. Needs build/release/tools/sdalloc (SDALLOC_CLI overrides it). Exits 0 when every
replay ran, whether or not the bars hold (a miss is a finding); 1 when a replay failed.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TRACES = "/work/shared/traces"
FIRST_PASS_BAR = 1.5  # planned's first pass against vmm's
TOTAL_BAR = 1.0  # planned's total over the passes against vmm's


def bundled_traces():
    ours = sorted(glob.glob(os.path.join(ROOT, "data/traces/*.csv")) +
                  glob.glob(os.path.join(ROOT, "data/traces/*.csv.gz")))
    names = {os.path.basename(t) for t in ours}
    shared = sorted(t for t in glob.glob(os.path.join(SHARED_TRACES, "*.csv*"))
                    if os.path.basename(t) not in names)
    return ours + shared


def replay(cli, trace, passes, out_path):
    command = [cli, "replay", "-q", "--touch", "-n", str(passes), "-a", "vmm,planned",
               "--json", out_path, trace]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    with open(out_path) as f:
        run = json.load(f)
    results = {r["allocator"]: r for r in run["results"]}
    for allocator in ("vmm", "planned"):
        if allocator not in results or not results[allocator]["ran"]:
            raise RuntimeError(f"{trace}: {allocator} did not run: "
                               f"{results.get(allocator, {}).get('problem')}")
    return run["peak_live"], results["vmm"], results["planned"]


def row_of(name, rounds):
    """rounds: (peak_live, vmm, planned) per round."""
    first = lambda r: r["pass_seconds"][0]
    total = lambda r: sum(r["pass_seconds"])
    med = lambda f, who: statistics.median(f(run[who]) for run in rounds)
    ratio = lambda f: statistics.median(f(run[2]) / f(run[1]) for run in rounds)
    peak_live = rounds[0][0]
    x_live = max(run[2]["peak_reserved"] for run in rounds) / peak_live if peak_live else None
    late_calls = max(sum((run[2].get("pass_memory_calls") or [0])[1:]) for run in rounds)
    return {
        "trace": name,
        "vmm_first": med(first, 1), "planned_first": med(first, 2), "first_ratio": ratio(first),
        "vmm_total": med(total, 1), "planned_total": med(total, 2), "total_ratio": ratio(total),
        "x_live": x_live, "late_calls": late_calls,
    }


def table(rows, passes):
    lines = [
        f"| trace | vmm pass 1 s | planned pass 1 s | ratio | vmm total s | planned total s "
        f"| ratio | planned x live | planned memory calls after pass 1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        x_live = "-" if r["x_live"] is None else f"{r['x_live']:.4f}"
        lines.append(
            f"| {r['trace']} | {r['vmm_first']:.3f} | {r['planned_first']:.3f} "
            f"| {r['first_ratio']:.3f} | {r['vmm_total']:.3f} | {r['planned_total']:.3f} "
            f"| {r['total_ratio']:.3f} | {x_live} | {r['late_calls']} |")
    bars = [
        (f"first pass <= {FIRST_PASS_BAR} x vmm's", lambda r: r["first_ratio"] <= FIRST_PASS_BAR),
        (f"total over {passes} passes <= vmm's", lambda r: r["total_ratio"] <= TOTAL_BAR),
        ("0 memory calls after pass 1", lambda r: r["late_calls"] == 0),
    ]
    lines.append("")
    for label, holds in bars:
        missed = [r["trace"] for r in rows if not holds(r)]
        lines.append(f"- {label}: {len(rows) - len(missed)} of {len(rows)} traces"
                     + (f"; missed on {', '.join(missed)}" if missed else ""))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--passes", type=int, default=5)
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("-k", "--keep", action="append", default=[], metavar="SUBSTRING",
                        help="only traces whose file name contains SUBSTRING (repeatable)")
    parser.add_argument("traces", nargs="*", help="default: every bundled trace")
    args = parser.parse_args()
    if args.passes < 2 or args.rounds < 1:
        parser.error("needs at least 2 passes and 1 round")
    cli = os.environ.get("SDALLOC_CLI", os.path.join(ROOT, "build/release/tools/sdalloc"))
    if not os.access(cli, os.X_OK):
        parser.error(f"{cli} not built")
    traces = args.traces or bundled_traces()
    if args.keep:
        traces = [t for t in traces if any(k in os.path.basename(t) for k in args.keep)]
    if not traces:
        parser.error("no trace left")
    rows = []
    with tempfile.TemporaryDirectory(prefix="planned-first-pass.") as out_dir:
        for i, trace in enumerate(traces, 1):
            name = os.path.basename(trace)
            print(f"planned_first_pass: {i}/{len(traces)}: {name}", file=sys.stderr)
            try:
                rounds = [replay(cli, trace, args.passes, os.path.join(out_dir, f"{i}.{k}.json"))
                          for k in range(args.rounds)]
            except RuntimeError as error:
                print(f"planned_first_pass: {error}", file=sys.stderr)
                return 1
            rows.append(row_of(name.split(".csv")[0], rounds))
    print(table(rows, args.passes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
