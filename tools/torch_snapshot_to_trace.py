#!/usr/bin/env python3
"""torch_snapshot_to_trace.py - a PyTorch CUDA memory snapshot, converted to an sdalloc event trace.

Input: the pickle written by torch.cuda.memory._dump_snapshot() (plain or gzip), recorded with
torch.cuda.memory._record_memory_history() on, so that it has a history:
    {"segments": [{"device", "address", "total_size", "stream", "blocks": [...], ...}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames", ...}], ...],
     ...}
device_traces holds one list per CUDA device, oldest entry first.

Output: the event trace of docs/formats.md (`op,id,size[,stream]`, read by `sdalloc replay`
and sdalloc::read_event_trace), and a short summary putting PyTorch's own figure beside the
trace's: the peak bytes PyTorch's caching allocator *reserved* from CUDA while recording,
against the peak bytes *live* in the trace (the least any allocator could do).

Conversion, for one device (--device N; default: the device with the most trace entries):
  alloc            -> `a`, a fresh id (0, 1, 2, ...), keyed by its address until freed.
  free_completed   -> `f` of the id live at that address. PyTorch frees in two steps:
  free_requested      free_requested when the tensor dies, free_completed once the memory is
                      reusable (after work queued on other streams that used it finishes).
                      --free-at completed (the default when the history has any
                      free_completed) frees at completion: the lifetimes PyTorch's allocator
                      itself had to serve, so the peak live matches its "allocated" statistic.
                      --free-at requested frees when the program released the tensor; auto
                      falls back to it for histories recorded with free_completed skipped.
  segment_alloc, segment_map     -> PyTorch reserved more memory (cudaMalloc, or mapping pages
  segment_free, segment_unmap       of an expandable segment) / gave it back.
  oom              -> counted, reported.
  snapshot, annotate and unknown actions -> ignored (unknown ones are counted).
Sizes are those PyTorch recorded (the bytes requested, before its rounding). Streams are
numbered 0, 1, 2, ... in order of first appearance among the converted events; the summary
and --json list which handle each number stands for.

The history is a window (a ring buffer of max_entries, or recording started mid-run), so:
  * A free of an address with no alloc in the window belongs to an allocation made before
    recording began: skipped and counted, with a warning. Such allocations are missing from
    the trace, so its peak live can be lower than what PyTorch held.
  * An alloc at an address still live means its free was not recorded: the old allocation is
    freed there (counted as an implicit free, with a warning).
  * A free whose size differs from its alloc's is written with the alloc's size (counted).
  * PyTorch's reserved bytes when recording began are inferred: the segments in the snapshot
    (state at the end) minus the net segment events in the window. The peak reserved is that
    start plus the highest rise over the window.

Errors (exit status 1, a message naming what is wrong): not a pickle, a pickle that is not a
snapshot (the missing or mistyped key is named, with its place: device_traces[0][17]),
a snapshot without history, a device without entries, a history without allocations.

Bounds (crafted files end in a one-line error, never a traceback): every address, size and
stream must fit 64 bits, as sdalloc reads them; an entry may appear only once in a device's
history (a pickle can make one entry stand for millions, a few bytes each); the first bytes
must look like a pickle before the rest is read; input text in messages is shown escaped
and shortened; any other failure while converting is reported in one line.

Safety: unpickling can run arbitrary code (a pickle may name any importable callable). A
snapshot holds only dicts, lists, tuples, strings and numbers, which pickle encodes without
naming any callable; the loader here refuses every callable, so a hostile file fails to load
instead of running code. It can still be large: load only files of a size you expect.

Usage:
    python3 tools/torch_snapshot_to_trace.py snapshot.pickle -o trace.csv [--device N]
        [--free-at auto|completed|requested] [--json summary.json] [--quiet]
With -o omitted or "-", the trace goes to standard output and the summary to standard error.
Standard library only (Python 3.9 or later); no torch needed.
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import json
import pickle
import pickletools
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, List, Optional, TextIO, Tuple

ALLOCATION_ACTIONS = ("alloc", "free_requested", "free_completed")
RESERVE_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
IGNORED_ACTIONS = ("snapshot", "annotate")
FREE_AT_CHOICES = ("auto", "completed", "requested")
UINT64_LIMIT = 1 << 64             # addresses, sizes and streams are 64-bit in sdalloc's traces
SHOWN_CHARS = 60                   # input text shown in a message, at most
HEAD_BYTES = 1 << 16               # checked before the rest of a file is read
_PICKLE_OPCODES = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes)


class SnapshotError(Exception):
    """The input is not a usable memory snapshot; the message says why."""


def _shown(value: Any) -> str:
    """A piece of input for a message: short, one line, escaped; never raises.

    repr() of a deeply nested container recurses until RecursionError, and str() of an
    integer of more than 4,300 digits raises ValueError, so neither is called on input.
    """
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 128:
            return f"an integer of {value.bit_length()} bits"
        return str(value)
    if isinstance(value, (str, bytes)):
        cut = len(value) > SHOWN_CHARS
        return repr(value[:SHOWN_CHARS]) + ("..." if cut else "")
    return f"a {type(value).__name__}"


def _plain(text: str) -> str:
    """Input text shown bare when it is short printable ASCII, else as _shown() writes it."""
    if isinstance(text, str) and len(text) <= SHOWN_CHARS and text.isascii() and text.isprintable():
        return text
    return _shown(text)


class _ContainersOnlyUnpickler(pickle.Unpickler):
    """An Unpickler that builds dicts, lists, tuples, strings and numbers, and nothing else.

    Those are encoded by opcodes that never look up a callable; everything that could run
    code (classes, functions, reduce) goes through find_class, which refuses all of them.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"the pickle asks for the Python object {_plain(module)}.{_plain(name)}; a memory snapshot holds "
            "only dicts, lists, strings and numbers, so it is refused (loading it could run "
            "code)"
        )


