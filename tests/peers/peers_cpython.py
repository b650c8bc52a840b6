"""CPython's regression suite (Debian's libpython3.11-testsuite) under sdalloc's drop-in.

One regrtest run (`python3 -m test -j2 --junit-xml ...`) without the drop-in, then one per
configuration with LD_PRELOAD=libsdalloc_preload.so and SDALLOC_PRELOAD_CONF (the mode
always given, so the runs mean the same whatever the drop-in's default mode). Outcomes are
compared at two levels:
  - each test module's, from regrtest's progress lines ("[ 3/40] test_x passed");
  - each test case's, from the JUnit XML regrtest writes (pass, failure, error, skipped,
    expected failure, unexpected success).
A module whose outcomes differ is run again alone, without and with the drop-in; a difference
that does not come back is reported as not reproduced (timing-dependent tests), one that does
is confirmed. A module that crashes (a signal, a worker that died) under the drop-in and not
without counts whether or not it comes back.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import re
import subprocess
import time
import xml.etree.ElementTree as ET

PYTHON = "/usr/bin/python3"
TESTSUITE = pathlib.Path("/usr/lib/python3.11/test/regrtest.py")

# The CI slice: allocation-heavy modules (bytes, containers, pickle, compression, ctypes,
# buffers, unicode, gc and weakrefs) and the fork/subprocess/thread ones (fork1, wait4,
# subprocess, threading, pty, posix, embed: each starts processes that inherit the drop-in).
# About 45 s with -j2 on the project's 2-core machine.
SLICE = ("test_array test_bigmem test_bytes test_bz2 test_codecs test_collections test_ctypes "
         "test_deque test_dict test_embed test_fork1 test_gc test_gzip test_hashlib "
         "test_itertools test_json test_list test_marshal test_memoryview test_mmap test_os "
         "test_pickle test_posix test_pty test_re test_select test_set test_sort test_struct "
         "test_subprocess test_sys test_threading test_tracemalloc test_unicode "
         "test_unicodedata test_wait4 test_weakref test_zlib").split()
# The share check runs these in one process (no -j), where the drop-in serves everything.
SHARE_SLICE = "test_bytes test_pickle test_array test_zlib test_memoryview".split()

# Test cases left out of every run, with and without the drop-in, because this machine cannot
# run them: ThreadedVSOCKSocketStreamTest (test_socket) waits in accept() for a vsock peer that
# a VM without a vsock host service never sends, until regrtest's timeout kills the module.
IGNORED = {"ThreadedVSOCKSocketStreamTest": "hangs in accept() on a VM without a vsock peer"}

_PROGRESS = re.compile(r"\[\s*\d+/\d+(?:/\d+)?\] (test[\w.]*) (.*)$")


def module_outcome(text: str) -> str:
    """The outcome in a progress line's text after the module name."""
    text = text.split(" -- running:")[0].strip()
    for prefix, outcome in (("failed (env changed)", "env changed"),
                            ("failed (reference leak)", "reference leak"),
                            ("failed", "failed"),
                            ("skipped (resource denied)", "resource denied"),
                            ("skipped", "skipped"), ("passed", "passed"),
                            ("ran no tests", "ran no tests"), ("crashed", "crashed"),
                            ("timed out", "timed out"), ("interrupted", "interrupted")):
        if text.startswith(prefix):
            return outcome
    return "unknown: " + text[:60]


def parse_progress(log: str) -> dict:
    """{module: outcome} from regrtest's output (its last line for a module wins)."""
    modules = {}
    for line in log.splitlines():
        m = _PROGRESS.search(line)
        if m:
            modules[m.group(1)] = module_outcome(m.group(2))
    return modules


def case_outcome(element) -> str:
    tags = {child.tag for child in element}
    if "error" in tags:
        return "error"
    if "failure" in tags:
        return "failure"
    if "skipped" in tags:
        return "skipped"
    if "output" in tags:
        return "expected failure"
    if "outcome" in tags:
        return "unexpected success"
    return "pass"


def module_of(case_name: str) -> str:
    parts = case_name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "test" else parts[0]


def parse_junit(path: pathlib.Path) -> dict:
    """{test case: outcome} from regrtest's --junit-xml file. A case that unittest ended
    without a result (its subtests failed) has no name: it is counted per module as
    "<module>.<unnamed N>", failure."""
    cases = {}
    if not path.exists():
        return cases
    unnamed = collections.Counter()
    for suite in ET.parse(path).getroot():
        named = [c.get("name") for c in suite if c.get("name")]
        module = module_of(named[0]) if named else "?"
        for case in suite:
            name = case.get("name")
            if name is None:
                unnamed[module] += 1
                cases[f"{module}.<unnamed {unnamed[module]}>"] = "failure"
            else:
                cases[name] = case_outcome(case)
    return cases


@dataclasses.dataclass
class SuiteRun:
    label: str
    modules: dict          # module -> outcome
    cases: dict            # test case -> outcome
    seconds: float
    log: pathlib.Path

    def counts(self):
        ran = [o for o in self.cases.values() if o != "skipped"]
        passed = [o for o in ran if o in ("pass", "expected failure")]
        return len(ran), len(passed)


