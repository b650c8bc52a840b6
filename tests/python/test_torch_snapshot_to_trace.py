"""tools/torch_snapshot_to_trace.py: snapshots built here with PyTorch's real key names are
converted (imported as a module and run as a script) to the expected event trace and figures;
broken inputs exit 1 with a message naming what is wrong.

Run: /usr/bin/python3 -m pytest -q tests/python
"""

import gzip
import importlib.util
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "torch_snapshot_to_trace.py"

_spec = importlib.util.spec_from_file_location("torch_snapshot_to_trace", SCRIPT)
converter = importlib.util.module_from_spec(_spec)
sys.modules["torch_snapshot_to_trace"] = converter  # dataclasses look the module up by name
_spec.loader.exec_module(converter)

MiB = 1 << 20
SIDE_STREAM = 0x55D0C3A1E0B0  # a cudaStream_t handle, as PyTorch records it (an int)
SEG_A = 0x7F0000000000  # 2 MiB segment, allocated and freed while recording
SEG_B = 0x7F0000200000  # 20 MiB segment on the side stream, still reserved at the end
SEG_OLD = 0x7F0000C00000  # 2 MiB segment reserved before recording began


def frames(name, line):
    return [{"filename": "/work/unet.py", "line": line, "name": name},
            {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py",
             "line": 1527, "name": "_call_impl"}]


def entry(action, addr, size, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 1_700_000_000_000_000 + t, "frames": frames("forward", 40 + t),
            "compile_context": "N/A", "user_metadata": ""}


def device0_trace():
    return [
        # freed, but allocated before recording began: skipped with a warning
        entry("free_requested", SEG_OLD, 8192, 0, 1),
        entry("free_completed", SEG_OLD, 8192, 0, 2),
        entry("segment_alloc", SEG_A, 2 * MiB, 0, 3),
        entry("alloc", SEG_A, 512 * 1024, 0, 4),
        entry("alloc", SEG_A + 512 * 1024, MiB, 0, 5),
        entry("free_requested", SEG_A, 512 * 1024, 0, 6),
        entry("free_completed", SEG_A, 512 * 1024, 0, 7),
        entry("segment_alloc", SEG_B, 20 * MiB, SIDE_STREAM, 8),
        entry("alloc", SEG_B, 16 * MiB, SIDE_STREAM, 9),
        entry("free_requested", SEG_A + 512 * 1024, MiB, 0, 10),
        entry("free_completed", SEG_A + 512 * 1024, MiB, 0, 11),
        entry("free_requested", SEG_B, 16 * MiB, SIDE_STREAM, 12),
        entry("free_completed", SEG_B, 16 * MiB, SIDE_STREAM, 13),
        entry("segment_free", SEG_A, 2 * MiB, 0, 14),
        entry("alloc", SEG_B, 4096, SIDE_STREAM, 15),
        {"action": "oom", "device_free": 1024, "size": 1 << 40, "stream": 0,
         "time_us": 1_700_000_000_000_016, "frames": [], "compile_context": "N/A",
         "user_metadata": ""},
        entry("snapshot", 0, 0, 0, 17),
    ]


def segment(device, address, total, stream, blocks):
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total, "stream": stream,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
            "frames": [], "blocks": blocks}


def block(address, size, state, requested=None):
    return {"address": address, "size": size, "requested_size": requested or size,
            "state": state, "frames": frames("forward", 55) if state != "inactive" else []}


def realistic_snapshot():
    """Two devices; device 0 has the longer history, device 1 a short one on stream 0."""
    return {
        "segments": [
            segment(0, SEG_B, 20 * MiB, SIDE_STREAM,
                    [block(SEG_B, 4096, "active_allocated"),
                     block(SEG_B + 4096, 20 * MiB - 4096, "inactive")]),
            segment(0, SEG_OLD, 2 * MiB, 0, [block(SEG_OLD, 2 * MiB, "inactive")]),
            segment(1, 0x7E0000000000, 2 * MiB, 0,
                    [block(0x7E0000000000, 1024, "active_allocated"),
                     block(0x7E0000000400, 2 * MiB - 1024, "inactive")]),
        ],
        "device_traces": [
            device0_trace(),
            [entry("segment_alloc", 0x7E0000000000, 2 * MiB, 0, 1),
             entry("alloc", 0x7E0000000000, 1024, 0, 2),
             entry("alloc", 0x7E0000000400, 2048, 0, 3),
             entry("free_requested", 0x7E0000000400, 2048, 0, 4),
             entry("free_completed", 0x7E0000000400, 2048, 0, 5)],
        ],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0,
                               "expandable_segments": False, "release_lock_on_malloc": False,
                               "pinned_num_register_threads": 1,
                               "pinned_use_host_register": False,
                               "roundup_power2_divisions": {}},
    }