def _read_checked(raw: BinaryIO) -> bytes:
    """The (decompressed) bytes of a file whose first bytes pass _check_head; raw has peek."""
    compressed = raw.peek(2)[:2] == b"\x1f\x8b"
    stream = gzip.GzipFile(fileobj=raw) if compressed else raw
    try:
        head = stream.read(HEAD_BYTES)
        _check_head(head)
        return head + stream.read()
    except (OSError, EOFError, ValueError, zlib.error) as error:  # BadGzipFile is an OSError
        if not compressed:
            raise
        raise SnapshotError(f"broken gzip data: {_plain(str(error))}") from None


def load_snapshot(source: "str | bytes | BinaryIO") -> Dict[str, Any]:
    """Reads a snapshot pickle (a path, the bytes, or a binary file), checking its layout.

    The first bytes are checked before the rest is read (or decompressed), so /dev/zero or
    a gzip of zeros is refused at once.
    """
    if isinstance(source, bytes):
        data = _read_checked(io.BufferedReader(io.BytesIO(source)))
    elif isinstance(source, str):
        try:
            with open(source, "rb") as f:
                data = _read_checked(f)
        except OSError as error:
            raise SnapshotError(f"cannot read {source}: {error.strerror or error}") from None
    else:
        data = _read_checked(source if hasattr(source, "peek") else io.BufferedReader(source))
    try:
        snapshot = _ContainersOnlyUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except Exception as error:  # pickle raises many kinds on garbage; all mean the same here
        raise SnapshotError(
            f"not a pickle, or a truncated one ({type(error).__name__}: {_plain(str(error))}); "
            "expected the file written by torch.cuda.memory._dump_snapshot()"
        ) from None
    check_layout(snapshot)
    return snapshot


def _check_head(data: bytes) -> None:
    """Refuses what is plainly no pickle from the first bytes alone."""
    if not data:
        raise SnapshotError("the file is empty: expected a pickle from "
                            "torch.cuda.memory._dump_snapshot()")
    if data[:4] == b"PK\x03\x04":
        raise SnapshotError("this is a zip archive (torch.save output?), not a snapshot pickle "
                            "from torch.cuda.memory._dump_snapshot()")
    if data.startswith(b"op,id,size"):
        raise SnapshotError("this is already an sdalloc event trace: give it to sdalloc directly")
    if data.startswith(b"Thread,Time,Action,Pointer,Size,Stream"):
        raise SnapshotError("this is an RMM log: sdalloc reads it directly")
    if data[0] not in _PICKLE_OPCODES:
        raise SnapshotError(
            f"not a pickle (it starts with byte {data[0]:#04x}, which no pickle does); expected "
            "the file written by torch.cuda.memory._dump_snapshot()")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_uint64(value: Any) -> bool:
    return _is_int(value) and 0 <= value < UINT64_LIMIT


