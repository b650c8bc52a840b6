#!/usr/bin/env python3
"""torch_cuda_alloc_tests.py - PyTorch's own CUDA allocator tests against sdalloc.torch.install()
(the GPU part of docs/peers.md; a stage `peers` for scripts/gpu-check.sh).

  torch_cuda_alloc_tests.py [--modes pool,vmm] [--test-file PATH] [--out FILE.json]
                            [--timeout S] [--list]

Where the tests come from: PyTorch's test/test_cuda.py for the torch on the machine, found at
--test-file, $PYTORCH_TEST_DIR/test_cuda.py, next to the torch package (a source checkout:
<checkout>/test/test_cuda.py), or under /opt/pytorch, /workspace/pytorch, ~/pytorch. Wheels
do not ship it; without it, BUILTIN below runs instead (the same checks written here: the
verdict table says which set ran).

Which tests: the methods of test_cuda.py's allocator-facing classes (TestCuda,
TestCudaMallocAsync) whose names say memory (memory, alloc, oom, out_of_memory,
record_stream, empty_cache, mem_get_info, fraction), read from the file with ast; of those,
the ones that test what a pluggable allocator cannot provide are excluded and listed with the
limit from docs/pytorch.md (EXCLUDED). Each selected test runs in a fresh process per
configuration: `native` (PyTorch's caching allocator) and each sdalloc mode
(sdalloc.torch.install(mode=M) before CUDA starts). Verdict: every selected test that passes
on native must pass on each mode; a test native fails or skips does not count.

Output: one table (test, then native's and each mode's outcome), the excluded tests with
their reasons, the verdict line; --out writes it all as JSON. Exit 0 when the verdict holds,
1 when a test fails under sdalloc, 2 when this machine has no CUDA (nothing ran).
--list prints the selection and the exclusions and runs nothing (works without CUDA).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
CLASSES = ("TestCuda", "TestCudaMallocAsync")
MEMORY = re.compile(r"memory|alloc|oom|out_of_memory|record_stream|empty_cache|mem_get_info|"
                    r"fraction")
# (pattern on the test's name, the limit it meets: docs/pytorch.md). First match wins.
EXCLUDED = (
    (r"graph", "CUDA graphs: install() refuses allocations during a capture (use mempool())"),
    (r"snapshot|history|memory_viz|memory_plot|profil|trace|cycles|context",
     "memory history and snapshots: CUDAPluggableAllocator records none; sdalloc.snapshot() "
     "has its own layout"),
    (r"expandable|max_split|garbage_coll|allocator_settings|roundup|set_allocator|"
     r"release_lock|cudamallocasync|alloc_conf",
     "PyTorch's caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF), which a pluggable "
     "allocator does not read"),
    (r"pinned|host|cudaregister", "pinned host memory: PyTorch's host allocator, not the "
     "CUDA allocator install() replaces"),
    (r"ipc|multigpu|multi_gpu|peer|p2p|sharing", "IPC handles and other devices' memory"),
    (r"mempool|mem_pool|use_mem_pool", "torch.cuda.MemPool is the other integration "
     "(sdalloc.torch.mempool()), not install()"),
    (r"out_of_memory|oom", "PyTorch's OOM message text ('Tried to allocate X GiB. GPU N has a "
     "total capacity of ...'); sdalloc raises RuntimeError 'CUDA out of memory (sdalloc): ...' "
     "with its own figures"),
    (r"accumulated|memory_stats$", "reset_accumulated_memory_stats and the allocated/freed "
     "counters: CUDAPluggableAllocator has no getDeviceStats; install() provides "
     "memory_stats' current and peak figures only"),
)

# The same kind of checks written here, for machines without PyTorch's test files: each a
# function run in a fresh process on native and on each mode (no PyTorch code copied).
BUILTIN = """
import gc, torch

def check_alloc_compute_free():
    for n in (1, 255, 4096, 1 << 20, 3 << 22, 1 << 26):
        a = torch.arange(n, device="cuda", dtype=torch.float32)
        assert float(a.sum()) == float(torch.arange(n, dtype=torch.float64).sum())
        del a