EXPECTED_DEVICE0_TRACE = """op,id,size,stream
a,0,524288,0
a,1,1048576,0
f,0,524288,0
a,2,16777216,1
f,1,1048576,0
f,2,16777216,1
a,3,4096,1
"""
PEAK_LIVE = 16 * MiB + MiB
# Segments at the end: 20 MiB + the 2 MiB reserved before recording; the window's net is
# +20 MiB, so 2 MiB were reserved at the start, and the peak is 2 + 2 + 20 MiB.
PEAK_RESERVED = 24 * MiB


def check_event_trace(text):
    """The rules sdalloc::read_event_trace enforces: header, fields, unique ids, live frees."""
    lines = text.split("\n")
    assert lines[-1] == "", "the trace ends with a newline"
    header, rows = lines[0], lines[1:-1]
    assert header in ("op,id,size", "op,id,size,stream")
    fields = header.count(",") + 1
    live, seen = {}, set()
    for row in rows:
        parts = row.split(",")
        assert len(parts) == fields, row
        op, ident, size = parts[0], int(parts[1]), int(parts[2])
        assert all(p.isdigit() for p in parts[1:]), row
        if op == "a":
            assert ident not in seen, f"id {ident} reused"
            seen.add(ident)
            live[ident] = size
        else:
            assert op == "f", row
            assert live.pop(ident) == size, row


def write_pickle(path, obj, protocol=pickle.DEFAULT_PROTOCOL):
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


# --- conversion, as a module ---------------------------------------------------------------

def test_realistic_snapshot_converts_to_the_expected_trace():
    snapshot = converter.load_snapshot(pickle.dumps(realistic_snapshot()))
    result = converter.convert(snapshot, source="snap.pickle")
    assert result.device == 0
    assert result.free_action == "free_completed"
    assert result.trace_csv() == EXPECTED_DEVICE0_TRACE
    check_event_trace(result.trace_csv())
    assert result.streams == [0, SIDE_STREAM]
    assert (result.allocations, result.frees) == (4, 3)
    assert result.peak_live_bytes == PEAK_LIVE
    assert (result.live_at_end, result.live_bytes_at_end) == (1, 4096)


def test_pytorch_reserved_figures_come_from_segment_events_and_segments():
    result = converter.convert(realistic_snapshot())
    assert result.segment_events == 3
    assert result.pytorch_reserved_at_end_bytes == 22 * MiB
    assert result.pytorch_reserved_at_start_bytes == 2 * MiB
    assert result.pytorch_peak_reserved_bytes == PEAK_RESERVED


def test_segment_map_and_unmap_count_as_reserving_and_releasing():
    snapshot = realistic_snapshot()
    snapshot["segments"] = [segment(0, SEG_A, 6 * MiB, 0, [block(SEG_A, 6 * MiB, "inactive")])]
    snapshot["device_traces"] = [[
        entry("segment_map", SEG_A, 4 * MiB, 0, 1),
        entry("alloc", SEG_A, 4 * MiB, 0, 2),
        entry("segment_map", SEG_A + 4 * MiB, 4 * MiB, 0, 3),
        entry("free_completed", SEG_A, 4 * MiB, 0, 4),
        entry("segment_unmap", SEG_A, 2 * MiB, 0, 5),
    ]]
    result = converter.convert(snapshot)
    assert result.pytorch_reserved_at_start_bytes == 0
    assert result.pytorch_peak_reserved_bytes == 8 * MiB
    assert result.peak_live_bytes == 4 * MiB


def test_frees_of_allocations_made_before_recording_are_skipped_and_reported():
    result = converter.convert(realistic_snapshot())
    assert (result.unknown_frees, result.unknown_free_bytes) == (1, 8192)
    assert any("before recording began" in w for w in result.warnings)


def test_oom_and_unknown_actions_are_counted():
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0].append(entry("future_action", 0, 0))
    result = converter.convert(snapshot)
    assert result.ooms == 1
    assert result.unknown_actions == {"future_action": 1}
    assert any("out-of-memory 1 time" in w for w in result.warnings)


