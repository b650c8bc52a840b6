"""ONNX's backend node tests (Debian's libonnx-testdata) through ONNX Runtime on sdalloc.

Each node test is a folder with model.onnx and test_data_set_0/{input,output}_<i>.pb
(TensorProto, SequenceProto or OptionalProto). This module reads them with Debian's
python3-onnx, writes the inputs as value files (tests/peers/onnx_value_file.hpp), runs the
driver sdalloc_peers_onnx once per configuration (ORT's defaults, then sdalloc's pool, vmm and
planned), and compares:
  - a case counts when ORT with its defaults runs it and its outputs are within ONNX's
    tolerance of the expected ones (the checks of onnx.backend.test's runner: same dtype,
    numpy's assert_allclose with rtol 1e-3 and atol 1e-7, strings equal);
  - every counted case must then give, in each sdalloc mode, the same output files byte for
    byte as ORT's defaults (and its later runs the same as its first: the driver checks).
A driver process that dies is restarted after the case it died in, which is that mode's
difference ("crashed").
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct
import subprocess
import time

DATA_ROOT = pathlib.Path("/usr/share/libonnx-testdata/data")
RTOL, ATOL = 1e-3, 1e-7
SDALLOC_MODES = ("pool", "vmm", "planned")

# TensorProto.DataType -> numpy dtype name (BFLOAT16: its bits, as uint16; STRING: None).
_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
           8: None, 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
           14: "complex64", 15: "complex128", 16: "uint16"}
BFLOAT16, STRING, UINT16 = 16, 8, 4


class Unsupported(Exception):
    """A case the driver cannot feed (said why); it is counted apart, in every mode alike."""


# --- value files ----------------------------------------------------------------------------

def _encode_tensor(elem_type: int, array) -> bytes:
    import numpy as np
    if elem_type not in _DTYPES:
        raise Unsupported(f"element type {elem_type}")
    dims = list(array.shape)
    head = struct.pack("<iI", elem_type, len(dims)) + struct.pack(f"<{len(dims)}q", *dims)
    if elem_type == STRING:
        body = b""
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            body += struct.pack("<Q", len(raw)) + raw
        return head + body
    if elem_type == BFLOAT16:  # python3-onnx gives bfloat16 as float32: keep its upper half
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16
        return head + bits.astype("<u2").tobytes()
    return head + np.ascontiguousarray(array, dtype=np.dtype(_DTYPES[elem_type])).tobytes()


def encode_value(kind: str, tensors) -> bytes:
    """kind 'T' (one (elem_type, array)), 'S' (a list of them) or 'N' (an empty optional)."""
    out = b"SDPV" + struct.pack("<I", 1) + kind.encode()
    if kind == "S":
        out += struct.pack("<I", len(tensors))
    for elem_type, array in tensors:
        out += _encode_tensor(elem_type, array)
    return out


def decode_value(data: bytes):
    """(kind, [(elem_type, numpy array)]) of a value file's bytes; bfloat16 as float32."""
    import numpy as np
    if data[:4] != b"SDPV" or struct.unpack_from("<I", data, 4)[0] != 1:
        raise ValueError("not a version-1 value file")
    kind, at = chr(data[8]), 9
    count = 0 if kind == "N" else 1
    if kind == "S":
        count, at = struct.unpack_from("<I", data, at)[0], at + 4
    tensors = []
    for _ in range(count):
        elem_type, rank = struct.unpack_from("<iI", data, at)
        at += 8
        dims = list(struct.unpack_from(f"<{rank}q", data, at))
        at += 8 * rank
        n = int(np.prod(dims)) if dims else 1
        if elem_type == STRING:
            items = []
            for _ in range(n):
                length = struct.unpack_from("<Q", data, at)[0]
                items.append(data[at + 8:at + 8 + length])
                at += 8 + length
            tensors.append((elem_type, np.array(items, dtype=object).reshape(dims)))
            continue
        dtype = np.dtype(_DTYPES[elem_type]).newbyteorder("<")
        array = np.frombuffer(data, dtype=dtype, count=n, offset=at).reshape(dims)
        at += n * dtype.itemsize
        if elem_type == BFLOAT16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors.append((elem_type, array))
    if at != len(data):
        raise ValueError("trailing bytes")
    return kind, tensors


# --- reading a node test ----------------------------------------------------------------------

