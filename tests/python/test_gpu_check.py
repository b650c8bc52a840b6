"""scripts/gpu-check.sh and scripts/gpu_workload.py without a GPU: argument handling, the
dry run, the table and its JSON, the verdicts of the bars, failed runs shown as FAILED rows,
and an end-to-end --cpu-smoke run of the real workload code on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "gpu-check.sh"
WORKLOAD = ROOT / "scripts" / "gpu_workload.py"
MiB = 1 << 20


def run(args, env=None, timeout=600):
    full_env = dict(os.environ, PYTHON=sys.executable)
    full_env.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env,
                          check=False)


def write_result(directory, config, reserved_mib, allocated_mib, ms):
    path = directory / f"{config}.json"
    path.write_text(json.dumps({
        "config": config, "peak_reserved_bytes": reserved_mib * MiB,
        "peak_allocated_bytes": allocated_mib * MiB, "time_per_iteration_s": ms / 1000}))
    return str(path)


def test_dry_run_lists_every_step_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    result = run([str(CHECK), "--dry-run", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "-DSDALLOC_WITH_CUDA=ON" in text
    assert "sdalloc_cuda_tests" in text
    for config in ("native", "expandable", "async", "sdalloc-pool", "sdalloc-async",
                   "sdalloc-vmm", "sdalloc-planned"):
        assert f"--config {config} " in text
    assert f"--json {out}/gpu-check.json" in text
    assert not out.exists()


def test_bad_arguments_are_refused_with_a_reason():
    for args, message in ((["--configs", "native,bogus"], "unknown configuration 'bogus'"),
                          (["--iterations", "0"], "--iterations needs a positive integer"),
                          (["--out"], "--out needs a directory"),
                          (["--frobnicate"], "unknown argument '--frobnicate'")):
        result = run([str(CHECK), "--dry-run"] + args)
        assert result.returncode == 1, args
        assert "gpu-check: FAILED: " + message in result.stderr, result.stderr
    result = run([str(CHECK), "--help"])
    assert result.returncode == 0 and "--cpu-smoke" in result.stdout


def test_table_is_aligned_and_judges_the_bars(tmp_path):
    files = [write_result(tmp_path, "native", 3000, 2000, 50.0),
             write_result(tmp_path, "expandable", 2500, 2000, 50.0),
             write_result(tmp_path, "sdalloc-pool", 2400, 2000, 51.0),
             write_result(tmp_path, "sdalloc-async", 2600, 2000, 60.0)]
    json_path = tmp_path / "table.json"
    result = run([sys.executable, str(WORKLOAD), "table"] + files + ["--json", str(json_path)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["config", "peak", "reserved", "MiB", "peak", "allocated", "MiB",
                                "ms/iteration", "status"]
    table = lines[2:6]
    assert len({len(line) for line in lines[:6]}) <= 2  # right-aligned columns
    assert table[0].split()[:4] == ["native", "3000.0", "2000.0", "50.00"]
    assert "PASS  sdalloc-pool: peak reserved 2400.0 MiB < native 3000.0 MiB" in result.stdout
    assert "PASS  sdalloc-pool: peak reserved 2400.0 MiB <= expandable 2500.0 MiB" in result.stdout
    assert "PASS  sdalloc-pool: time per iteration 1.020 x expandable's" in result.stdout
    assert "MISS  sdalloc-async: peak reserved 2600.0 MiB <= expandable" in result.stdout
    assert "MISS  sdalloc-async: time per iteration 1.200 x" in result.stdout
    written = json.loads(json_path.read_text())
    assert [r["config"] for r in written["results"]] == ["native", "expandable", "sdalloc-pool",
                                                         "sdalloc-async"]
    assert sum(1 for bar in written["bars"] if not bar["ok"]) == 2
    strict = run([sys.executable, str(WORKLOAD), "table", "--strict"] + files)
    assert strict.returncode == 1


def test_table_notes_where_a_planned_run_served_its_steps(tmp_path):
    path = tmp_path / "sdalloc-planned.json"
    path.write_text(json.dumps({
        "config": "sdalloc-planned", "peak_reserved_bytes": 100 * MiB,
        "peak_allocated_bytes": 90 * MiB, "time_per_iteration_s": 0.05,
        "step_stats": {"planned_allocations": 120, "kept_allocations": 0,
                       "fallback_allocations": 130, "recorded_allocations": 40,
                       "recorded_steps": 1, "planned_steps": 7, "divergent_steps": 4,
                       "replans": 0, "arena_failures": 0, "arena_bytes": 80 * MiB,
                       "plans": 1}}))
    result = run([sys.executable, str(WORKLOAD), "table", str(path)])
    assert result.returncode == 0, result.stderr
    assert ("ok; steps: 120 planned, 0 kept, 130 fallback allocations; 4/7 planned steps "
            "divergent, 1 recorded, 0 replans, 1 plans") in result.stdout


def test_failed_run_is_a_failed_row_and_a_failing_exit(tmp_path):
    good = write_result(tmp_path, "native", 100, 50, 5.0)
    broken = tmp_path / "sdalloc-pool.json"
    broken.write_text(json.dumps({"config": "sdalloc-pool",
                                  "error": "RuntimeError: CUDA out of memory\nmore"}))
    missing = str(tmp_path / "async.json")
    result = run([sys.executable, str(WORKLOAD), "table", good, str(broken), missing])
    assert result.returncode == 1
    assert "FAILED: RuntimeError: CUDA out of memory" in result.stdout
    assert "FAILED: no result:" in result.stdout
    assert "gpu_workload: FAILED runs: sdalloc-pool, async" in result.stderr


def test_workload_refuses_bad_arguments(tmp_path):
    result = run([sys.executable, str(WORKLOAD), "run", "--config", "nope", "--out",
                  str(tmp_path / "x.json")])
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr
    result = run([sys.executable, str(WORKLOAD), "run", "--config", "native", "--out",
                  str(tmp_path / "x.json"), "--iterations", "0"])
    assert result.returncode == 2 and "--iterations and --steps must be >= 1" in result.stderr


def test_cpu_smoke_runs_the_real_workload_end_to_end(torch, tmp_path):  # pylint: disable=unused-argument
    out = tmp_path / "smoke"
    result = run([str(CHECK), "--cpu-smoke", "--configs", "native,sdalloc-pool,sdalloc-planned",
                  "--out", str(out)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpu_workload: native: 1 iterations" in result.stdout
    data = json.loads((out / "gpu-check.json").read_text())
    assert [r["config"] for r in data["results"]] == ["native", "sdalloc-pool",
                                                      "sdalloc-planned"]
    # On the CPU torch's tensors do not reach the shim: the one step (an iteration) ran on
    # the shim's host planned pool and held no allocations, so it planned nothing.
    planned = data["results"][2]
    assert "mode:planned" in planned["sdalloc_conf"]
    assert planned["step_stats"]["recorded_steps"] == 1
    assert planned["step_stats"]["planned_allocations"] == 0
    assert planned["step_stats"]["divergent_steps"] == 0
    assert "ok; steps: 0 planned, 0 kept, 0 fallback allocations" in result.stdout
    for r in data["results"]:
        assert r["cpu_smoke"] is True and r["time_per_iteration_s"] > 0
        assert r["parameters"] > 0 and r["shapes"] == [[1, 4, 16, 16], [2, 4, 24, 24]]
        assert r["peak_reserved_bytes"] is None  # no device memory on the CPU
    assert (out / "native.log").exists()
