"""Tests of tests/peers/run_peers.py and its helpers (scripts/test-all.sh, stage `peers`,
runs them before the slice): the parsers, the comparisons, and that a difference planted
under the drop-in, a crash, a changed ONNX output and a broken driver are each caught.

The tests that run the release build's binaries skip when they are not built, and fail
instead under CI=1."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_cpython  # noqa: E402
import peers_onnx  # noqa: E402
import run_peers  # noqa: E402

BUILD = pathlib.Path(os.environ.get("SDALLOC_BUILD_DIR", HERE.parents[1] / "build" / "release"))
PRELOAD = BUILD / "src" / "preload" / "libsdalloc_preload.so"
CENSUS = BUILD / "tests" / "peers" / "libsdalloc_peers_census.so"
DRIVER = BUILD / "tests" / "peers" / "sdalloc_peers_onnx"


def need(*paths):
    for path in paths:
        if not path.exists():
            if os.environ.get("CI"):
                pytest.fail(f"{path} is not built")
            pytest.skip(f"{path} is not built")


# --- CPython: parsing and comparing ---------------------------------------------------------

def test_progress_lines_give_each_modules_outcome():
    log = "\n".join([
        "0:00:01 load avg: 1.2 [ 1/6] test_a passed",
        "0:00:02 load avg: 1.2 [ 2/6/1] test_b failed (2 errors, 1 failure) -- running: test_c",
        "0:00:03 load avg: 1.2 [ 3/6/2] test_c failed (env changed) (31.0 sec)",
        "0:00:04 load avg: 1.2 [ 4/6/2] test_d skipped (resource denied)",
        "0:00:05 load avg: 1.2 [ 5/6/3] test_e crashed (Exit code -11)",
        "0:00:06 load avg: 1.2 [ 6/6/3] test_f passed (1 min 2 sec) -- running: test_e (30 sec)",
        "some output [1/2] that is not a progress line",
    ])
    assert peers_cpython.parse_progress(log) == {
        "test_a": "passed", "test_b": "failed", "test_c": "env changed",
        "test_d": "resource denied", "test_e": "crashed", "test_f": "passed"}


def test_junit_file_gives_each_cases_outcome(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase name="test.test_a.T.test_ok" />'
        '<testcase name="test.test_a.T.test_fail"><failure>x</failure></testcase>'
        '<testcase name="test.test_a.T.test_error"><error>x</error></testcase>'
        '<testcase name="test.test_a.T.test_skip"><skipped>why</skipped></testcase>'
        '<testcase name="test.test_a.T.test_xfail"><output>x</output></testcase>'
        '<testcase name="test.test_a.T.test_xpass"><outcome>UNEXPECTED_SUCCESS</outcome>'
        '</testcase><testcase />'
        '</testsuite></testsuites>')
    assert peers_cpython.parse_junit(xml) == {
        "test.test_a.T.test_ok": "pass", "test.test_a.T.test_fail": "failure",
        "test.test_a.T.test_error": "error", "test.test_a.T.test_skip": "skipped",
        "test.test_a.T.test_xfail": "expected failure",
        "test.test_a.T.test_xpass": "unexpected success",
        "test_a.<unnamed 1>": "failure"}
    assert peers_cpython.parse_junit(tmp_path / "absent.xml") == {}


def test_compare_lists_module_and_case_differences_per_module():
    run = lambda modules, cases: peers_cpython.SuiteRun("x", modules, cases, 1.0, None)
    base = run({"test_a": "passed", "test_b": "passed"},
               {"test.test_a.T.t1": "pass", "test.test_a.T.t2": "pass",
                "test.test_b.T.t1": "pass"})
    same = run(dict(base.modules), dict(base.cases))
    assert peers_cpython.compare(base, same) == []
    other = run({"test_a": "failed", "test_b": "passed"},
                {"test.test_a.T.t1": "failure", "test.test_b.T.t1": "pass"})
    diffs = peers_cpython.compare(base, other)
    assert [d.module for d in diffs] == ["test_a"]
    assert "module passed -> failed" in diffs[0].detail
    assert "test.test_a.T.t1: pass -> failure" in diffs[0].detail
    assert "test.test_a.T.t2: pass -> absent" in diffs[0].detail
    crashed = run({"test_a": "crashed", "test_b": "passed"}, {"test.test_b.T.t1": "pass"})
    assert peers_cpython.is_crash(peers_cpython.compare(base, crashed)[0], base, crashed)
    assert not peers_cpython.is_crash(diffs[0], base, other)


# --- CPython: the runner end to end on the probe module ---------------------------------------

def run_probe(tmp_path, monkeypatch, capsys, probe):
    need(PRELOAD, CENSUS)
    monkeypatch.setenv("RUN_PEERS_PROBE", probe)
    rc = run_peers.main(["--suites", "cpython", "--tests", "test_peers_probe", "--testdir",
                         str(HERE / "selftest"), "--modes", "pool", "--no-share", "--build",
                         str(BUILD), "--work", str(tmp_path)])
    return rc, capsys.readouterr().out


def test_runner_passes_when_the_drop_in_changes_nothing(tmp_path, monkeypatch, capsys):
    rc, out = run_probe(tmp_path, monkeypatch, capsys, "")
    assert rc == 0, out
    assert "0 differences that count" in out


def test_runner_fails_on_a_difference_that_comes_back(tmp_path, monkeypatch, capsys):
    rc, out = run_probe(tmp_path, monkeypatch, capsys, "fail")
    assert rc == 1, out
    assert ("DIFFERENCE: cpython pool@4KiB: test_peers_probe [confirmed]: module passed -> "
            "failed; test_peers_probe.PeersProbe.test_differs: pass -> failure") in out


def test_runner_fails_on_a_crash_under_the_drop_in(tmp_path, monkeypatch, capsys):
    rc, out = run_probe(tmp_path, monkeypatch, capsys, "crash")
    assert rc == 1, out
    assert "DIFFERENCE: cpython pool@4KiB: test_peers_probe [crash]: module passed -> crashed" \
        in out


def test_census_counts_the_pools_bytes_and_the_systems(tmp_path):
    need(PRELOAD, CENSUS)
    program = "import os; a = bytearray(1 << 20); b = [bytes(100) for _ in range(1000)]"
    for with_drop_in in (True, False):
        folder = tmp_path / str(with_drop_in)
        folder.mkdir()
        env = peers_cpython.preload_env(PRELOAD, "mode:vmm,threshold:4KiB",
                                        extra_preload=[CENSUS])
        if not with_drop_in:
            env["LD_PRELOAD"] = str(CENSUS)
        env["SDALLOC_CENSUS_DIR"] = str(folder)
        subprocess.run([peers_cpython.PYTHON, "-c", program], env=env, check=True)
        (census,) = [json.loads(f.read_text()) for f in folder.glob("census.*.json")]
        assert census["drop_in"] is with_drop_in
        assert census["system_requests"] > 0
        if with_drop_in:
            assert census["pool_bytes"] >= 1 << 20
        else:
            assert census["pool_bytes"] == 0 and census["system_bytes"] >= 1 << 20


# --- ONNX ----------------------------------------------------------------------------------------

def test_value_files_round_trip_every_kind():
    import struct
    tensors = [(1, np.arange(6, dtype=np.float32).reshape(2, 3)), (7, np.array([-1, 2**40])),
               (9, np.array([True, False])), (10, np.array([1.5], dtype=np.float16)),
               (16, np.array([1.0, -2.5], dtype=np.float32)),  # bfloat16, exact in 8 bits
               (8, np.array([b"ab", b""], dtype=object)), (11, np.zeros((0, 4)))]
    for elem_type, array in tensors:
        kind, [(got_type, got)] = peers_onnx.decode_value(peers_onnx.encode_value(
            "T", [(elem_type, array)]))
        assert kind == "T" and got_type == elem_type and got.shape == array.shape
        assert (got == array).all()
    kind, got = peers_onnx.decode_value(peers_onnx.encode_value("S", tensors[:2]))
    assert kind == "S" and len(got) == 2
    assert peers_onnx.decode_value(peers_onnx.encode_value("N", [])) == ("N", [])
    with pytest.raises(ValueError):
        peers_onnx.decode_value(b"SDPV" + struct.pack("<I", 2) + b"N")
    with pytest.raises(ValueError):
        peers_onnx.decode_value(peers_onnx.encode_value("N", []) + b"x")


def test_expected_outputs_are_checked_with_onnx_tolerance():
    want = [("T", [(1, np.array([1.0, 2.0], dtype=np.float32))])]
    near = [("T", [(1, np.array([1.0005, 2.0], dtype=np.float32))])]
    far = [("T", [(1, np.array([1.01, 2.0], dtype=np.float32))])]
    assert peers_onnx.matches_expected(near, want) is None
    assert "output 0" in peers_onnx.matches_expected(far, want)
    assert "element type" in peers_onnx.matches_expected([("T", [(11, want[0][1][0][1])])], want)
    strings = [("T", [(8, np.array(["a"], dtype=object))])]
    assert peers_onnx.matches_expected([("T", [(8, np.array([b"a"], dtype=object))])],
                                       strings) is None


ONNX_CASES = ("test_add", "test_sequence_insert_at_back", "test_cast_FLOAT_to_STRING",
              "test_optional_get_element", "test_conv_with_strides_padding")


def test_node_tests_run_equal_in_every_mode_and_a_changed_output_is_caught(tmp_path):
    need(DRIVER)
    result = peers_onnx.run_onnx_suite(DRIVER, tmp_path, only=lambda n: n in ONNX_CASES,
                                       log=lambda _: None)
    names = sorted(c.name for c in result.passing)
    assert result.prepared == len(ONNX_CASES)
    assert "test_cast_FLOAT_to_STRING" in result.ort_fails  # ORT prints floats its own way
    assert names == sorted(set(ONNX_CASES) - {"test_cast_FLOAT_to_STRING"})
    for mode in peers_onnx.SDALLOC_MODES:
        assert result.differences[mode] == [], mode
        assert result.allocs[mode] > 0, mode
    # One byte of one mode's output changed: that case, and only it, differs.
    case = next(c for c in result.passing if c.name == "test_add")
    out = peers_onnx.output_files(tmp_path, "vmm", case)[0]
    data = bytearray(out.read_bytes())
    data[-1] ^= 1
    out.write_bytes(bytes(data))
    ok = {c.name: {"status": "ok"} for c in result.passing}
    assert peers_onnx.compare_mode(tmp_path, "vmm", result.passing, ok) == [
        ("test_add", "output 0 (sum) differs from ORT's")]


def driver(*args, **kwargs):
    return subprocess.run([str(DRIVER), *args], capture_output=True, text=True, **kwargs)


def test_driver_names_a_malformed_input_file(tmp_path):
    need(DRIVER)
    model = peers_onnx.DATA_ROOT / "node" / "test_add" / "model.onnx"
    good = peers_onnx.encode_value("T", [(1, np.ones((3, 4, 5), dtype=np.float32))])
    (tmp_path / "x.val").write_bytes(good)
    (tmp_path / "y.val").write_bytes(good[:-7])
    (tmp_path / "cases.txt").write_text(f"case\tadd\t{model}\nin\tx\t{tmp_path}/x.val\n"
                                        f"in\ty\t{tmp_path}/y.val\nout\tsum\n")
    for mode in ("ort", "pool", "planned"):
        p = driver("--mode", mode, "--cases", str(tmp_path / "cases.txt"), "--out",
                   str(tmp_path / mode))
        assert p.returncode == 0, p.stderr
        line = json.loads(p.stdout)
        assert line["status"] == "driver_error"
        assert f"{tmp_path}/y.val: truncated" in line["message"]


def test_driver_refuses_bad_arguments_and_cases_files(tmp_path):
    need(DRIVER)
    assert driver("--mode", "pool").returncode == 2
    (tmp_path / "c.txt").write_text("case\tonly-two-fields\n")
    p = driver("--mode", "huge", "--cases", str(tmp_path / "c.txt"), "--out", str(tmp_path))
    assert p.returncode == 1 and "bad line" in p.stderr
    (tmp_path / "c.txt").write_text("")
    p = driver("--mode", "huge", "--cases", str(tmp_path / "c.txt"), "--out", str(tmp_path))
    assert p.returncode == 2 and "unknown mode huge" in p.stderr


def test_a_case_that_kills_the_driver_is_reported_and_the_rest_run(tmp_path):
    fake = tmp_path / "fake_driver.py"
    fake.write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        "cases = [l.split('\\t')[1] for l in open(sys.argv[4]) if l.startswith('case')]\n"
        "for c in cases:\n"
        "    if c == 'dies':\n"
        "        sys.stdout.flush(); os.abort()\n"
        "    print(json.dumps({'case': c, 'status': 'ok', 'message': '', 'seconds': 0,"
        " 'allocs': 1}), flush=True)\n")
    fake.chmod(0o755)
    cases = [peers_onnx.Case(n, pathlib.Path("m"), [], [], []) for n in ("a", "dies", "b")]
    results, _ = peers_onnx.run_driver(f"{fake}", "pool", cases, tmp_path, log=lambda _: None)
    assert {n: r["status"] for n, r in results.items()} == {
        "a": "ok", "dies": "crashed", "b": "ok"}


# --- the GPU stage's selection (runs anywhere; the tests themselves need CUDA) -------------------

def test_gpu_stage_selects_memory_tests_and_lists_each_exclusion_with_its_limit():
    import torch_cuda_alloc_tests as gpu
    source = (
        "class TestCuda:\n"
        "    def test_memory_allocation(self): pass\n"
        "    def test_record_stream(self): pass\n"
        "    def test_out_of_memory_retry(self): pass\n"
        "    def test_graph_memory_stats(self): pass\n"
        "    def test_memory_snapshot(self): pass\n"
        "    def test_memory_stats(self): pass\n"
        "    def test_streams(self): pass\n"
        "    def helper_alloc(self): pass\n"
        "class TestOther:\n"
        "    def test_memory_elsewhere(self): pass\n")
    selected, excluded = gpu.select(source)
    assert selected == [("TestCuda", "test_memory_allocation"), ("TestCuda", "test_record_stream")]
    reasons = dict(excluded)
    assert set(reasons) == {"TestCuda.test_out_of_memory_retry", "TestCuda.test_graph_memory_stats",
                            "TestCuda.test_memory_snapshot", "TestCuda.test_memory_stats"}
    assert "CUDA graphs" in reasons["TestCuda.test_graph_memory_stats"]
    assert "OOM message" in reasons["TestCuda.test_out_of_memory_retry"]


def test_gpu_stage_says_it_ran_nothing_without_cuda(tmp_path):
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    if probe.stdout.strip() == "True":
        pytest.skip("this machine has CUDA")
    p = subprocess.run([sys.executable, str(HERE / "torch_cuda_alloc_tests.py")],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "built-in set" in p.stdout and "nothing ran" in p.stdout
    listed = subprocess.run([sys.executable, str(HERE / "torch_cuda_alloc_tests.py"), "--list"],
                            capture_output=True, text=True)
    assert listed.returncode == 0 and "check_record_stream" in listed.stdout
