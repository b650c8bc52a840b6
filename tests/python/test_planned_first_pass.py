"""scripts/planned_first_pass.py: its table and bars, run over a stand-in for `sdalloc` (SDALLOC_CLI)
that writes replay JSON in the shape `sdalloc replay --json` writes (the real run takes minutes)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "planned_first_pass.py"

# The stand-in: planned's pass seconds and late memory calls depend on the trace's name; a
# trace named broken* fails; every call is logged to calls.log beside it.
FAKE_CLI = r'''#!/usr/bin/python3
import json, os, sys
args = sys.argv[1:]
with open(os.path.join(os.path.dirname(__file__), "calls.log"), "a") as log:
    log.write(" ".join(args) + "\n")
trace = os.path.basename(args[-1])
if trace.startswith("broken"):
    print("cannot read", trace, file=sys.stderr)
    sys.exit(1)
out = args[args.index("--json") + 1]
vmm = [1.0, 0.5, 0.5, 0.5, 0.5]
planned = {"fast": [1.2, 0.4, 0.4, 0.4, 0.4], "slow": [2.0, 0.5, 0.5, 0.5, 0.5]}[trace.split(".")[0]]
calls = [7, 0, 0, 0, 0] if trace.startswith("fast") else [7, 0, 3, 0, 0]
run = {"trace": trace, "passes": 5, "peak_live": 1000, "results": [
    {"allocator": "vmm", "ran": True, "pass_seconds": vmm, "peak_reserved": 1040,
     "pass_memory_calls": [9, 0, 0, 0, 0]},
    {"allocator": "planned", "ran": True, "pass_seconds": planned, "peak_reserved": 1001,
     "pass_memory_calls": calls}]}
json.dump(run, open(out, "w"))
'''


def fake_cli(tmp_path):
    cli = tmp_path / "sdalloc"
    cli.write_text(FAKE_CLI)
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return cli


def run(tmp_path, *args):
    env = dict(os.environ, SDALLOC_CLI=str(fake_cli(tmp_path)))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, check=False)


def traces(tmp_path, *names):
    paths = []
    for name in names:
        (tmp_path / name).write_text("")
        paths.append(str(tmp_path / name))
    return paths


def test_each_trace_gets_a_row_and_each_bar_names_the_traces_that_miss_it(tmp_path):
    done = run(tmp_path, "-r", "2", *traces(tmp_path, "fast.csv", "slow.csv.gz"))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fast")
            or line.startswith("| slow")]
    assert rows[0] == ("| fast | 1.000 | 1.200 | 1.200 | 3.000 | 2.800 | 0.933 | 1.0010 | 0 |")
    assert rows[1] == ("| slow | 1.000 | 2.000 | 2.000 | 3.000 | 4.000 | 1.333 | 1.0010 | 3 |")
    assert "- first pass <= 1.5 x vmm's: 1 of 2 traces; missed on slow" in done.stdout
    assert "- total over 5 passes <= vmm's: 1 of 2 traces; missed on slow" in done.stdout
    assert "- 0 memory calls after pass 1: 1 of 2 traces; missed on slow" in done.stdout
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 4  # two rounds of each trace
    assert calls[0].startswith("replay -q --touch -n 5 -a vmm,planned --json ")


def test_keep_runs_a_subset(tmp_path):
    done = run(tmp_path, "-r", "1", "-k", "slow", *traces(tmp_path, "fast.csv", "slow.csv"))
    assert done.returncode == 0, done.stderr
    assert "| slow |" in done.stdout and "| fast |" not in done.stdout
    assert "- first pass <= 1.5 x vmm's: 0 of 1 traces; missed on slow" in done.stdout


def test_a_failed_replay_is_an_error_that_names_the_trace(tmp_path):
    done = run(tmp_path, "-r", "1", *traces(tmp_path, "fast.csv", "broken.csv"))
    assert done.returncode == 1
    assert "broken.csv" in done.stderr and "cannot read" in done.stderr
    assert done.stdout == ""


def test_bad_options_and_a_missing_cli_are_refused(tmp_path):
    assert run(tmp_path, "-n", "1").returncode == 2
    assert run(tmp_path, "-k", "nothing-matches").returncode == 2
    env = dict(os.environ, SDALLOC_CLI=str(tmp_path / "missing"))
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 2 and "not built" in done.stderr
