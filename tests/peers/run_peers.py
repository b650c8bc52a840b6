#!/usr/bin/python3
"""run_peers.py - other people's test suites, run without and with sdalloc, compared.

  tests/peers/run_peers.py [--full] [--suites cpython,onnx] [--modes pool,vmm,planned]
                           [--thresholds 4KiB,default] [--build build/release] [--work DIR]

Suites (installed from Debian by scripts/install-deps.sh, which this calls when they are
missing; docs/peers.md):
  cpython  CPython 3.11's regression suite (libpython3.11-testsuite) under the malloc drop-in
           (libsdalloc_preload.so), once without it and once per mode and threshold
           (SDALLOC_PRELOAD_CONF=mode:M,threshold:T; "default" gives no threshold key); at
           threshold 4KiB also the share of all bytes the pool served, counted by
           libsdalloc_peers_census.so with the drop-in's report (peers_cpython.py).
  onnx     ONNX 1.12's backend tests (libonnx-testdata) through ONNX Runtime 1.29:
           ORT's defaults, then sdalloc's OrtAllocator in pool, vmm and planned mode
           (sdalloc_peers_onnx, peers_onnx.py).
Default: the CI slice (scripts/test-all.sh, stage `peers`): CPython's SLICE at threshold 4KiB
in every mode, and every ONNX node and model test. --full: CPython's whole suite at both
thresholds.

Prints one table (suite, mode, tests run, passed, differences, time against the run without
sdalloc), then every difference. Exits 1 when a difference counts: an ONNX case whose outputs
differ or that fails under sdalloc; a CPython module whose outcome differs again when run
alone, or that crashes under the drop-in; a pool share of the bytes at 4KiB under one half,
or requests the drop-in's pool had to hand to the system. Differences that did not come back
when rerun are listed and do not fail the run.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import peers_cpython  # noqa: E402
import peers_onnx  # noqa: E402

MIN_POOL_SHARE = 0.5


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def ensure_installed(suites):
    """The suites' Debian packages, through scripts/install-deps.sh when one is missing."""
    def missing():
        gone = []
        if "cpython" in suites and not peers_cpython.TESTSUITE.exists():
            gone.append("libpython3.11-testsuite")
        if "onnx" in suites:
            if not (peers_onnx.DATA_ROOT / "node").is_dir():
                gone.append("libonnx-testdata")
            if subprocess.run([peers_cpython.PYTHON, "-c", "import onnx"],
                              capture_output=True).returncode != 0:
                gone.append("python3-onnx")
        return gone
    if missing():
        subprocess.run([str(ROOT / "scripts" / "install-deps.sh")], check=True)
    if missing():
        raise SystemExit(f"run_peers: still missing after install-deps.sh: {missing()}")


def conf_of(mode, threshold):
    return f"mode:{mode}" + ("" if threshold == "default" else f",threshold:{threshold}")


def run_cpython(args, build: pathlib.Path, work: pathlib.Path, rows, failures, notes):
    library = build / "src" / "preload" / "libsdalloc_preload.so"
    census = build / "tests" / "peers" / "libsdalloc_peers_census.so"
    for path in (library, census):
        if not path.exists():
            raise SystemExit(f"run_peers: {path} not built (cmake --build {build} --target "
                             "sdalloc_preload sdalloc_peers_census)")
    tests = args.tests or (None if args.full else peers_cpython.SLICE)
    base_env = peers_cpython.clean_env()
    regrtest_args = {"jobs": args.jobs, "timeout": args.timeout, "testdir": args.testdir}
    base = peers_cpython.run_regrtest("glibc", base_env, tests, work, log=log, **regrtest_args)
    ran, passed = base.counts()
    rows.append(("cpython", "glibc", ran, passed, "-", f"{base.seconds:.0f} s", ""))
    for threshold in args.thresholds:
        for mode in args.modes:
            label = f"{mode}@{threshold}"
            env = peers_cpython.preload_env(library, conf_of(mode, threshold))
            run = peers_cpython.run_regrtest(label, env, tests, work, log=log, **regrtest_args)
            diffs = peers_cpython.compare(base, run)
            peers_cpython.confirm(diffs, base_env, env, base, run, work, label, log=log,
                                  **regrtest_args)
            counted = [d for d in diffs if d.status in ("confirmed", "crash")]
            share_text = ""
            if threshold == "4KiB" and not args.no_share:
                share = peers_cpython.census_share(library, census, conf_of(mode, threshold),
                                                   peers_cpython.SHARE_SLICE, work, label,
                                                   log=log)
                share_text = f"pool {share['pool_share']:.0%} of bytes"
                report = share["report"] or {}
                if share["pool_share"] < MIN_POOL_SHARE:
                    failures.append(f"cpython {label}: the pool served {share['pool_share']:.1%}"
                                    f" of the bytes, under {MIN_POOL_SHARE:.0%}")
                if report.get("system_allocations", 1) != 0:
                    failures.append(f"cpython {label}: drop-in report {report or 'missing'}")
                notes.append(f"cpython {label} share: {share}")
            ran, passed = run.counts()
            rows.append(("cpython", label, ran, passed, f"{len(counted)} ({len(diffs)})",
                         f"{run.seconds / base.seconds:.2f} x", share_text))
            for d in diffs:
                line = f"cpython {label}: {d.module} [{d.status}]: {d.detail}"
                (failures if d in counted else notes).append(line)