def test_alloc_at_a_live_address_frees_the_old_allocation_first():
    snapshot = realistic_snapshot()
    snapshot["device_traces"] = [[entry("alloc", 0x1000, 64), entry("alloc", 0x1000, 32)]]
    snapshot["segments"] = []
    result = converter.convert(snapshot)
    assert result.trace_csv() == "op,id,size\na,0,64\nf,0,64\na,1,32\n"
    assert result.implicit_frees == 1


def test_free_with_another_size_is_written_with_the_alloc_size():
    snapshot = realistic_snapshot()
    snapshot["device_traces"] = [[entry("alloc", 0x1000, 64), entry("free_completed", 0x1000, 48)]]
    snapshot["segments"] = []
    result = converter.convert(snapshot)
    assert result.trace_csv() == "op,id,size\na,0,64\nf,0,64\n"
    assert result.size_mismatches == 1


def test_free_requested_is_used_when_the_history_has_no_completions():
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0] = [e for e in device0_trace() if e["action"] != "free_completed"]
    result = converter.convert(snapshot)
    assert result.free_action == "free_requested"
    assert result.trace_csv() == EXPECTED_DEVICE0_TRACE
    assert any("no free_completed" in w for w in result.warnings)


def test_free_at_requested_ends_lifetimes_earlier():
    # A cross-stream free: requested before the next alloc, completed after it.
    snapshot = {"segments": [], "device_traces": [[
        entry("alloc", 0x1000, 100), entry("free_requested", 0x1000, 100),
        entry("alloc", 0x2000, 50), entry("free_completed", 0x1000, 100)]]}
    completed = converter.convert(snapshot, free_at="completed")
    requested = converter.convert(snapshot, free_at="requested")
    assert completed.peak_live_bytes == 150
    assert requested.peak_live_bytes == 100
    assert requested.trace_csv() == "op,id,size\na,0,100\nf,0,100\na,1,50\n"


def test_device_option_selects_another_device():
    result = converter.convert(realistic_snapshot(), device=1)
    assert result.device == 1
    assert result.trace_csv() == "op,id,size\na,0,1024\na,1,2048\nf,1,2048\n"
    assert result.pytorch_reserved_at_start_bytes == 0
    assert result.pytorch_peak_reserved_bytes == 2 * MiB


def test_default_device_is_the_one_with_most_entries():
    snapshot = realistic_snapshot()
    snapshot["device_traces"] = [[], snapshot["device_traces"][1], []]
    assert converter.convert(snapshot).device == 1


def test_gzip_snapshot_and_every_pickle_protocol_load():
    data = pickle.dumps(realistic_snapshot(), protocol=2)
    assert converter.load_snapshot(gzip.compress(data))["device_traces"]
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        loaded = converter.load_snapshot(pickle.dumps(realistic_snapshot(), protocol=protocol))
        assert loaded["segments"][0]["segment_pool_id"] == (0, 0)


# --- malformed inputs -----------------------------------------------------------------------

def load_error(data):
    with pytest.raises(converter.SnapshotError) as error:
        converter.load_snapshot(data)
    return str(error.value)


def convert_error(snapshot, **options):
    with pytest.raises(converter.SnapshotError) as error:
        converter.convert(snapshot, **options)
    return str(error.value)


def test_pickle_that_names_a_callable_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    # What a hostile "snapshot" looks like: os.system("touch <marker>") on load.
    hostile = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    message = load_error(hostile)
    assert "os.system" in message and "refused" in message
    assert not marker.exists()


def test_class_instances_are_refused():
    import collections
    assert "collections.OrderedDict" in load_error(pickle.dumps(collections.OrderedDict(a=1)))


def test_not_a_pickle_is_rejected():
    assert "not a pickle" in load_error(b"hello, this is text\n")
    assert "file is empty" in load_error(b"")


