"""Planned pools from Python: sdalloc.Pool(planned=True) and its steps (begin_step, end_step,
the step() context manager, step_stats, the "step_" figures of stats, snapshots of the arena),
and the PyTorch shim's mode:planned with sdalloc.torch.step() - each shim scenario in a fresh
interpreter (conftest.run_python), since the shim's configuration is fixed per process."""

import ctypes
import os
import pickle
import shutil
import subprocess

import pytest

import sdalloc
from sdalloc import _native
from conftest import run_python

MiB = 1 << 20
KiB = 1 << 10

STEP_FIELDS = ("has_plan", "in_step", "arena_bytes", "planned_events", "planned_allocations",
               "kept_allocations", "fallback_allocations", "recorded_allocations",
               "recorded_steps", "planned_steps", "divergent_steps", "replans",
               "arena_failures", "plans")


@pytest.fixture
def planned(libraries):  # pylint: disable=unused-argument
    p = sdalloc.Pool(planned=True)
    yield p
    p.close()


def run_step(pool, sizes=(MiB, 64 * KiB, 512 * KiB), stream=None):
    """One step: allocates `sizes` in order, frees the first after the second is allocated,
    then the rest; answers the addresses."""
    with pool.step(stream):
        addresses = [pool.malloc(sizes[0], stream), pool.malloc(sizes[1], stream)]
        pool.free(addresses[0], stream)
        for size in sizes[2:]:
            addresses.append(pool.malloc(size, stream))
        for address in addresses[1:]:
            pool.free(address, stream)
    return addresses


# --------------------------------------------------------------------------- the structs