def run_onnx(args, build: pathlib.Path, work: pathlib.Path, rows, failures, notes):
    driver = build / "tests" / "peers" / "sdalloc_peers_onnx"
    if not driver.exists():
        raise SystemExit(f"run_peers: {driver} not built (ONNX Runtime found? "
                         f"cmake --build {build} --target sdalloc_peers_onnx)")
    for suite, kinds in (("onnx-node", ("node",)),
                         ("onnx-model", ("simple", "pytorch-converted", "pytorch-operator"))):
        result = peers_onnx.run_onnx_suite(driver, work / suite, args.modes, kinds, log=log)
        total = result.prepared + len(result.unsupported)
        rows.append((suite, "ort-default", total, len(result.passing), "-",
                     f"{result.seconds['ort']:.1f} s",
                     f"{len(result.unsupported)} unfed, {len(result.ort_fails)} ORT fails"))
        for mode in args.modes:
            diffs = result.differences[mode]
            n = len(result.passing)
            rows.append((suite, mode, n, n - len(diffs), str(len(diffs)),
                         f"{result.seconds[mode] / max(result.seconds['ort'], 1e-9):.2f} x",
                         f"{result.allocs[mode]} sdalloc allocations"))
            failures += [f"{suite} {mode}: {case}: {why}" for case, why in diffs]
            if n and result.allocs[mode] == 0:  # the sessions never reached sdalloc's pool
                failures.append(f"{suite} {mode}: no allocation came from sdalloc")
        notes += [f"{suite}: not fed: {c}: {why}" for c, why in result.unsupported.items()]
        if args.verbose:
            notes += [f"{suite}: ORT's defaults fail {c}: {why}" for c, why in
                      sorted(result.ort_fails.items())]
        elif result.ort_fails:
            notes.append(f"{suite}: ORT's defaults fail {len(result.ort_fails)} (--verbose says "
                         f"why): {' '.join(sorted(result.ort_fails))}")


def print_table(rows):
    head = ("suite", "mode", "tests run", "passed", "differences", "time", "")
    table = [head] + [tuple(str(x) for x in r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="CPython's whole suite, both thresholds")
    p.add_argument("--suites", default="cpython,onnx")
    p.add_argument("--modes", default="pool,vmm,planned")
    p.add_argument("--thresholds", default=None,
                   help="default: 4KiB (slice), 4KiB,default (--full)")
    p.add_argument("--tests", default=None, help="CPython test modules, comma-separated")
    p.add_argument("--build", default=str(ROOT / "build" / "release"))
    p.add_argument("--work", default=None, help="where runs write (default: a temporary folder)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=None,
                   help="regrtest's per-module timeout, s (default: 300 slice, 900 --full)")
    p.add_argument("--no-share", action="store_true", help="skip the census of the pool's share")
    p.add_argument("--verbose", action="store_true", help="why ORT fails each test it fails")
    p.add_argument("--testdir", default=None, help=argparse.SUPPRESS)  # the self-test's modules
    args = p.parse_args(argv)
    args.suites = args.suites.split(",")
    args.modes = args.modes.split(",")
    args.thresholds = (args.thresholds or ("4KiB,default" if args.full else "4KiB")).split(",")
    args.tests = args.tests.split(",") if args.tests else None
    # The slice's slowest module takes about 25 s: a hang shows within minutes in CI.
    args.timeout = args.timeout or (900 if args.full else 300)

    ensure_installed(args.suites)
    build = pathlib.Path(args.build).resolve()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="sdalloc-peers-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log(f"run_peers: suites {args.suites}, modes {args.modes}, thresholds {args.thresholds}, "
        f"{'full' if args.full else 'slice'}; work in {work}")
    rows, failures, notes = [], [], []
    start = time.monotonic()
    if "onnx" in args.suites:
        run_onnx(args, build, work, rows, failures, notes)
    if "cpython" in args.suites:
        run_cpython(args, build, work, rows, failures, notes)

    print()
    print_table(rows)
    print()
    for line in notes:
        print("note:", line)
    for line in failures:
        print("DIFFERENCE:", line)
    print(f"\nrun_peers: {len(failures)} differences that count, {time.monotonic() - start:.0f} s"
          f" in all; work in {work}")
    if not args.work and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