def check_layout(snapshot: Any) -> None:
    """Raises SnapshotError naming the first part of the snapshot layout that is missing."""
    if not isinstance(snapshot, dict):
        raise SnapshotError(
            f"the pickle holds a {type(snapshot).__name__}, not a snapshot: expected a dict "
            "with 'segments' and 'device_traces' (torch.cuda.memory._snapshot())"
        )
    if "device_traces" not in snapshot:
        keys = ", ".join(_shown(k) for k in itertools.islice(snapshot, 8)) or "none"
        hint = ("; it has 'segments' but no history: call "
                "torch.cuda.memory._record_memory_history() before running the model"
                if "segments" in snapshot else "")
        raise SnapshotError(f"the snapshot has no 'device_traces' (keys: {keys}){hint}")
    if "segments" not in snapshot:
        raise SnapshotError("the snapshot has no 'segments' (needed for the reserved bytes)")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError("'device_traces' must be a list with one list of entries per device")
    segments = snapshot["segments"]
    if not isinstance(segments, list):
        raise SnapshotError("'segments' must be a list")
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        if not isinstance(segment, dict):
            raise SnapshotError(f"{where} is a {type(segment).__name__}, not a dict")
        if not _is_uint64(segment.get("total_size")):
            raise SnapshotError(f"{where} has no 'total_size' (a non-negative integer below "
                                "2^64)")
        if "device" in segment and not _is_uint64(segment["device"]):
            raise SnapshotError(f"{where} 'device' is not an integer")


def _check_entry(entry: Any, where: str) -> str:
    if not isinstance(entry, dict):
        raise SnapshotError(f"{where} is a {type(entry).__name__}, not a dict")
    action = entry.get("action")
    if not isinstance(action, str):
        raise SnapshotError(f"{where} has no 'action' string")
    if action in ALLOCATION_ACTIONS or action in RESERVE_ACTIONS:
        for key in ("addr", "size"):
            if key not in entry:
                raise SnapshotError(f"{where} (action '{action}') has no '{key}'")
            if not _is_uint64(entry[key]):
                raise SnapshotError(f"{where} (action '{action}') '{key}' is "
                                    f"{_shown(entry[key])}, not a non-negative integer below "
                                    "2^64")
        if "stream" in entry and not _is_uint64(entry["stream"]):
            raise SnapshotError(f"{where} (action '{action}') 'stream' is "
                                f"{_shown(entry['stream'])}, not a stream handle (an integer "
                                "from 0 to 2^64 - 1)")
    return action


@dataclass
class Conversion:
    """An event trace converted from one device's history, and what the conversion saw."""

    source: str
    device: int
    free_action: str                   # "free_completed" or "free_requested"
    entries: int = 0                   # trace entries of the device
    events: List[Tuple[str, int, int, int]] = field(default_factory=list)  # (op, id, size, stream)
    streams: List[int] = field(default_factory=list)  # streams[i]: handle numbered i
    allocations: int = 0
    frees: int = 0
    peak_live_bytes: int = 0
    live_at_end: int = 0
    live_bytes_at_end: int = 0
    unknown_frees: int = 0             # frees of allocations made before recording began
    unknown_free_bytes: int = 0
    implicit_frees: int = 0            # allocs at a live address: the missed free added
    size_mismatches: int = 0
    ooms: int = 0
    unknown_actions: Dict[str, int] = field(default_factory=dict)
    pytorch_peak_reserved_bytes: int = 0
    pytorch_reserved_at_start_bytes: int = 0
    pytorch_reserved_at_end_bytes: int = 0
    segment_events: int = 0
    warnings: List[str] = field(default_factory=list)

    def trace_csv(self) -> str:
        """The event trace text, with a stream column unless every stream is 0."""
        with_stream = any(stream != 0 for _, _, _, stream in self.events)
        lines = ["op,id,size,stream" if with_stream else "op,id,size"]
        if with_stream:
            lines += [f"{op},{i},{size},{stream}" for op, i, size, stream in self.events]
        else:
            lines += [f"{op},{i},{size}" for op, i, size, _ in self.events]
        return "\n".join(lines) + "\n"

    def summary(self) -> Dict[str, Any]:
        """The figures, as written by --json."""
        return {
            "source": self.source,
            "device": self.device,
            "free_action": self.free_action,
            "trace_entries": self.entries,
            "events": len(self.events),
            "allocations": self.allocations,
            "frees": self.frees,
            "streams": {str(i): handle for i, handle in enumerate(self.streams)},
            "peak_live_bytes": self.peak_live_bytes,
            "live_at_end": self.live_at_end,
            "live_bytes_at_end": self.live_bytes_at_end,
            "pytorch_peak_reserved_bytes": self.pytorch_peak_reserved_bytes,
            "pytorch_reserved_at_start_bytes": self.pytorch_reserved_at_start_bytes,
            "pytorch_reserved_at_end_bytes": self.pytorch_reserved_at_end_bytes,
            "segment_events": self.segment_events,
            "unknown_frees": self.unknown_frees,
            "unknown_free_bytes": self.unknown_free_bytes,
            "implicit_frees": self.implicit_frees,
            "size_mismatches": self.size_mismatches,
            "ooms": self.ooms,
            "unknown_actions": dict(self.unknown_actions),
            "warnings": list(self.warnings),
        }