def test_ctypes_structs_match_the_c_header(libraries, tmp_path):  # pylint: disable=unused-argument
    """Offsets and sizes of PoolConfig's new fields and StepStats, as a C compiler sees the
    header (the build tree of the library under test holds the generated version.hpp)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to read the header with")
    build = os.path.dirname(os.path.dirname(os.path.realpath(_native.find(_native.HOST_LIBRARY))))
    generated = os.path.join(build, "include")
    if not os.path.isfile(os.path.join(generated, "sdalloc", "version.hpp")):
        pytest.skip(f"no generated version.hpp under {generated}")
    repo_include = os.path.join(os.path.dirname(__file__), "..", "..", "include")
    checks = [("sdalloc_pool_config_t", _native.PoolConfig,
               ("replan_after_divergent_steps", "planned", "max_plans",
                "planner_max_search_nodes", "small_pool_limit", "small_granularity",
                "keep_spare_pages", "grow_arena", "cut_free_ends", "mode")),
              ("sdalloc_step_stats_t", _native.StepStats,
               ("struct_size",) + STEP_FIELDS)]
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "sdalloc/sdalloc.h"',
             "int main(void) {"]
    expected = []
    for c_name, struct, fields in checks:
        lines.append(f'  printf("%zu\\n", sizeof({c_name}));')
        expected.append(ctypes.sizeof(struct))
        for field in fields:
            lines.append(f'  printf("%zu\\n", offsetof({c_name}, {field}));')
            expected.append(getattr(struct, field).offset)
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "layout"
    subprocess.run([compiler, "-std=c11", "-I", repo_include, "-I", generated, str(source),
                    "-o", str(binary)], check=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    assert [int(v) for v in printed.split()] == expected
    assert [name for name, _ in _native.StepStats._fields_] == ["struct_size", *STEP_FIELDS]
    assert [name for name, _ in _native.PoolConfig._fields_][-10:] == [
        "replan_after_divergent_steps", "planned", "max_plans", "planner_max_search_nodes",
        "small_pool_limit", "small_granularity", "keep_spare_pages", "grow_arena",
        "cut_free_ends", "mode"]


# --------------------------------------------------------------------------- host pools

def test_a_repeated_step_is_recorded_once_and_then_served_from_the_plan(planned):
    assert planned.step_stats() == {**{name: 0 for name in STEP_FIELDS},
                                    "has_plan": False, "in_step": False}
    first = run_step(planned)
    after_recording = planned.step_stats()
    assert after_recording["recorded_steps"] == 1
    assert after_recording["recorded_allocations"] == 3
    assert after_recording["has_plan"] and not after_recording["in_step"]
    assert after_recording["planned_events"] == 6  # three allocations, three frees
    assert after_recording["arena_bytes"] >= MiB + 64 * KiB  # the peak: 1 MiB and 64 KiB
    second = run_step(planned)
    third = run_step(planned)
    s = planned.step_stats()
    assert s["recorded_steps"] == 1
    assert s["planned_steps"] == 2
    assert s["planned_allocations"] == 6  # every allocation of steps 2 and 3
    assert s["fallback_allocations"] == 0 and s["kept_allocations"] == 0
    assert s["divergent_steps"] == 0 and s["replans"] == 0 and s["arena_failures"] == 0
    assert second == third  # served by position: the same offsets every step
    assert all(a % 512 == 0 for a in second) and len(first) == 3
    # Buffers live at the same time get disjoint bytes: 1 MiB with 64 KiB, 64 KiB with
    # 512 KiB (the 512 KiB one may take the 1 MiB one's place, freed before it).
    one_mib, small, half_mib = second
    assert small + 64 * KiB <= one_mib or one_mib + MiB <= small
    assert small + 64 * KiB <= half_mib or half_mib + 512 * KiB <= small
    assert planned.stats()["live_allocations"] == 0


def test_a_changed_size_diverges_and_is_counted(planned):
    for _ in range(2):
        run_step(planned)
    base = planned.step_stats()
    run_step(planned, sizes=(MiB, 96 * KiB, 512 * KiB))  # the second request differs
    s = planned.step_stats()
    assert s["divergent_steps"] == base["divergent_steps"] + 1 == 1
    assert s["planned_allocations"] == base["planned_allocations"] + 1  # the first still fit
    assert s["fallback_allocations"] == base["fallback_allocations"] + 2
    assert s["has_plan"] and s["replans"] == 0 and s["plans"] == 1
    assert planned.stats()["live_allocations"] == 0
    run_step(planned)  # the recorded sequence again: planned, not divergent
    again = planned.step_stats()
    assert again["divergent_steps"] == 1
    assert again["planned_allocations"] == s["planned_allocations"] + 3


def test_divergent_steps_in_a_row_drop_the_plan_and_record_again(libraries):  # pylint: disable=unused-argument
    # One plan at most: a step of another kind diverges instead of being recorded beside it.
    pool = sdalloc.Pool(planned=True, replan_after_divergent_steps=2, max_plans=1)
    try:
        run_step(pool)
        for _ in range(2):
            run_step(pool, sizes=(3 * MiB, 4 * KiB, 8 * KiB))
        s = pool.step_stats()
        assert s["divergent_steps"] == 2 and s["replans"] == 1
        run_step(pool, sizes=(3 * MiB, 4 * KiB, 8 * KiB))  # recorded afresh
        run_step(pool, sizes=(3 * MiB, 4 * KiB, 8 * KiB))  # served from the new plan
        s = pool.step_stats()
        assert s["recorded_steps"] == 2 and s["divergent_steps"] == 2
        assert s["planned_steps"] == 3 and s["has_plan"]
    finally:
        pool.close()


def test_alternating_sequences_get_a_plan_each_in_one_arena(planned):
    """What a loop over two shapes does (scripts/gpu_workload.py alternates two latent
    shapes): each shape is recorded once, its first request picks its plan after that, and
    both plans place their buffers in the same arena, as large as the larger one needs."""
    shape_a, shape_b = (MiB, 64 * KiB, 512 * KiB), (2 * MiB, 128 * KiB, MiB)
    for i in range(8):
        run_step(planned, sizes=shape_a if i % 2 == 0 else shape_b)
    s = planned.step_stats()
    assert s["recorded_steps"] == 2 and s["planned_steps"] == 6 and s["plans"] == 2
    assert s["divergent_steps"] == 0 and s["replans"] == 0
    assert s["planned_allocations"] == 6 * 3 and s["fallback_allocations"] == 0
    assert 2 * MiB + 128 * KiB <= s["arena_bytes"] < 2 * MiB + 128 * KiB + MiB


def test_a_buffer_kept_into_the_next_step_does_not_make_steps_divergent(planned):
    """Like the latents of a denoising loop: each step allocates the next latent, keeps it
    past end_step, and frees the previous one in the next step."""
    latent = planned.malloc(256 * KiB)  # made before the loop, outside any step
    kept = []
    for _ in range(5):
        with planned.step():
            work = planned.malloc(2 * MiB)
            new_latent = planned.malloc(256 * KiB)
            scratch = planned.malloc(MiB)
            planned.free(work)
            planned.free(scratch)
            planned.free(latent)
            latent = new_latent
        kept.append(planned.step_stats()["kept_allocations"])
    s = planned.step_stats()
    assert s["recorded_steps"] == 1 and s["planned_steps"] == 4
    assert s["divergent_steps"] == 0
    assert kept == [0, 1, 2, 3, 4]  # one kept allocation per planned step
    assert s["planned_allocations"] == 4 * 2  # work and scratch of steps 2 to 5
    assert planned.stats()["live_allocations"] == 1
    planned.free(latent)
    assert planned.stats()["live_allocations"] == 0


def test_step_errors_name_the_problem_and_change_nothing(planned):
    planned.begin_step()
    with pytest.raises(sdalloc.SdallocError) as error:
        planned.begin_step()
    assert error.value.status == "INVALID_ARGUMENT"
    assert "sdalloc_pool_begin_step" in str(error.value)
    assert planned.step_stats()["in_step"]
    p = planned.malloc(4096)  # still usable inside the step
    planned.free(p)
    planned.end_step()
    with pytest.raises(sdalloc.SdallocError) as error:
        planned.end_step()  # no step in progress
    assert error.value.status == "INVALID_ARGUMENT"
    assert "sdalloc_pool_end_step" in str(error.value)
    s = planned.step_stats()
    assert not s["in_step"] and s["recorded_steps"] == 1
    with pytest.raises(sdalloc.SdallocError, match="replan_after_divergent_steps"):
        sdalloc.Pool(planned=True, replan_after_divergent_steps=0)


def test_steps_on_a_pool_that_is_not_planned_are_refused(libraries):  # pylint: disable=unused-argument
    pool = sdalloc.Pool()
    try:
        for call in (pool.step_stats, pool.begin_step, pool.end_step):
            with pytest.raises(sdalloc.SdallocError) as error:
                call()
            assert error.value.status == "INVALID_ARGUMENT", call
            assert "planned" in str(error.value), str(error.value)
        with pytest.raises(sdalloc.SdallocError):
            with pool.step():
                raise AssertionError("the body of a refused step ran")
        assert not pool.is_planned()
        s = pool.stats()  # a pool without steps has no step figures, and does not fail
        assert not any(key.startswith("step_") for key in s)
        assert s["live_allocations"] == 0
    finally:
        pool.close()


def test_an_exception_in_the_body_still_ends_the_step(planned):
    with pytest.raises(KeyError, match="from the body"):
        with planned.step():
            p = planned.malloc(MiB)
            planned.free(p)
            raise KeyError("from the body")
    s = planned.step_stats()
    assert not s["in_step"] and s["recorded_steps"] == 1
    with planned.step():  # a new step begins normally
        assert planned.step_stats()["in_step"]
    assert not planned.step_stats()["in_step"]


def test_an_exception_in_the_body_wins_over_a_failing_end(planned):
    with pytest.raises(ValueError, match="body") as error:
        with planned.step():
            planned.end_step()  # so the context manager's end fails
            raise ValueError("body")
    notes = getattr(error.value, "__notes__", [])
    if hasattr(error.value, "add_note"):
        assert any("ending the step also failed" in n for n in notes), notes
    with pytest.raises(sdalloc.SdallocError, match="sdalloc_pool_end_step"):
        with planned.step():
            planned.end_step()  # no body exception: the end's failure is raised


def test_stats_carry_the_step_figures_under_step_keys(planned):
    for _ in range(3):
        run_step(planned)
    s = sdalloc.stats(planned)
    step = planned.step_stats()
    for name in STEP_FIELDS:
        assert s["step_" + name] == step[name], name
    assert s["step_planned_allocations"] == 6
    assert planned.is_planned()
    memory = planned.memory_stats()
    assert not any(key.startswith("step_") for key in memory)
    assert all("." in k or k.startswith("num_") for k in memory)


def test_snapshot_of_a_planned_step_is_read_by_torch_memory_viz(planned, torch, tmp_path):
    from torch.cuda import _memory_viz  # pylint: disable=import-outside-toplevel
    run_step(planned)
    with planned.step():  # a planned step: its buffers are in the arena now
        live = [planned.malloc(MiB), planned.malloc(64 * KiB)]
        stats = sdalloc.stats(planned)
        path = tmp_path / "planned.pickle"
        sdalloc.dump_snapshot(str(path), planned)
        planned.free(live[0])
        live.append(planned.malloc(512 * KiB))
        for p in live[1:]:
            planned.free(p)
    assert planned.step_stats()["divergent_steps"] == 0
    with open(path, "rb") as f:
        snap = pickle.load(f)
    segments = snap["segments"]
    assert sum(s["total_size"] for s in segments) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segments) == stats["allocated_bytes.all.current"]
    assert sum(s["requested_size"] for s in segments) == stats["requested_bytes.all.current"]
    assert stats["requested_bytes.all.current"] == MiB + 64 * KiB
    arena = [s for s in segments if s["total_size"] >= stats["step_arena_bytes"]]
    assert arena, [s["total_size"] for s in segments]
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    live_blocks = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["requested_size"] for b in live_blocks) == [64 * KiB, MiB]
    major = int(torch.__version__.split(".")[0])
    data = snap if major >= 2 else segments
    if hasattr(_memory_viz, "stats"):  # it asserts every segment's blocks add up
        summary = _memory_viz.stats(data)
        assert summary["total_size"].value == stats["reserved_bytes.all.current"]
        assert summary["active_allocated"].value == stats["allocated_bytes.all.current"]
    assert "active_allocated" in _memory_viz.segments(data, format_flamegraph=lambda x: x)
    assert _memory_viz.memory(data, format_flamegraph=lambda x: x)


# --------------------------------------------------------------------------- the shim

SHIM_PRELUDE = """
    import ctypes
    from ctypes import c_int, c_size_t, c_void_p
    import sdalloc, sdalloc.torch as st
    from sdalloc import _native
    c = _native.shim().c
    MiB = 1 << 20
    # The exact signatures PyTorch calls.
    malloc = ctypes.CFUNCTYPE(c_void_p, c_size_t, c_int, c_void_p)(("sdalloc_torch_malloc", c))
    free = ctypes.CFUNCTYPE(None, c_void_p, c_size_t, c_int, c_void_p)(("sdalloc_torch_free", c))
