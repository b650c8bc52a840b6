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


def write_result(directory, config, reserved_mib, allocated_mib, ms, fingerprint=None,
                 steady_calls=(0, 0)):
    path = directory / f"{config}.json"
    path.write_text(json.dumps({
        "config": config, "peak_reserved_bytes": reserved_mib * MiB,
        "peak_allocated_bytes": allocated_mib * MiB, "device_peak_bytes": reserved_mib * MiB,
        "time_per_iteration_s": ms / 1000, "problems": [],
        "output_fingerprint": fingerprint or {"sum": 1.0, "abs_sum": 10.0, "first": []},
        "per_shape": [{"shape": [2, 4, 64, 64], "median_s": ms / 1000, "iterations": 20,
                       "steady_iterations": 10, "steady_device_calls": steady_calls[0]},
                      {"shape": [2, 4, 96, 96], "median_s": 2 * ms / 1000, "iterations": 20,
                       "steady_iterations": 10, "steady_device_calls": steady_calls[1]}]}))
    return str(path)


def test_dry_run_shows_every_stage_with_a_budget_within_the_deadline(tmp_path):
    out = tmp_path / "out"
    result = run([str(CHECK), "--dry-run", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    text = result.stdout
    budgets = {}
    for line in text.splitlines():
        if line.startswith("stage "):
            name, seconds = line.split()[1], int(line.split()[3])
            budgets[name] = seconds
    expected = ["preflight", "cuda-tests", "tensorrt", "contract", "mempool", "transfer",
                "offload"] + [
        f"run:{c}" for c in ("native", "expandable", "async", "sdalloc-vmm", "sdalloc-pool",
                             "sdalloc-async", "sdalloc-planned")] + [
        f"pipeline:{c}" for c in ("native", "expandable", "async", "sdalloc-vmm",
                                  "sdalloc-pool", "sdalloc-planned")] + ["table"]
    assert list(budgets) == expected, list(budgets)
    assert all(0 < b <= 60 for b in budgets.values()), budgets   # 60 s per run at most
    # A lent device has 15 minutes; its start and the transfers take about 4 of them.
    assert sum(budgets.values()) <= 9 * 60
    assert f"total budget {sum(budgets.values())} s of the 540 s deadline" in text
    assert "~240 s start and transfers + the 540 s deadline = 780 s of its 900 s" in text
    assert f"would write {out}/gpu-check.json and {out}/gpu-check.log" in text
    assert not out.exists()
    smoke = run([str(CHECK), "--dry-run", "--cpu-smoke"])
    assert "cuda-tests" not in smoke.stdout and "stage contract" in smoke.stdout
    assert "stage transfer" not in smoke.stdout  # needs a GPU: skipped under --cpu-smoke
    assert "stage offload" in smoke.stdout  # on the host backend under --cpu-smoke
    assert "stage pipeline:sdalloc-planned" in smoke.stdout  # the small pipeline on the CPU
    only = run([str(CHECK), "--dry-run", "--configs", "native,sdalloc-async"])
    assert "stage pipeline:native" in only.stdout
    assert "pipeline:sdalloc-async" not in only.stdout  # the pipeline leaves it out
    tight = run([str(CHECK), "--dry-run", "--deadline", "100"])
    assert tight.returncode == 1 and "exceed the deadline (100 s)" in tight.stderr


def test_bad_arguments_are_refused_with_a_reason():
    for args, message in ((["--configs", "native,bogus"], "unknown configuration 'bogus'"),
                          (["--iterations", "0"], "--iterations needs a positive integer"),
                          (["--out"], "--out needs a directory"),
                          (["--deadline", "x"], "--deadline needs a positive integer"),
                          (["--frobnicate"], "unknown argument '--frobnicate'"),
                          (["--configs", "native,sdalloc-chunked"],
                           "sdalloc-chunked is retired (segments:chunked, 0.2)")):
        result = run([str(CHECK), "--dry-run"] + args)
        assert result.returncode == 1, args
        assert "gpu-check: FAILED: " + message in result.stderr, result.stderr
    result = run([str(CHECK), "--help"])
    assert result.returncode == 0 and "--cpu-smoke" in result.stdout


def test_table_is_aligned_and_judges_the_bars_per_shape(tmp_path):
    files = [write_result(tmp_path, "native", 3000, 2000, 50.0),
             write_result(tmp_path, "expandable", 2500, 2000, 50.0),
             write_result(tmp_path, "sdalloc-pool", 2400, 2000, 51.0),
             write_result(tmp_path, "sdalloc-async", 2600, 2000, 60.0,
                          {"sum": 1.5, "abs_sum": 10.0, "first": []}, steady_calls=(0, 6))]
    json_path = tmp_path / "table.json"
    result = run([sys.executable, str(WORKLOAD), "table"] + files + ["--json", str(json_path)])
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["config", "reserved", "MiB"]
    assert len({len(line) for line in lines[2:6]}) == 1  # fixed-width columns
    assert lines[2].split()[:6] == ["native", "3000.0", "2000.0", "3000.0", "50.00", "100.00"]
    assert "PASS  sdalloc-pool: peak reserved 2400.0 MiB < native 3000.0 MiB" in result.stdout
    assert "PASS  sdalloc-pool: peak reserved 2400.0 MiB <= expandable 2500.0 MiB" in result.stdout
    assert "PASS  sdalloc-pool: time at 64x64 1.020 x expandable's" in result.stdout
    assert "PASS  sdalloc-pool: time at 96x96 1.020 x expandable's" in result.stdout
    assert "MISS  sdalloc-async: time at 96x96 1.200 x" in result.stdout
    assert "PASS  sdalloc-pool: output equals native's" in result.stdout
    assert "MISS  sdalloc-async: output equals native's" in result.stdout
    # A settled pool makes no device call in the second half of a shape's timed steps.
    assert ("PASS  sdalloc-pool: 0 cudaMalloc+cudaFree in the last 10 of 20 steps at 96x96"
            in result.stdout)
    assert ("MISS  sdalloc-async: 6 cudaMalloc+cudaFree in the last 10 of 20 steps at 96x96"
            in result.stdout)
    assert "PASS  sdalloc-async: 0 cudaMalloc+cudaFree in the last 10 of 20 steps at 64x64" \
        in result.stdout
    # A different output fails the verdict even without --strict; the bars alone do not.
    assert result.returncode == 1 and "gpu-check: VERDICT: FAIL" in result.stdout
    written = json.loads(json_path.read_text())
    assert written["verdict"] == "FAIL"
    assert [r["config"] for r in written["results"]] == ["native", "expandable", "sdalloc-pool",
                                                         "sdalloc-async"]
    relaxed = run([sys.executable, str(WORKLOAD), "table"] + files[:3])
    assert relaxed.returncode == 0 and "VERDICT: PASS" in relaxed.stdout
    strict = run([sys.executable, str(WORKLOAD), "table", "--strict", files[0], files[1],
                  write_result(tmp_path, "sdalloc-vmm", 2600, 2000, 50.0)])
    assert strict.returncode == 1
    # sdalloc's default is held to 1.02 x expandable's time, the other modes to 1.05.
    timed = run([sys.executable, str(WORKLOAD), "table", files[1],
                 write_result(tmp_path, "sdalloc-vmm", 2400, 2000, 52.0),
                 write_result(tmp_path, "sdalloc-pool", 2400, 2000, 52.0)])
    assert "MISS  sdalloc-vmm: time at 64x64 1.040 x expandable's (bar: <= 1.02)" in timed.stdout
    assert "PASS  sdalloc-pool: time at 64x64 1.040 x expandable's (bar: <= 1.05)" in timed.stdout


def test_problems_stages_and_contract_checks_fail_the_verdict(tmp_path):
    good = write_result(tmp_path, "native", 100, 50, 5.0)
    planned = tmp_path / "sdalloc-planned.json"
    data = json.loads(Path(write_result(tmp_path, "sdalloc-planned", 90, 50, 5.0)).read_text())
    data["problems"] = ["2 divergent steps (want 0)"]
    planned.write_text(json.dumps(data))
    stages = tmp_path / "stages.tsv"
    stages.write_text("preflight\tok\t3\t\ncuda-tests\tFAILED\t4\tskipped CUDA tests\n")
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps({"checks": [
        {"check": "oom", "status": "ok", "detail": "RuntimeError: CUDA out of memory"},
        {"check": "record_stream", "status": "FAILED", "detail": "reused"}]}))
    json_path = tmp_path / "all.json"
    result = run([sys.executable, str(WORKLOAD), "table", good, str(planned), "--stages",
                  str(stages), "--contract", str(contract), "--json", str(json_path)])
    assert result.returncode == 1
    assert "FAILED: 2 divergent steps (want 0)" in result.stdout
    assert "FAILED stages: cuda-tests" in result.stderr
    assert "FAILED contract checks: record_stream" in result.stderr
    written = json.loads(json_path.read_text())
    assert written["verdict"] == "FAIL" and len(written["contract"]) == 2
    assert [s["stage"] for s in written["stages"]] == ["preflight", "cuda-tests"]


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
    assert "VERDICT: FAIL" in result.stdout
    assert "FAILED: no result:" in result.stdout
    assert "gpu_workload: FAILED runs: sdalloc-pool, async" in result.stderr


def test_workload_refuses_bad_arguments(tmp_path):
    result = run([sys.executable, str(WORKLOAD), "run", "--config", "nope", "--out",
                  str(tmp_path / "x.json")])
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr
    result = run([sys.executable, str(WORKLOAD), "run", "--config", "native", "--out",
                  str(tmp_path / "x.json"), "--iterations", "0"])
    assert result.returncode == 2 and "--iterations must be >= 1" in result.stderr


def test_cpu_smoke_runs_the_contract_and_the_workload_end_to_end(torch, tmp_path):  # pylint: disable=unused-argument
    out = tmp_path / "smoke"
    result = run([str(CHECK), "--cpu-smoke", "--configs", "native,sdalloc-pool,sdalloc-planned",
                  "--out", str(out)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log"]
    assert "gpu_contract: oom            ok" in result.stdout
    assert "gpu-check: VERDICT: PASS" in result.stdout
    # Rows are printed as runs finish, before the results section.
    rows_at = result.stdout.index("sdalloc-pool ")
    assert rows_at < result.stdout.index("==== gpu-check: results")
    data = json.loads((out / "gpu-check.json").read_text())
    assert data["verdict"] == "PASS"
    assert [c["check"] for c in data["contract"]] == ["oom", "record_stream", "empty_cache",
                                                      "graph"]
    assert [r["config"] for r in data["results"]] == ["native", "sdalloc-pool",
                                                      "sdalloc-planned"]
    planned = data["results"][2]
    assert "mode:planned" in planned["sdalloc_conf"]
    assert planned["step_stats"]["divergent_steps"] == 0
    for r in data["results"]:
        assert r["cpu_smoke"] is True and r["time_per_iteration_s"] > 0
        assert r["parameters"] > 0 and r["shapes"] == [[2, 4, 8, 8], [2, 4, 16, 16]]
        assert [s["iterations"] for s in r["per_shape"]] == [1, 1]
        assert r["peak_reserved_bytes"] is None  # no device memory on the CPU
    assert "==== run:native" in (out / "gpu-check.log").read_text()
    # The pipeline: a row per configuration as it finishes, the table and its checks at the
    # end; on the CPU every call completes and every output equals native's.
    assert result.stdout.index("sdalloc-planned ", result.stdout.index("largest px")) < \
        result.stdout.index("==== gpu-check: results")
    assert [r["config"] for r in data["pipeline"]] == ["native", "sdalloc-pool",
                                                       "sdalloc-planned"]
    for r in data["pipeline"]:
        assert r["cpu_smoke"] is True and r["problems"] == [] and r["sequence_ooms"] == 0
        assert [(c["role"], c["size"]) for c in r["calls"][:6]] == [
            ("warm-up", 64), ("sequence", 64), ("sequence", 96), ("sequence", 80),
            ("sequence", 128), ("sequence", 64)]
        assert all(c["role"] == "probe" for c in r["calls"][6:]) and len(r["calls"]) > 6
        assert 128 <= r["largest"]["px"] < 160  # the sequence's largest, up to the bound
        assert r["peak_reserved_bytes"] is None and r["calls_per_repeat_call"] is None
    assert ("PASS  sdalloc-planned: pipeline output equals native's in 6 of 6 calls (6 "
            "bit-identical") in result.stdout
    # The offload rows: a reference and the two budgets, each beside its floor, the bars
    # shown but not judged here.
    offload = data["offload"]
    assert [s["setting"] for s in offload["settings"]] == ["all on CPU", "offload 50 %",
                                                          "offload 25 %"]
    assert offload["bandwidth_bytes_per_second"] > 0
    weights = offload["weight_bytes"]
    reference = offload["settings"][0]["median_s"]
    for s, fraction in zip(offload["settings"][1:], (0.5, 0.25)):
        assert s["budget_bytes"] == int(fraction * weights) and s["problems"] == []
        assert 0 < s["stats"]["region_bytes"] <= s["budget_bytes"]
        assert s["stats"]["planned"] and s["divergent_in_timed_steps"] == 0
        assert s["ref_s"] == reference and s["floor_s"] == max(reference, s["copy_s"])
        assert s["copy_s"] == s["stats"]["streamed_bytes"] / offload["bandwidth_bytes_per_second"]
        assert "predicted step" in s["plan"]
    assert "offload 50 %" in result.stdout and "offload 25 %" in result.stdout
    assert "x max(T, X/BW) (<= 1.1) (judged on a GPU only)" in result.stdout
    assert "floor = max(T, X/BW)" in result.stdout


def _offload_result(directory, reference_ms, offloaded_ms, problems=(), diffusers=None):
    """A GPU offload result: all on GPU at 64 and 96 (T), both budgets at both latents with
    X / BW 20 ms (50 %) and 30 ms (25 %); offloaded_ms[(latent, fraction)] the step times."""
    path = directory / "offload.json"
    fingerprint = {"sum": 1.0, "abs_sum": 10.0, "first": []}
    settings = []
    for latent in (64, 96):
        settings.append({"setting": "all on GPU", "latent": latent, "budget_bytes": None,
                         "median_s": reference_ms[latent] / 1e3,
                         "device_used_bytes": 2000 * MiB, "output_fingerprint": fingerprint,
                         "problems": []})
    for fraction, copy_ms in ((0.5, 20.0), (0.25, 30.0)):
        for latent in (64, 96):
            t = reference_ms[latent] / 1e3
            settings.append({
                "setting": f"offload {fraction * 100:g} %", "latent": latent,
                "budget_fraction": fraction, "budget_bytes": int(fraction * 1600 * MiB),
                "median_s": offloaded_ms[(latent, fraction)] / 1e3, "ref_s": t,
                "copy_s": copy_ms / 1e3, "floor_s": max(t, copy_ms / 1e3),
                "ideal_s": max(t, copy_ms / 1e3 * 0.9), "predicted_s": 0.05,
                "copies_per_step": 90.0, "device_used_bytes": 900 * MiB,
                "host_ram_bytes": 1650 * MiB, "output_fingerprint": fingerprint,
                "problems": list(problems) if (latent, fraction) == (64, 0.5) else []})
    if diffusers:
        settings.append(diffusers)
    path.write_text(json.dumps({"cpu_smoke": False, "dtype": "float16",
                                "weight_bytes": 1600 * MiB, "latents": [64, 96],
                                "bandwidth_bytes_per_second": 55e9,
                                "settings": settings, "problems": []}))
    return str(path)


_AT_FLOOR = {(64, 0.5): 21.0, (96, 0.5): 66.0, (64, 0.25): 31.5, (96, 0.25): 68.0}


def test_offload_rows_beside_their_floors_and_the_bars(tmp_path):
    native = write_result(tmp_path, "native", 100, 50, 5.0)
    passing = _offload_result(tmp_path, {64: 15.0, 96: 65.0}, _AT_FLOOR, diffusers={
        "setting": "diffusers group offload", "skipped": "not installed (No module ...)"})
    result = run([sys.executable, str(WORKLOAD), "table", native, "--offload", passing])
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    # setting, latent, budget, ms/step, x ref, T, X/BW, floor, x floor, ideal, plan, copies,
    # device, host, status
    assert ["all", "on", "GPU", "64", "-", "15.00", "1.000", "15.00", "-", "-", "-", "-", "-",
            "-", "2000.0", "-", "ok"] in rows
    assert ["offload", "50", "%", "64", "800.0", "21.00", "1.400", "15.00", "20.00", "20.00",
            "1.050", "18.00", "50.00", "90", "900.0", "1650.0", "ok"] in rows
    assert ["offload", "25", "%", "96", "400.0", "68.00", "1.046", "65.00", "30.00", "65.00",
            "1.046", "65.00", "50.00", "90", "900.0", "1650.0", "ok"] in rows
    assert "diffusers group offload   not installed" in result.stdout
    for line in ("PASS  offload: offload 50 % at 64x64: 1.050 x max(T, X/BW) (<= 1.1)",
                 "PASS  offload: offload 50 % at 96x96: 1.015 x all-on-GPU (<= 1.15)",
                 "PASS  offload: offload 25 % at 96x96: 1.046 x max(T, X/BW) (<= 1.1)"):
        assert line in result.stdout
    assert "5 of 5 bars met" in format_offload_bar(passing)
    slow = _offload_result(tmp_path, {64: 15.0, 96: 65.0},
                           {**_AT_FLOOR, (64, 0.25): 36.0, (96, 0.5): 76.0})
    result = run([sys.executable, str(WORKLOAD), "table", native, "--offload", slow])
    for line in ("FAIL  offload: offload 50 % at 96x96: 1.169 x max(T, X/BW) (<= 1.1)",
                 "FAIL  offload: offload 50 % at 96x96: 1.169 x all-on-GPU (<= 1.15)",
                 "FAIL  offload: offload 25 % at 64x64: 1.200 x max(T, X/BW) (<= 1.1)",
                 "PASS  offload: offload 25 % at 96x96: 1.046 x max(T, X/BW) (<= 1.1)"):
        assert line in result.stdout
    assert "2 of 5 bars met; missed: " in format_offload_bar(slow)
    assert result.returncode == 0  # a missed bar fails the verdict only under --strict
    strict = run([sys.executable, str(WORKLOAD), "table", "--strict", native, "--offload", slow])
    assert strict.returncode == 1 and "VERDICT: FAIL (1 bars missed)" in strict.stdout
    wrong = _offload_result(tmp_path, {64: 15.0, 96: 65.0}, _AT_FLOOR,
                            ["output differs from all-on-GPU's"])
    result = run([sys.executable, str(WORKLOAD), "table", native, "--offload", wrong])
    assert result.returncode == 1
    assert "FAILED: output differs from all-on-GPU's" in result.stdout
    assert "FAILED offload: offload 50 % at 64: output differs" in result.stderr
    missing = run([sys.executable, str(WORKLOAD), "table", native, "--offload",
                   str(tmp_path / "none.json")])
    assert missing.returncode == 1 and "offload: FAILED: no result:" in missing.stdout


def format_offload_bar(path):
    """gpu_offload.offload_bar's line for a result file (what gpu_workload.py's table counts
    as one bar), in this process."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_offload  # pylint: disable=import-outside-toplevel,import-error
    return gpu_offload.offload_bar(gpu_offload.load_offload(path))[1]


def test_offload_refuses_bad_arguments(tmp_path):
    result = run([sys.executable, str(WORKLOAD), "offload", "--out", str(tmp_path / "o.json"),
                  "--warmup", "1"])
    assert result.returncode == 2 and "--warmup >= 2" in result.stderr
    result = run([sys.executable, str(WORKLOAD), "offload", "--out", str(tmp_path / "o.json"),
                  "--iterations", "0"])
    assert result.returncode == 2 and "--iterations must be >= 1" in result.stderr


def test_the_deadline_cuts_runs_short_and_the_table_still_prints(torch, tmp_path):  # pylint: disable=unused-argument
    # 13 s: 8 are kept for the table, and a stage needs 5 s of what is left, so the first
    # stage may run and every stage that starts a second or more later is cut. The smoke's
    # stages take about 4 s together on an idle machine, so the cut does not depend on the
    # machine's speed (16 s, as before, let all of them run on a quiet machine).
    out = tmp_path / "late"
    result = run([str(CHECK), "--cpu-smoke", "--deadline", "13", "--configs",
                  "native,sdalloc-pool,sdalloc-vmm", "--out", str(out)])
    assert result.returncode == 1
    assert "not run: the overall deadline (13 s) is reached" in result.stdout
    assert "gpu-check: VERDICT: FAIL" in result.stdout
    data = json.loads((out / "gpu-check.json").read_text())
    assert any(s["status"] == "FAILED" for s in data["stages"])