def choose_device(snapshot: Dict[str, Any], device: Optional[int]) -> int:
    traces = snapshot["device_traces"]
    with_entries = [i for i, t in enumerate(traces) if t]
    if not with_entries:
        raise SnapshotError(
            "the snapshot's history is empty (no trace entries on any device): call "
            "torch.cuda.memory._record_memory_history() before running the model, then "
            "torch.cuda.memory._dump_snapshot()"
        )
    if device is None:
        return max(with_entries, key=lambda i: (len(traces[i]), -i))
    if device < 0 or device >= len(traces):
        raise SnapshotError(f"--device {device}: the snapshot has devices 0 to {len(traces) - 1}")
    if not traces[device]:
        listed = ", ".join(str(i) for i in with_entries)
        raise SnapshotError(
            f"device {device} has no trace entries (devices with entries: {listed})")
    return device


def _free_action(entries: List[Dict[str, Any]], free_at: str) -> str:
    if free_at == "completed":
        return "free_completed"
    if free_at == "requested":
        return "free_requested"
    if any(isinstance(e, dict) and e.get("action") == "free_completed" for e in entries):
        return "free_completed"
    return "free_requested"


def convert(snapshot: Dict[str, Any], source: str = "<snapshot>", device: Optional[int] = None,
            free_at: str = "auto") -> Conversion:
    """Converts one device's history; raises SnapshotError when there is nothing to convert."""
    check_layout(snapshot)
    if free_at not in FREE_AT_CHOICES:
        raise ValueError(f"free_at must be one of {FREE_AT_CHOICES}")
    device = choose_device(snapshot, device)
    entries = snapshot["device_traces"][device]
    result = Conversion(source=source, device=device,
                        free_action=_free_action(entries, free_at), entries=len(entries))
    skipped_free = ("free_requested" if result.free_action == "free_completed"
                    else "free_completed")

    live: Dict[int, Tuple[int, int]] = {}     # address -> (id, size)
    stream_numbers: Dict[int, int] = {}
    live_bytes = 0
    reserved = 0                              # relative to the start of the window
    highest_reserved = 0

    def stream_number(handle: int) -> int:
        if handle not in stream_numbers:
            stream_numbers[handle] = len(result.streams)
            result.streams.append(handle)
        return stream_numbers[handle]

    def free(addr: int, size: int, stream: int) -> None:
        nonlocal live_bytes
        ident, alloc_size = live.pop(addr)
        if size != alloc_size:
            result.size_mismatches += 1
        result.events.append(("f", ident, alloc_size, stream))
        result.frees += 1
        live_bytes -= alloc_size

    seen: Dict[int, int] = {}                 # id(entry) -> its first index
    for index, entry in enumerate(entries):
        where = f"device_traces[{device}][{index}]"
        first = seen.setdefault(id(entry), index)
        if first != index:
            raise SnapshotError(
                f"{where} is the same object as device_traces[{device}][{first}]: a snapshot "
                "never repeats an entry (a crafted pickle can make one entry stand for millions)")
        action = _check_entry(entry, where)
        if action in RESERVE_ACTIONS:
            result.segment_events += 1
            reserved += RESERVE_ACTIONS[action] * entry["size"]
            highest_reserved = max(highest_reserved, reserved)
            continue
        if action == "oom":
            result.ooms += 1
            continue
        if action in IGNORED_ACTIONS or action == skipped_free:
            continue
        if action not in ALLOCATION_ACTIONS:
            result.unknown_actions[action] = result.unknown_actions.get(action, 0) + 1
            continue
        addr, size, handle = entry["addr"], entry["size"], entry.get("stream", 0)
        if action == "alloc":
            stream = stream_number(handle)
            if addr in live:
                result.implicit_frees += 1
                free(addr, live[addr][1], stream)
            live[addr] = (result.allocations, size)
            result.events.append(("a", result.allocations, size, stream))
            result.allocations += 1
            live_bytes += size
            if live_bytes >= UINT64_LIMIT:
                raise SnapshotError(f"{where}: the bytes live at once exceed 2^64 - 1")
            result.peak_live_bytes = max(result.peak_live_bytes, live_bytes)
        elif addr in live:
            free(addr, size, stream_number(handle))
        else:
            result.unknown_frees += 1
            result.unknown_free_bytes += size

    if result.allocations == 0:
        raise SnapshotError(
            f"device {device}'s history has {len(entries)} entries but no allocations "
            "('alloc' actions): nothing to convert"
        )
    result.live_at_end = len(live)
    result.live_bytes_at_end = live_bytes

    end = sum(s["total_size"] for s in snapshot["segments"] if s.get("device", device) == device)
    start = end - reserved
    if start < 0:
        result.warnings.append(
            f"the snapshot's segments hold {end} B on device {device}, less than the {reserved} B "
            "its history reserved: taking 0 B reserved at the start of recording"
        )
        start = 0
    result.pytorch_reserved_at_end_bytes = end
    result.pytorch_reserved_at_start_bytes = start
    result.pytorch_peak_reserved_bytes = start + highest_reserved

    if result.unknown_frees:
        result.warnings.append(
            f"{result.unknown_frees} free(s) ({result.unknown_free_bytes} B) of allocations made "
            "before recording began were skipped: the trace lacks those allocations"
        )
    if result.implicit_frees:
        result.warnings.append(
            f"{result.implicit_frees} alloc(s) at an address still live: the missing free was "
            "added just before"
        )
    if result.size_mismatches:
        result.warnings.append(
            f"{result.size_mismatches} free(s) recorded a size different from their alloc's: "
            "written with the alloc's size"
        )
    if result.ooms:
        result.warnings.append(
            f"PyTorch raised out-of-memory {result.ooms} time(s) while recording")
    if result.unknown_actions:
        counted = sorted(result.unknown_actions.items())
        listed = ", ".join(f"{_plain(a)} x{n}" for a, n in counted[:10])
        if len(counted) > 10:
            listed += f" and {len(counted) - 10} more"
        result.warnings.append(f"unknown actions ignored: {listed}")
    if result.free_action == "free_requested" and free_at == "auto":
        result.warnings.append("the history has no free_completed entries: freeing at "
                               "free_requested")
    return result


