"""scripts/main_job_summary.py: one table over several `sdalloc replay --json` runs of the
same trace, each row with its own pass count, and a plain reading computed from the rows."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "main_job_summary.py"
GIB = 1 << 30


def result(name, ratio, seconds, peak=2 * GIB):
    return {"allocator": name, "ran": True, "ratio": ratio, "pass_seconds": seconds,
            "peak_reserved": peak, "counters": f"{name} counters", "problem": None}


def replay_json(path, passes, results, events=6428, peak_live=2 * GIB):
    path.write_text(json.dumps({"trace": "t.csv", "events": events, "allocations": 3214,
                                "passes": passes, "touch": True, "peak_live": peak_live,
                                "results": results}))
    return path


def summarize(*paths):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)],
                          capture_output=True, text=True, check=False)


def test_one_table_with_each_rows_passes_and_the_reading(tmp_path):
    kept = replay_json(tmp_path / "kept.json", 3, [
        result("pool", 1.007, [2.0, 0.30, 0.40]), result("planned", 1.0, [9.0, 0.5, 0.6]),
        result("tcmalloc", 1.017, [1.0, 0.40, 0.40])])
    glibc = replay_json(tmp_path / "glibc.json", 1, [result("glibc", 1.025, [20.0])])
    out = summarize(kept, glibc)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    # allocator, passes, peak held (2 words), x live, s/pass (median), 1st pass
    assert rows["pool"][:7] == ["pool", "3", "2.0", "GiB", "1.007", "0.400", "2.000"]
    assert rows["glibc"][:7] == ["glibc", "1", "2.0", "GiB", "1.025", "20.000", "20.000"]
    assert "pool 1.00 x, planned 1.50 x, glibc 50 x" in out.stdout  # against tcmalloc's 0.400
    assert "glibc hands large freed blocks back to the kernel" in out.stdout
    assert "Every sdalloc mode held less than tcmalloc" in out.stdout
    assert "scripts/run-main-job.sh --full" in out.stdout.splitlines()[-1]


def test_no_claim_of_holding_less_when_a_mode_held_more(tmp_path):
    kept = replay_json(tmp_path / "kept.json", 3, [
        result("vmm", 1.05, [1.0, 0.3, 0.3]), result("tcmalloc", 1.017, [1.0, 0.4, 0.4])])
    out = summarize(kept)
    assert out.returncode == 0, out.stderr
    assert "held less than tcmalloc" not in out.stdout
    assert "hands large freed blocks" not in out.stdout  # no glibc row, no such line


def test_an_allocator_that_did_not_run_shows_its_problem(tmp_path):
    kept = replay_json(tmp_path / "kept.json", 3, [
        {"allocator": "mimalloc", "ran": False, "problem": "libmimalloc.so.2 not found"},
        result("tcmalloc", 1.017, [1.0, 0.4, 0.4])])
    out = summarize(kept)
    assert out.returncode == 0, out.stderr
    assert "libmimalloc.so.2 not found" in out.stdout


def test_runs_of_different_traces_are_refused(tmp_path):
    one = replay_json(tmp_path / "one.json", 3, [result("pool", 1.0, [1.0])])
    other = replay_json(tmp_path / "other.json", 1, [result("glibc", 1.0, [1.0])], events=10)
    out = summarize(one, other)
    assert out.returncode == 1
    assert "replayed different traces" in out.stderr


def test_no_arguments_is_a_usage_error():
    out = summarize()
    assert out.returncode == 1
    assert "usage:" in out.stderr