def test_truncated_pickle_is_rejected():
    data = pickle.dumps(realistic_snapshot())
    assert "truncated" in load_error(data[: len(data) // 2])


def test_other_formats_are_named():
    assert "zip archive" in load_error(b"PK\x03\x04rest")
    assert "already an sdalloc event trace" in load_error(b"op,id,size\na,0,1\n")
    assert "RMM log" in load_error(b"Thread,Time,Action,Pointer,Size,Stream\n")


def test_wrong_structures_name_what_is_missing():
    assert "holds a list" in load_error(pickle.dumps([1, 2]))
    no_history = {"segments": [], "allocator_settings": {}}
    message = load_error(pickle.dumps(no_history))
    assert "no 'device_traces'" in message and "_record_memory_history" in message
    assert "no 'segments'" in load_error(pickle.dumps({"device_traces": [[]]}))
    assert "one list of entries per device" in load_error(
        pickle.dumps({"segments": [], "device_traces": {"0": []}}))
    assert "segments[0] has no 'total_size'" in load_error(
        pickle.dumps({"segments": [{"address": 1}], "device_traces": [[]]}))


def test_malformed_entries_are_named_with_their_place():
    snapshot = realistic_snapshot()
    del snapshot["device_traces"][0][3]["addr"]
    assert convert_error(snapshot) == "device_traces[0][3] (action 'alloc') has no 'addr'"

    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][4]["size"] = "1MB"
    assert "device_traces[0][4] (action 'alloc') 'size' is '1MB'" in convert_error(snapshot)

    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][2] = ["segment_alloc"]
    assert "device_traces[0][2] is a list, not a dict" in convert_error(snapshot)

    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][5]["size"] = -1
    assert "not a non-negative integer" in convert_error(snapshot)


def test_empty_history_is_rejected():
    assert "history is empty" in convert_error({"segments": [], "device_traces": [[], []]})
    assert "history is empty" in convert_error({"segments": [], "device_traces": []})


def test_history_without_allocations_is_rejected():
    snapshot = {"segments": [], "device_traces": [[entry("free_completed", 0x10, 8)]]}
    assert "no allocations" in convert_error(snapshot)


def test_bad_device_choices_are_rejected():
    assert "devices 0 to 1" in convert_error(realistic_snapshot(), device=5)
    snapshot = realistic_snapshot()
    snapshot["device_traces"][1] = []
    assert "device 1 has no trace entries (devices with entries: 0)" in convert_error(
        snapshot, device=1)


# --- the script, run as a user runs it -------------------------------------------------------

def test_script_writes_trace_summary_and_json(tmp_path):
    snap = write_pickle(tmp_path / "snapshot.pickle", realistic_snapshot())
    out, summary = tmp_path / "trace.csv", tmp_path / "summary.json"
    run = run_script(snap, "-o", out, "--json", summary)
    assert run.returncode == 0, run.stderr
    assert out.read_text() == EXPECTED_DEVICE0_TRACE
    assert f"peak live in the trace:   {PEAK_LIVE} B (17.0 MiB)" in run.stdout
    assert f"PyTorch peak reserved:    {PEAK_RESERVED} B (24.0 MiB)" in run.stdout
    assert "warning: 1 free(s) (8192 B)" in run.stdout
    figures = json.loads(summary.read_text())
    assert figures["peak_live_bytes"] == PEAK_LIVE
    assert figures["pytorch_peak_reserved_bytes"] == PEAK_RESERVED
    assert figures["device"] == 0 and figures["free_action"] == "free_completed"
    assert figures["streams"] == {"0": 0, "1": SIDE_STREAM}
    assert figures["unknown_frees"] == 1


def test_script_without_output_writes_trace_to_stdout_and_summary_to_stderr(tmp_path):
    snap = write_pickle(tmp_path / "snapshot.pickle", realistic_snapshot())
    run = run_script(snap, "--device", "1")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "op,id,size\na,0,1024\na,1,2048\nf,1,2048\n"
    assert "device 1" in run.stderr and "PyTorch peak reserved" in run.stderr


def test_script_exits_1_with_a_message_on_bad_input(tmp_path):
    garbage = tmp_path / "garbage.pickle"
    garbage.write_bytes(b"\x80\x04not really")
    run = run_script(garbage, "-o", tmp_path / "t.csv")
    assert run.returncode == 1
    assert "garbage.pickle: error: not a pickle" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "t.csv").exists()

    empty = write_pickle(tmp_path / "empty.pickle", {"segments": [], "device_traces": [[]]})
    run = run_script(empty)
    assert run.returncode == 1 and "history is empty" in run.stderr

    run = run_script(tmp_path / "missing.pickle")
    assert run.returncode == 1 and "cannot read" in run.stderr