def clean_env() -> dict:
    """The environment of a run without the drop-in: no preload, no sdalloc settings, and no
    PYTHONPATH, so the suite imports only the interpreter's own modules."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("SDALLOC_")}
    env.pop("PYTHONPATH", None)
    return env


def preload_env(library, conf: str, extra_preload=()) -> dict:
    env = clean_env()
    env["LD_PRELOAD"] = " ".join([str(p) for p in extra_preload] + [str(library)])
    env["SDALLOC_PRELOAD_CONF"] = conf
    return env


def run_regrtest(label, env, tests, work: pathlib.Path, jobs=2, timeout=900, testdir=None,
                 log=print):
    """One regrtest run in its own folder (its cwd and TMPDIR); tests=None: the whole suite.
    testdir: a folder of test modules instead of CPython's (the runner's own self-test)."""
    folder = work / re.sub(r"[^\w.-]", "_", label)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    junit = folder / "junit.xml"
    junit.unlink(missing_ok=True)
    cmd = [PYTHON, "-m", "test", f"-j{jobs}", "--timeout", str(timeout), "--junit-xml",
           str(junit)] + [arg for pattern in IGNORED for arg in ("--ignore", pattern)]
    if testdir:
        cmd += ["--testdir", str(testdir)]
    cmd += list(tests or [])
    env = dict(env, TMPDIR=str(folder / "tmp"))
    start = time.monotonic()
    with open(folder / "regrtest.log", "w") as out:
        subprocess.run(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    text = (folder / "regrtest.log").read_text(errors="replace")
    run = SuiteRun(label, parse_progress(text), parse_junit(junit), seconds,
                   folder / "regrtest.log")
    ran, passed = run.counts()
    log(f"cpython {label}: {len(run.modules)} modules, {ran} cases run, {passed} passed, "
        f"{seconds:.0f} s")
    return run


@dataclasses.dataclass
class Difference:
    module: str
    detail: str                   # what differs
    status: str = "unconfirmed"   # confirmed / not reproduced / crash


def compare(base: SuiteRun, other: SuiteRun) -> list:
    """Every module whose outcome, or whose test cases' outcomes, differ."""
    by_module = collections.defaultdict(list)
    for module in sorted(set(base.modules) | set(other.modules)):
        a, b = base.modules.get(module, "absent"), other.modules.get(module, "absent")
        if a != b:
            by_module[module].append(f"module {a} -> {b}")
    for case in sorted(set(base.cases) | set(other.cases)):
        a, b = base.cases.get(case, "absent"), other.cases.get(case, "absent")
        if a != b:
            by_module[module_of(case)].append(f"{case}: {a} -> {b}")
    diffs = []
    for module, items in by_module.items():
        detail = "; ".join(items[:4]) + (f"; ... {len(items) - 4} more" if len(items) > 4 else "")
        diffs.append(Difference(module, detail))
    return diffs


def is_crash(diff: Difference, base: SuiteRun, other: SuiteRun) -> bool:
    """The module crashed (a signal, a worker that died or hung past --timeout) with the
    drop-in and not without."""
    return other.modules.get(diff.module) == "crashed" != base.modules.get(diff.module)


def confirm(diffs, base_env, other_env, base: SuiteRun, other: SuiteRun, work: pathlib.Path,
            label, log=print, **regrtest_args):
    """Runs each differing module again, alone, without and with the drop-in."""
    for i, d in enumerate(diffs):
        if is_crash(d, base, other):
            d.status = "crash"
            continue
        again_base = run_regrtest(f"{label}.recheck{i}.base", base_env, [d.module], work,
                                  log=log, **regrtest_args)
        again = run_regrtest(f"{label}.recheck{i}", other_env, [d.module], work, log=log,
                             **regrtest_args)
        d.status = "confirmed" if compare(again_base, again) else "not reproduced"
    return diffs


# --- the share of bytes the pool served -----------------------------------------------------

def census_share(library, census, conf, tests, work: pathlib.Path, label, log=print):
    """Runs `tests` in one process with the census in front of the drop-in; returns the bytes
    and requests the pool and the system served (all processes summed), and the drop-in's
    report of the main process (report: in a file; regrtest -j would read it from stdout)."""
    import json
    folder = work / f"share.{label}"
    census_dir = folder / "census"
    census_dir.mkdir(parents=True, exist_ok=True)
    for f in census_dir.glob("*.json"):
        f.unlink()
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    env = preload_env(library, f"{conf},report:{report}", extra_preload=[census])
    env["SDALLOC_CENSUS_DIR"] = str(census_dir)
    env["TMPDIR"] = str(folder)
    proc = subprocess.run([PYTHON, "-m", "test"] + list(tests), cwd=folder, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    total = collections.Counter()
    for f in census_dir.glob("census.*.json"):
        total.update({k: v for k, v in json.loads(f.read_text()).items()
                      if k.endswith(("_bytes", "_requests"))})
    share = {"processes": len(list(census_dir.glob("census.*.json"))),
             "returncode": proc.returncode, **total}
    share["report"] = json.loads(report.read_text()) if report.exists() else None
    all_bytes = total["pool_bytes"] + total["system_bytes"]
    share["pool_share"] = total["pool_bytes"] / all_bytes if all_bytes else 0.0
    log(f"cpython share {label}: the pool served {share['pool_share']:.1%} of "
        f"{all_bytes / 2**20:.0f} MiB ({total['pool_requests']} of "
        f"{total['pool_requests'] + total['system_requests']} requests) in "
        f"{share['processes']} processes")
    return share