def _proto_value(path: pathlib.Path, type_proto):
    """(kind, tensors) of one .pb file, read as the graph's TypeProto says it is."""
    import onnx
    from onnx import numpy_helper
    data = path.read_bytes()
    which = type_proto.WhichOneof("value")
    if which == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        if opt.elem_type == onnx.OptionalProto.UNDEFINED:
            return "N", []
        if opt.elem_type == onnx.OptionalProto.TENSOR:
            t = opt.tensor_value
            return "T", [(t.data_type, numpy_helper.to_array(t))]
        if opt.elem_type == onnx.OptionalProto.SEQUENCE:
            seq = opt.sequence_value
            return "S", [(t.data_type, numpy_helper.to_array(t)) for t in seq.tensor_values]
        raise Unsupported(f"{path.name}: an optional of element type {opt.elem_type}")
    if which == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        if seq.elem_type != onnx.SequenceProto.TENSOR:
            raise Unsupported(f"{path.name}: a sequence of non-tensors")
        return "S", [(t.data_type, numpy_helper.to_array(t)) for t in seq.tensor_values]
    if which == "tensor_type":
        t = onnx.TensorProto()
        t.ParseFromString(data)
        array = numpy_helper.to_array(t)
        if type_proto.tensor_type.elem_type == BFLOAT16 and t.data_type == UINT16:
            # ONNX 1.12's generator stored bfloat16 data as uint16 (numpy has no bfloat16);
            # the bits are the graph's bfloat16 values, which is what ORT must be fed.
            return "T", [(BFLOAT16, (array.astype("uint32") << 16).view("float32"))]
        return "T", [(t.data_type, array)]
    raise Unsupported(f"{path.name}: a {which}")


def _numbered(folder: pathlib.Path, prefix: str):
    files = [p for p in folder.glob(f"{prefix}_*.pb")]
    return sorted(files, key=lambda p: int(p.stem.split("_")[-1]))


@dataclasses.dataclass
class Case:
    name: str
    model: pathlib.Path
    inputs: list          # (graph input name, value file path)
    outputs: list         # graph output names
    expected: list        # (kind, tensors) per output


def prepare_case(folder: pathlib.Path, work: pathlib.Path) -> Case:
    """Reads one node test and writes its inputs under work/inputs/NAME/."""
    import onnx
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    data_sets = sorted(folder.glob("test_data_set_*"))
    if len(data_sets) != 1:
        raise Unsupported(f"{len(data_sets)} data sets")
    inputs = _numbered(data_sets[0], "input")
    outputs = _numbered(data_sets[0], "output")
    if len(inputs) > len(graph_inputs) or len(outputs) != len(model.graph.output):
        raise Unsupported("inputs or outputs do not match the graph's")
    for v in list(graph_inputs) + list(model.graph.output):
        if any(c in v.name for c in "\t\n"):
            raise Unsupported(f"a name with a tab or newline: {v.name!r}")
    in_dir = work / "inputs" / folder.name
    in_dir.mkdir(parents=True, exist_ok=True)
    feeds = []
    for i, (path, graph_input) in enumerate(zip(inputs, graph_inputs)):
        kind, tensors = _proto_value(path, graph_input.type)
        if kind == "N":
            continue  # an empty optional input is left out, as ONNX's runner gives None
        if kind == "S" and not tensors:
            raise Unsupported(f"{path.name}: an empty sequence (ORT's C API makes none)")
        value_path = in_dir / f"in_{i}.val"
        value_path.write_bytes(encode_value(kind, tensors))
        feeds.append((graph_input.name, value_path))
    expected = [_proto_value(p, o.type) for p, o in zip(outputs, model.graph.output)]
    return Case(folder.name, folder / "model.onnx", feeds, [o.name for o in model.graph.output],
                expected)


def discover(kinds=("node",), only=None):
    """The test folders with a model.onnx (tests that download their model are left out)."""
    folders = []
    for kind in kinds:
        for folder in sorted((DATA_ROOT / kind).iterdir()):
            if (folder / "model.onnx").exists() and (only is None or only(folder.name)):
                folders.append(folder)
    return folders


def write_manifest(cases, path: pathlib.Path):
    lines = []
    for c in cases:
        lines.append(f"case\t{c.name}\t{c.model}")
        lines += [f"in\t{name}\t{value}" for name, value in c.inputs]
        lines += [f"out\t{name}" for name in c.outputs]
    path.write_text("\n".join(lines) + "\n")


# --- comparing ----------------------------------------------------------------------------------

def matches_expected(outputs, expected) -> str | None:
    """None when outputs (decoded value files) match ONNX's expected values, else why not."""
    import numpy as np
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, {len(expected)} expected"
    for i, ((kind, got), (want_kind, want)) in enumerate(zip(outputs, expected)):
        if kind != want_kind or len(got) != len(want):
            return f"output {i}: {kind}[{len(got)}], expected {want_kind}[{len(want)}]"
        for (gt, g), (wt, w) in zip(got, want):
            if gt != wt:
                return f"output {i}: element type {gt}, expected {wt}"
            if g.shape != w.shape:
                return f"output {i}: shape {g.shape}, expected {w.shape}"
            try:
                if wt == STRING:  # python3-onnx reads strings as str, ORT's are UTF-8 bytes
                    text = np.array([b.decode("utf-8", "replace") for b in g.reshape(-1)],
                                    dtype=object).reshape(g.shape)
                    np.testing.assert_array_equal(text, w)
                else:
                    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
            except AssertionError as e:
                return f"output {i}: " + " ".join(str(e).split())[:200]
    return None