def test_main_can_be_called_in_process(tmp_path):
    snap = write_pickle(tmp_path / "snapshot.pickle", realistic_snapshot())
    stdout, stderr = io.StringIO(), io.StringIO()
    assert converter.main([str(snap), "--quiet"], stdout=stdout, stderr=stderr) == 0
    assert stdout.getvalue() == EXPECTED_DEVICE0_TRACE
    assert stderr.getvalue() == ""


# --- issue 15, F8: crafted pickles end in a one-line error, within bounds ---------------------

def nested_pickle(depth, opener, closer):
    """A pickle of `depth` nested containers (pickle.dumps itself would recurse that deep)."""
    return opener * depth + closer * depth


def snapshot_pickle_with(size_bytes):
    """A snapshot pickle (protocol 4) built from opcodes, `size_bytes` the size of its only
    entry."""
    entry = (b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addr\x4b\x10\x8c\x04size" + size_bytes
             + b"u")
    body = b"}(\x8c\x08segments]\x8c\x0ddevice_traces](]" + entry + b"aeu"
    return b"\x80\x04" + body + b"."


def test_f8_deeply_nested_key_or_value_is_a_one_line_error(tmp_path):
    deep_tuple = nested_pickle(100_000, b"", b"\x85")  # TUPLE1 around TUPLE1 ...
    no_history = b"\x80\x04}" + b")" + deep_tuple + b"K\x01s."
    message = load_error(no_history)
    assert "no 'device_traces' (keys: a tuple)" in message
    deep_list = b"]" + nested_pickle(100_000, b"]", b"a")  # lists in lists
    snapshot = converter.load_snapshot(snapshot_pickle_with(size_bytes=deep_list))
    assert "'size' is a list, not a non-negative integer" in convert_error(snapshot)
    path = tmp_path / "nested.pickle"
    path.write_bytes(no_history)
    run = run_script(path)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert len(run.stderr.splitlines()) == 1


def test_f8_huge_integers_and_out_of_range_fields_are_refused():
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][3]["size"] = 10**5000
    message = convert_error(snapshot)
    assert "'size' is an integer of 16610 bits, not a non-negative integer below 2^64" in message
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][3]["size"] = 2**70
    assert "'size' is 1180591620717411303424, not a non-negative integer below 2^64" in (
        convert_error(snapshot))
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0][3]["stream"] = -1
    assert "'stream' is -1, not a stream handle" in convert_error(snapshot)
    snapshot = realistic_snapshot()
    snapshot["segments"][0]["total_size"] = 2**64
    assert "segments[0] has no 'total_size'" in convert_error(snapshot)
    snapshot = {"segments": [], "device_traces": [[entry("alloc", 0x10, 2**63),
                                                   entry("alloc", 0x20, 2**63)]]}
    assert "device_traces[0][1]: the bytes live at once exceed 2^64 - 1" in convert_error(snapshot)


def test_f8_one_entry_referenced_millions_of_times_is_refused_at_once():
    one = entry("alloc", 0x1000, 64)
    data = pickle.dumps({"segments": [], "device_traces": [[one] * 3_000_000]}, protocol=4)
    assert len(data) < 7_000_000  # the finding's 6 MB pickle
    message = convert_error(converter.load_snapshot(data))
    assert "device_traces[0][1] is the same object as device_traces[0][0]" in message


def test_f8_zeros_are_refused_from_the_first_bytes_without_reading_the_rest():
    import tracemalloc
    import zlib
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    zeros = bytes(1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(512)) + packer.flush()  # 512 MiB
    tracemalloc.start()
    try:
        message = load_error(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "not a pickle (it starts with byte 0x00" in message
    assert peak < 16 * MiB
    if Path("/dev/zero").exists():
        assert "starts with byte 0x00" in load_error_from_path("/dev/zero")


def load_error_from_path(path):
    with pytest.raises(converter.SnapshotError) as error:
        converter.load_snapshot(path)
    return str(error.value)


def test_f8_input_text_in_messages_is_escaped_and_shortened():
    hostile = b"c\x1b[31mos\nsystem\n."  # GLOBAL with a terminal escape in the module name
    message = load_error(hostile)
    assert "\x1b" not in message and "'\\x1b[31mos'" in message
    snapshot = realistic_snapshot()
    snapshot["device_traces"][0].append(entry("\x1b]0;pwned\x07" + "x" * 500, 0, 0))
    warnings = " ".join(converter.convert(snapshot).warnings)
    assert "\x1b" not in warnings and "\x07" not in warnings and "..." in warnings
    assert len(warnings) < 1000
