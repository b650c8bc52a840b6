#!/usr/bin/python3
"""bench/onnxruntime/ort_bench.py - the side-by-side benchmark of ONNX Runtime's allocators and
sdalloc's on one model: every configuration of sdalloc_ort_bench in a fresh process, in
interleaved rounds (so a busy machine slows all of them alike), one table and the bars.

Columns (figures come from sdalloc_ort_bench, each configuration measured the same way):
  RSS growth   peak RSS over the runs minus RSS before the first run (process-wide): pages
               the runs touch first; memory the session's creation touched and freed, which
               ORT's arena and glibc then reuse, is not in it
  peak RSS     the process's peak RSS from before the session is made to the end (weights,
               creation and runs)
  held         the allocator's own peak bytes over the runs beyond what was live before
               them (ORT arena: TotalAllocated; sdalloc: peak reserved); '-' for glibc
  steady held  sdalloc: the same over runs 2..N (after PlannedArena's plan exists)
  end held     sdalloc: what it holds after the last run beyond what was live before the
               first: what a long-lived session keeps between requests
  peak live    the allocator's peak live bytes over the runs (ORT: MaxInUse; sdalloc: the
               pool's peak live), beyond what was live before them
  ms/run       median over rounds of the mean of runs 2..N; first run apart
Bars (issue 13), against the session's peak live bytes as sdalloc-pool measures them:
  sdalloc-pool held <= 1.10 x peak live and <= 0.5 x ort-default's held;
  sdalloc-planned steady held <= 1.01 x peak live; ms/run of sdalloc-* <= 1.05 x ort-default;
  every configuration's output hash equal to ort-default's.

    /usr/bin/python3 bench/onnxruntime/ort_bench.py --bench BUILD/bench/sdalloc_ort_bench \\
        --models DIR --model resnet50 [--runs N] [--rounds R] [--threads T] [--json FILE]
"""

import argparse
import json
import statistics
import subprocess
import sys

CONFIGS = ["ort-default", "ort-arena-pow2", "ort-arena-same", "ort-patterns", "ort-plain",
           "sdalloc-pool", "sdalloc-vmm", "sdalloc-planned"]


def mib(v):
    return "-" if v is None else f"{v / 2**20:.1f}"


def run_one(args, config):
    cmd = [args.bench, "--models", args.models, "--model", args.model, "--config", config,
           "--runs", str(args.runs), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"ort_bench: {config} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--json")
    args = p.parse_args(argv)
    configs = args.configs.split(",")

    results = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            results[c].append(run_one(args, c))
            print(f"ort_bench: round {r + 1}/{args.rounds} {c}: "
                  f"{results[c][-1]['ms_per_run']:.1f} ms/run", file=sys.stderr)

    rows = {}
    for c, rs in results.items():
        first = rs[0]
        rows[c] = {
            "config": c,
            "rss_growth_bytes": max(x["rss_growth_bytes"] for x in rs),
            "rss_peak_bytes": max(x["rss_peak_bytes"] for x in rs),
            "held_bytes": first.get("held_bytes"),
            "steady_held_bytes": first.get("steady_held_bytes"),
            "end_held_bytes": first.get("end_held_bytes"),
            "peak_live_bytes": first.get("peak_live_bytes"),
            "ms_per_run": statistics.median(x["ms_per_run"] for x in rs),
            "first_run_ms": statistics.median(x["first_run_ms"] for x in rs),
            "faults_per_run": statistics.median(x["faults_per_run"] for x in rs),
            "output_hash": first["output_hash"],
            "hashes_agree": all(x["output_hash"] == first["output_hash"] and x["runs_equal"]
                                for x in rs),
        }

    print(f"\nmodel {args.model}: {args.runs} runs x {args.rounds} rounds, "
          f"{args.threads} intra-op thread(s)\n")
    print("| configuration | RSS growth MiB | peak RSS MiB | held MiB | steady held MiB | end held MiB "
          "| peak live MiB | ms/run | first run ms | faults/run | output |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ref = rows.get("ort-default")
    for c in configs:
        w = rows[c]
        same = ref is not None and w["output_hash"] == ref["output_hash"] and w["hashes_agree"]
        print(f"| {c} | {mib(w['rss_growth_bytes'])} | {mib(w['rss_peak_bytes'])} "
              f"| {mib(w['held_bytes'])} "
              f"| {mib(w['steady_held_bytes'])} | {mib(w['end_held_bytes'])} "
              f"| {mib(w['peak_live_bytes'])} "
              f"| {w['ms_per_run']:.1f} | {w['first_run_ms']:.1f} | {w['faults_per_run']:.0f} "
              f"| {'equal' if same else 'DIFFERS'} |")

    bars = []
    pool, planned = rows.get("sdalloc-pool"), rows.get("sdalloc-planned")
    if pool and ref:
        live = pool["peak_live_bytes"]
        bars.append(("sdalloc-pool held <= 1.10 x peak live", pool["held_bytes"] / live, 1.10))
        bars.append(("sdalloc-pool held <= 0.5 x ort-default held",
                     pool["held_bytes"] / ref["held_bytes"], 0.5))
        bars.append(("sdalloc-pool RSS growth <= 0.5 x ort-default RSS growth",
                     pool["rss_growth_bytes"] / max(ref["rss_growth_bytes"], 1), 0.5))
        if planned:
            bars.append(("sdalloc-planned steady held <= 1.01 x peak live",
                         planned["steady_held_bytes"] / live, 1.01))
        for c in ("sdalloc-pool", "sdalloc-vmm", "sdalloc-planned"):
            if c in rows:
                bars.append((f"{c} ms/run <= 1.05 x ort-default",
                             rows[c]["ms_per_run"] / ref["ms_per_run"], 1.05))
    print()
    for name, value, limit in bars:
        print(f"bar: {name}: {value:.3f} {'met' if value <= limit else 'MISSED'}")
    outputs_equal = ref is not None and all(
        w["output_hash"] == ref["output_hash"] and w["hashes_agree"] for w in rows.values())
    print(f"outputs: {'every configuration equal to ort-default' if outputs_equal else 'DIFFER'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": args.model, "rows": rows, "raw": results,
                       "bars": [{"bar": n, "value": v, "limit": l} for n, v, l in bars]},
                      f, indent=1)
    return 0 if outputs_equal else 1


if __name__ == "__main__":
    sys.exit(main())