def run_driver(driver, mode, cases, work: pathlib.Path, log):
    """Runs every case in one configuration; restarts after a case that kills the process.
    Returns ({case: result line}, seconds)."""
    results, todo, start = {}, list(cases), time.monotonic()
    out = work / mode
    while todo:
        manifest = work / f"cases.{mode}.txt"
        write_manifest(todo, manifest)
        proc = subprocess.run([str(driver), "--mode", mode, "--cases", str(manifest),
                               "--out", str(out)], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            results[r["case"]] = r
        done = {c.name for c in todo if c.name in results}
        remaining = [c for c in todo if c.name not in done]
        if remaining and proc.returncode in (0, 1, 2) and not done:
            raise RuntimeError(f"sdalloc_peers_onnx --mode {mode}: exit {proc.returncode}: "
                               f"{proc.stderr.strip()[-500:]}")
        if remaining:  # the first case without a line is the one that died
            dead = remaining[0]
            results[dead.name] = {"case": dead.name, "status": "crashed", "seconds": 0,
                                  "allocs": 0, "message": f"exit {proc.returncode}: "
                                  + proc.stderr.strip()[-300:]}
            log(f"onnx {mode}: {dead.name} crashed the driver (exit {proc.returncode})")
            remaining = remaining[1:]
        todo = remaining
    return results, time.monotonic() - start


def output_files(work: pathlib.Path, mode: str, case: Case):
    return [work / mode / case.name / f"out_{i}.val" for i in range(len(case.outputs))]


def compare_mode(work: pathlib.Path, mode: str, cases, results) -> list:
    """[(case, why)] for each case whose run in `mode` failed or whose output files are not
    ORT's defaults' byte for byte."""
    diffs = []
    for c in cases:
        r = results[c.name]
        if r["status"] != "ok":
            diffs.append((c.name, f"{r['status']}: {r['message'][:200]}"))
            continue
        for i, (ref, mine) in enumerate(zip(output_files(work, "ort", c),
                                            output_files(work, mode, c))):
            if ref.read_bytes() != mine.read_bytes():
                diffs.append((c.name, f"output {i} ({c.outputs[i]}) differs from ORT's"))
                break
    return diffs


@dataclasses.dataclass
class OnnxOutcome:
    """What the ONNX suite found: the cases ORT's defaults pass, each mode's differences."""
    prepared: int = 0
    unsupported: dict = dataclasses.field(default_factory=dict)   # case -> why
    ort_fails: dict = dataclasses.field(default_factory=dict)     # case -> ORT's error or why
    passing: list = dataclasses.field(default_factory=list)       # the cases that count
    seconds: dict = dataclasses.field(default_factory=dict)       # mode -> driver seconds
    allocs: dict = dataclasses.field(default_factory=dict)        # mode -> sdalloc allocations
    differences: dict = dataclasses.field(default_factory=dict)   # mode -> [(case, why)]


def run_onnx_suite(driver, work: pathlib.Path, modes=SDALLOC_MODES, kinds=("node",), only=None,
                   log=print) -> OnnxOutcome:
    result = OnnxOutcome()
    cases = []
    for folder in discover(kinds, only):
        try:
            cases.append(prepare_case(folder, work))
        except Unsupported as e:
            result.unsupported[folder.name] = str(e)
    result.prepared = len(cases)
    log(f"onnx {'+'.join(kinds)}: {len(cases)} tests prepared, {len(result.unsupported)} "
        "the driver cannot feed")

    reference, result.seconds["ort"] = run_driver(driver, "ort", cases, work, log)
    for c in cases:
        r = reference[c.name]
        if r["status"] != "ok":
            result.ort_fails[c.name] = f"{r['status']}: {r['message'][:160]}"
            continue
        got = [decode_value(p.read_bytes()) for p in output_files(work, "ort", c)]
        why = matches_expected(got, c.expected)
        if why is not None:
            result.ort_fails[c.name] = "outputs: " + why
            continue
        result.passing.append(c)
    log(f"onnx: ORT's defaults pass {len(result.passing)} of {len(cases)}")

    for mode in modes:
        results, result.seconds[mode] = run_driver(driver, mode, result.passing, work, log)
        diffs = compare_mode(work, mode, result.passing, results)
        result.allocs[mode] = sum(results[c.name].get("allocs", 0) for c in result.passing)
        result.differences[mode] = diffs
        log(f"onnx {mode}: {len(result.passing) - len(diffs)} of {len(result.passing)} equal, "
            f"{result.allocs[mode]} allocations from sdalloc, {result.seconds[mode]:.1f} s")
    return result