def check_memory_allocated_follows_tensors():
    gc.collect()
    before = torch.cuda.memory_allocated()
    t = torch.empty(1 << 20, device="cuda", dtype=torch.uint8)
    assert torch.cuda.memory_allocated() >= before + (1 << 20)
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
    del t
    assert torch.cuda.memory_allocated() == before

def check_caching_allocator_alloc_delete():
    before = torch.cuda.memory_allocated()
    p = torch.cuda.caching_allocator_alloc(1 << 16)
    assert torch.cuda.memory_allocated() > before
    torch.cuda.caching_allocator_delete(p)
    assert torch.cuda.memory_allocated() == before

def check_huge_request_raises_and_device_still_works():
    t = torch.ones(1024, device="cuda")
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except RuntimeError as e:
        assert "out of memory" in str(e).lower(), e
    else:
        raise AssertionError("a 1 PiB tensor was allocated")
    t.add_(1)
    assert bool((t == 2).all())

def check_record_stream_keeps_block_until_side_stream_is_done():
    side = torch.cuda.Stream()
    x = torch.empty(1 << 20, device="cuda", dtype=torch.uint8)
    ptr = x.data_ptr()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.fill_(7)
    x.record_stream(side)
    del x
    y = torch.empty(1 << 20, device="cuda", dtype=torch.uint8)
    assert y.data_ptr() != ptr or side.query(), "reused before the side stream finished"
    side.synchronize()

def check_empty_cache_gives_memory_back():
    x = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    del x
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    assert free_after >= free_before

def check_reset_peak_memory_stats():
    x = torch.empty(32 << 20, device="cuda", dtype=torch.uint8)
    del x
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()

def check_per_process_memory_fraction_caps_allocations():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")
    except RuntimeError as e:
        assert "out of memory" in str(e).lower(), e
    else:
        raise AssertionError("an allocation above the fraction succeeded")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)

def check_many_streams_and_non_blocking_copies():
    host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    streams = [torch.cuda.Stream() for _ in range(4)]
    outs = []
    for s in streams:
        with torch.cuda.stream(s):
            outs.append(host.to("cuda", non_blocking=True) * 2)
    torch.cuda.synchronize()
    for o in outs:
        assert bool((o.cpu() == host * 2).all())
"""


def find_test_file(given):
    candidates = [given] if given else []
    if os.environ.get("PYTORCH_TEST_DIR"):
        candidates.append(pathlib.Path(os.environ["PYTORCH_TEST_DIR"]) / "test_cuda.py")
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            candidates.append(pathlib.Path(spec.origin).parents[1] / "test" / "test_cuda.py")
    except (ImportError, ValueError):
        pass
    for root in ("/opt/pytorch", "/workspace/pytorch", "~/pytorch"):
        candidates.append(pathlib.Path(root).expanduser() / "test" / "test_cuda.py")
    for c in candidates:
        if c and pathlib.Path(c).is_file():
            return pathlib.Path(c)
    return None


def select(source: str):
    """([(class, method)] to run, [(class.method, reason)] excluded) from test_cuda.py's text."""
    selected, excluded = [], []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name not in CLASSES:
            continue
        for item in node.body:
            if not isinstance(item, ast.FunctionDef) or not item.name.startswith("test_"):
                continue
            if not MEMORY.search(item.name):
                continue
            reason = next((why for pattern, why in EXCLUDED
                           if re.search(pattern, item.name, re.I)), None)
            if reason:
                excluded.append((f"{node.name}.{item.name}", reason))
            else:
                selected.append((node.name, item.name))
    return selected, excluded