"""


def check(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def test_shim_planned_mode_serves_steps_from_the_plan(libraries):
    check(run_python(SHIM_PRELUDE + """
    assert "mode:planned" in st.config_text() and "replan_after:3" in st.config_text(), \\
        st.config_text()
    seen = []
    for _ in range(3):
        with st.step(device=0):
            a = malloc(4 * MiB, 0, None)
            b = malloc(MiB, 0, None)
            free(a, 4 * MiB, 0, None)
            d = malloc(2 * MiB, 0, None)
            free(b, MiB, 0, None)
            free(d, 2 * MiB, 0, None)
        seen.append((a, b, d))
    assert c.sdalloc_torch_last_error() == b"", c.sdalloc_torch_last_error()
    s = st.step_stats(device=0)
    assert s["recorded_steps"] == 1 and s["planned_steps"] == 2, s
    assert s["planned_allocations"] == 6 and s["divergent_steps"] == 0, s
    assert seen[1] == seen[2]
    stats = sdalloc.stats(device=0)
    assert stats["step_planned_allocations"] == 6
    assert not any(k.startswith("step_") for k in st.memory_stats(device=0))
    # begin_step / end_step for loops that cannot use `with`
    st.begin_step(device=0)
    assert st.step_stats(device=0)["in_step"]
    try:
        st.begin_step(device=0)
    except sdalloc.SdallocError as e:
        assert e.status == "INVALID_ARGUMENT" and "sdalloc_pool_begin_step" in str(e), e
    else:
        raise AssertionError("a second begin_step was accepted")
    st.end_step(device=0)
    print("ok")
    """, env={"SDALLOC_CONF": "backend:host,mode:planned"}))


def test_shim_kept_latents_record_stream_and_empty_cache(libraries):
    check(run_python(SHIM_PRELUDE + """
    st.configure(backend="host", mode="planned", replan_after=2)
    assert "replan_after:2" in st.config_text(), st.config_text()
    latent = malloc(MiB, 0, None)          # before the loop: outside any step

    def denoise(record_on=None, at_begin=lambda: None):
        global latent
        with st.step(device=0):
            at_begin()
            work = malloc(8 * MiB, 0, None)
            new_latent = malloc(MiB, 0, None)
            if record_on is not None:
                c.sdalloc_torch_record_stream(work, record_on)   # used by another stream too
                assert c.sdalloc_torch_last_error() == b"", c.sdalloc_torch_last_error()
            free(work, 8 * MiB, 0, None)
            free(latent, MiB, 0, None)
            latent = new_latent

    for i in range(5):
        denoise()
    s = st.step_stats(device=0)
    assert s["recorded_steps"] == 1 and s["divergent_steps"] == 0, s
    assert s["kept_allocations"] == 4 and s["planned_allocations"] == 4, s
    # record_stream on an arena buffer is accepted; its free makes the step divergent (its
    # slot must wait for the other stream), on every backend. One divergent step does not
    # replan (replan_after:2), and the next step follows the plan again.
    denoise(record_on=c_void_p(0x5150))
    denoise()
    s = st.step_stats(device=0)
    assert s["divergent_steps"] == 1 and s["replans"] == 0 and s["has_plan"], s
    assert s["planned_allocations"] == 6 and s["kept_allocations"] == 6, s
    # A free on another stream than the plan's is a divergence too.
    with st.step(device=0):
        work = malloc(8 * MiB, 0, None)
        new_latent = malloc(MiB, 0, None)
        free(work, 8 * MiB, 0, c_void_p(0x5150))
        free(latent, MiB, 0, None)
        latent = new_latent
    s = st.step_stats(device=0)
    assert s["divergent_steps"] == 2 and s["planned_allocations"] == 7, s
    # Between steps empty_cache gives the arena back; the next step reserves it again.
    before = sdalloc.stats(device=0)["reserved_bytes.all.current"]
    released = st.empty_cache()
    after = sdalloc.stats(device=0)["reserved_bytes.all.current"]
    assert released >= s["arena_bytes"] and after <= before - s["arena_bytes"], \\
        (released, before, after, s)
    reserved_at_begin = []
    denoise(at_begin=lambda: reserved_at_begin.append(
        sdalloc.stats(device=0)["reserved_bytes.all.current"]))
    assert reserved_at_begin[0] >= after + s["arena_bytes"], (reserved_at_begin, after, s)
    s2 = st.step_stats(device=0)
    assert s2["planned_allocations"] == s["planned_allocations"] + 1, s2
    assert s2["divergent_steps"] == s["divergent_steps"] and s2["arena_failures"] == 0, s2
    free(latent, MiB, 0, None)
    assert sdalloc.stats(device=0)["allocation.all.current"] == 0
    print("ok")
    """))


def test_shim_step_needs_mode_planned(libraries):
    check(run_python(SHIM_PRELUDE + """
    st.configure(backend="host")
    for call in (lambda: st.step(device=0).__enter__(), lambda: st.begin_step(device=0),
                 lambda: st.end_step(device=0), lambda: st.step_stats(device=0)):
        try:
            call()
        except sdalloc.SdallocError as e:
            assert e.status == "INVALID_ARGUMENT", e
            assert "steps need the shim's mode planned" in str(e), e
            assert "mode:auto" in str(e), e
        else:
            raise AssertionError("a step on mode:auto was accepted")
    assert not any(k.startswith("step_") for k in sdalloc.stats(device=0))
    print("ok")
    """))


def test_shim_step_without_cuda_needs_a_device(torch):
    if torch.cuda.is_available():
        pytest.skip("torch has CUDA here: the default device is the current one")
    check(run_python(SHIM_PRELUDE + """
    st.configure(backend="host", mode="planned")
    try:
        st.step()
    except ValueError as e:
        assert "pass device=" in str(e), e
    else:
        raise AssertionError("a step without a device was accepted")
    with st.step(device=0) as step:
        assert step.stream is None   # no CUDA: the default stream
    print("ok")
    """))


@pytest.mark.parametrize("conf", ["backend:host,mode:planned,replan_after:0",
                                  "backend:host,mode:planned,replan_after:x"])
def test_shim_bad_replan_after_names_the_key(libraries, conf):
    result = check(run_python(SHIM_PRELUDE + """
    assert c.sdalloc_torch_malloc(100, 0, None) is None
    error = c.sdalloc_torch_last_error().decode()
    assert "replan_after" in error, error
    import os
    del os.environ["SDALLOC_CONF"]
    try:
        st.configure(backend="host", mode="planned", replan_after=0)
    except sdalloc.SdallocError as e:
        assert e.status == "INVALID_ARGUMENT" and "replan_after" in str(e), e
    else:
        raise AssertionError("replan_after:0 accepted")
    print("ok")
    """, env={"SDALLOC_CONF": conf}))
    assert "SDALLOC_CONF:" in result.stderr


def test_shim_step_defaults_to_the_current_device_and_stream(torch):  # pylint: disable=unused-argument
    # torch's CUDA answers replaced (this machine may have no GPU): step() with no
    # arguments uses torch.cuda.current_device() and that device's current stream.
    check(run_python(SHIM_PRELUDE + """
    import torch
    class FakeStream:
        cuda_stream = 0x7700
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 2
    torch.cuda.current_device = lambda: 1
    torch.cuda.current_stream = lambda device=None: FakeStream()
    st.configure(backend="host", mode="planned")
    stream = c_void_p(0x7700)
    seen = []
    for _ in range(3):
        with st.step() as step:
            assert step.stream == 0x7700, step.stream
            a = malloc(MiB, 1, stream)
            free(a, MiB, 1, stream)
        seen.append(a)
    s = st.step_stats(device=1)
    assert s["recorded_steps"] == 1 and s["planned_allocations"] == 2, s
    assert s["divergent_steps"] == 0 and seen[1] == seen[2], (s, seen)
    assert 0 not in st.pools()      # device 0 was never used
    print("ok")
    """))