def format_bytes(n: int) -> str:
    return f"{n} B ({n / 2**20:.1f} MiB)"


def summary_text(result: Conversion, output: str) -> str:
    streams = ", ".join(f"{i} = {h:#x}" for i, h in enumerate(result.streams))
    lines = [
        f"{result.source}: device {result.device}, {result.entries} trace entries",
        f"event trace: {result.allocations} allocations, {result.frees} frees "
        f"(at {result.free_action}), streams {streams} -> {output}",
        f"peak live in the trace:   {format_bytes(result.peak_live_bytes)}",
        f"PyTorch peak reserved:    {format_bytes(result.pytorch_peak_reserved_bytes)}"
        f" (at start of recording {format_bytes(result.pytorch_reserved_at_start_bytes)}, "
        f"at snapshot {format_bytes(result.pytorch_reserved_at_end_bytes)})",
    ]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None, stdout: Optional[TextIO] = None,
         stderr: Optional[TextIO] = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = argparse.ArgumentParser(
        prog="torch_snapshot_to_trace.py",
        description="Convert a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) "
                    "into an sdalloc event trace, and report PyTorch's peak reserved bytes.")
    parser.add_argument("snapshot", help="the snapshot pickle (plain or gzip)")
    parser.add_argument("-o", "--output", default="-",
                        help="event trace to write (default '-': standard output)")
    parser.add_argument("--device", type=int, default=None,
                        help="CUDA device index (default: the device with the most entries)")
    parser.add_argument("--free-at", choices=FREE_AT_CHOICES, default="auto",
                        help="which PyTorch event frees an allocation (default auto: "
                             "free_completed when the history has it)")
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary text")
    args = parser.parse_args(argv)

    to_stdout = args.output == "-"
    report = stderr if to_stdout else stdout
    try:
        snapshot = load_snapshot(args.snapshot)
        result = convert(snapshot, source=args.snapshot, device=args.device,
                         free_at=args.free_at)
        text = result.trace_csv()
        if to_stdout:
            stdout.write(text)
        else:
            with open(args.output, "w", encoding="ascii", newline="\n") as f:
                f.write(text)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result.summary(), f, indent=2)
                f.write("\n")
    except SnapshotError as error:
        stderr.write(f"{args.snapshot}: error: {error}\n")
        return 1
    except OSError as error:
        stderr.write(f"error: cannot write {error.filename}: {error.strerror}\n")
        return 1
    except Exception as error:  # a crafted file must end in one line, never a traceback
        stderr.write(f"{args.snapshot}: error: cannot convert ({type(error).__name__}: "
                     f"{_plain(str(error))})\n")
        return 1
    if not args.quiet:
        report.write(summary_text(result, "standard output" if to_stdout else args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