def child(args):
    """Runs the given tests in this process under one configuration; prints one JSON line."""
    if args.config != "native":
        sys.path.insert(0, str(HERE.parents[1] / "python"))
        import sdalloc.torch
        sdalloc.torch.install(mode=args.config)
    import torch
    outcomes = {}
    if args.test_file:
        import unittest
        sys.path.insert(0, str(pathlib.Path(args.test_file).parent))
        sys.argv = [sys.argv[0]]  # test_cuda's common_utils parses the command line
        import importlib.util
        spec = importlib.util.spec_from_file_location("test_cuda", args.test_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name in args.tests:
            cls, method = name.split(".")
            result = unittest.TestResult()
            unittest.TestSuite([getattr(module, cls)(method)]).run(result)
            if result.errors or result.failures:
                (_, text), = (result.errors + result.failures)[:1]
                outcomes[name] = "FAIL: " + text.strip().splitlines()[-1][:160]
            elif result.skipped:
                outcomes[name] = "skip: " + result.skipped[0][1][:80]
            else:
                outcomes[name] = "pass"
    else:
        scope = {}
        exec(compile(BUILTIN, "BUILTIN", "exec"), scope)  # noqa: S102 - our own text
        for name in args.tests:
            try:
                scope[name]()
                outcomes[name] = "pass"
            except Exception as e:  # pylint: disable=broad-except
                outcomes[name] = f"FAIL: {type(e).__name__}: {e}"[:160]
            torch.cuda.synchronize()
    print(json.dumps({"config": args.config, "torch": torch.__version__, "outcomes": outcomes}))


def run_config(config, tests, test_file, timeout):
    cmd = [sys.executable, __file__, "--child", config, "--tests", ",".join(tests)]
    if test_file:
        cmd += ["--test-file", str(test_file)]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {t: f"FAIL: the process ran past {timeout} s" for t in tests}, timeout
    seconds = time.monotonic() - start
    lines = [l for l in p.stdout.splitlines() if l.startswith("{\"config\"")]
    if p.returncode != 0 or not lines:
        why = (p.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {t: f"FAIL: process exit {p.returncode}: {why}" for t in tests}, seconds
    return json.loads(lines[-1])["outcomes"], seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="pool,vmm")
    p.add_argument("--test-file", type=pathlib.Path, default=None)
    p.add_argument("--out", type=pathlib.Path, default=None)
    p.add_argument("--timeout", type=int, default=120, help="seconds per configuration")
    p.add_argument("--list", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tests", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.config, args.tests = args.child, [t for t in args.tests.split(",") if t]
        return child(args)

    test_file = find_test_file(args.test_file)
    if test_file:
        selected, excluded = select(test_file.read_text())
        tests = [f"{c}.{m}" for c, m in selected]
        source = f"PyTorch's {test_file}"
    else:
        tests = re.findall(r"^def (check_\w+)", BUILTIN, re.M)
        excluded, source = [], "the built-in set (no test_cuda.py found)"
    print(f"torch_cuda_alloc_tests: {len(tests)} tests from {source}; {len(excluded)} excluded")
    if args.list:
        print("\n".join(tests))
        for name, why in excluded:
            print(f"excluded {name}: {why}")
        return 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        print("torch_cuda_alloc_tests: no CUDA here (torch.cuda.is_available() is not True): "
              "nothing ran")
        return 2

    configs = ["native"] + args.modes.split(",")
    results, seconds = {}, {}
    for config in configs:
        results[config], seconds[config] = run_config(config, tests, test_file, args.timeout)
    differences = [(t, m, results[m][t]) for t in tests for m in configs[1:]
                   if results["native"].get(t) == "pass" and results[m].get(t) != "pass"]
    width = max([len(t) for t in tests] + [4])
    print(f"{'test':<{width}}  " + "  ".join(f"{c:<10}" for c in configs))
    for t in tests:
        print(f"{t:<{width}}  " + "  ".join(f"{results[c].get(t, '?')[:10]:<10}"
                                           for c in configs))
    print("seconds " + ", ".join(f"{c} {seconds[c]:.1f}" for c in configs))
    for name, why in excluded:
        print(f"excluded {name}: {why}")
    for t, m, outcome in differences:
        print(f"DIFFERENCE {t} under {m}: {outcome}")
    counted = sum(1 for t in tests if results["native"].get(t) == "pass")
    verdict = "PASS" if not differences else "FAIL"
    print(f"VERDICT {verdict}: {counted} tests pass on native; {len(differences)} fail under "
          f"sdalloc ({', '.join(configs[1:])}); {len(excluded)} excluded")
    if args.out:
        args.out.write_text(json.dumps({"source": source, "configs": configs, "tests": tests,
                                        "results": results, "seconds": seconds,
                                        "excluded": excluded, "verdict": verdict,
                                        "differences": differences}, indent=1))
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
