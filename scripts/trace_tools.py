#!/usr/bin/python3
"""scripts/trace_tools.py - small edits on event traces (docs/formats.md), for the policy sweep.

    trace_tools.py clean IN -o OUT      drop every allocation never freed or live for more than a
                                        third of the trace (a recorded process's weights, freed at
                                        exit); ids renumbered 0,1,2,...
    trace_tools.py concat A B ... -o OUT  the traces back to back, ids renumbered so they stay
                                        unique (a shape-change sequence: UNet then VAE, or one
                                        resolution after another)
    trace_tools.py weights IN --bytes B [--steps N] -o OUT
                                        a model's weights around a loop: at least B bytes in
                                        tensors of UNet-like parameter sizes allocated first,
                                        then IN N times (default 4), then the weights freed - the
                                        stream never empties, as in a process that holds its model
    trace_tools.py stats IN [-o JSON]   allocations, peak live, total allocated, size histogram

Invariants: the output is a valid trace (header op,id,size[,stream]; ids unique, never reused;
a free repeats its allocation's size); every input event is checked as it is read, and a bad
one is an error naming the file and line. Standard library only.
"""

import argparse
import gzip
import json
import sys


def read_events(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="ascii") as f:
        header = f.readline().strip()
        if header not in ("op,id,size", "op,id,size,stream"):
            raise SystemExit(f"{path}:1: not an event trace header: {header!r}")
        live = {}
        for n, line in enumerate(f, start=2):
            fields = line.strip().split(",")
            if fields == [""]:
                continue
            if len(fields) not in (3, 4) or fields[0] not in ("a", "f"):
                raise SystemExit(f"{path}:{n}: bad event {line.strip()!r}")
            op, ident, size = fields[0], int(fields[1]), int(fields[2])
            stream = int(fields[3]) if len(fields) == 4 else 0
            if op == "a":
                if ident in live:
                    raise SystemExit(f"{path}:{n}: id {ident} allocated twice")
                live[ident] = size
            else:
                if live.pop(ident, None) != size:
                    raise SystemExit(f"{path}:{n}: free of {ident} not live with size {size}")
            yield op, ident, size, stream


def write_events(events, out):
    streams = any(e[3] != 0 for e in events)
    out.write("op,id,size,stream\n" if streams else "op,id,size\n")
    for op, ident, size, stream in events:
        out.write(f"{op},{ident},{size},{stream}\n" if streams else f"{op},{ident},{size}\n")


def renumbered(events, first_id):
    ids = {}
    result = []
    for op, ident, size, stream in events:
        if op == "a":
            ids[ident] = first_id + len(ids)
        result.append((op, ids[ident], size, stream))
    return result, first_id + len(ids)


def clean(path):
    """Drops what a recorded process holds for most of its life: allocations never freed, and
    those live for more than a third of the trace's events (the weights, built first and freed at
    exit). What is left is the work's own activations and temporaries."""
    events = list(read_events(path))
    born, span = {}, {}
    for i, (op, ident, _, _) in enumerate(events):
        if op == "a":
            born[ident] = i
        else:
            span[ident] = i - born[ident]
    kept = {ident for ident, length in span.items() if 3 * length <= len(events)}
    return renumbered([e for e in events if e[1] in kept], 0)[0]


def concat(paths):
    result, next_id = [], 0
    for path in paths:
        part, next_id = renumbered(list(read_events(path)), next_id)
        result.extend(part)
    return result


# float32 parameter sizes of an SD-style UNet (convolutions 3x3 and 1x1, attention and
# linear projections, norms and biases), taken in turn: the weights are deterministic.
WEIGHT_SIZES = [320 * 4, 320 * 320 * 9 * 4, 640 * 4, 640 * 640 * 4, 1280 * 1280 * 9 * 4,
                320 * 768 * 4, 1280 * 4, 1280 * 768 * 4, 640 * 320 * 9 * 4, 2560 * 4,
                640 * 640 * 9 * 4, 1280 * 1280 * 4, 640 * 768 * 4, 320 * 320 * 4]


def weights(path, total_bytes, steps):
    """The weights (at least total_bytes, live throughout), then the trace `steps` times."""
    if total_bytes <= 0 or steps <= 0:
        raise SystemExit("weights: --bytes and --steps must be positive")
    step = list(read_events(path))
    result, next_id, size_sum, held = [], 0, 0, []
    while size_sum < total_bytes:
        size = WEIGHT_SIZES[len(held) % len(WEIGHT_SIZES)]
        held.append((next_id, size))
        result.append(("a", next_id, size, 0))
        next_id += 1
        size_sum += size
    for _ in range(steps):
        part, next_id = renumbered(step, next_id)
        result.extend(part)
    result.extend(("f", ident, size, 0) for ident, size in held)
    return result


def stats(events):
    live = peak = total = allocs = 0
    buckets = {"lt_4KiB": 0, "4KiB_1MiB": 0, "1MiB_64MiB": 0, "ge_64MiB": 0}
    for op, _, size, _ in events:
        if op == "a":
            allocs += 1
            total += size
            live += size
            peak = max(peak, live)
            key = ("lt_4KiB" if size < 4096 else "4KiB_1MiB" if size < 1 << 20
                   else "1MiB_64MiB" if size < 64 << 20 else "ge_64MiB")
            buckets[key] += 1
        else:
            live -= size
    return {"allocations": allocs, "events": 2 * allocs if live == 0 else None,
            "peak_live_bytes": peak, "total_allocated_bytes": total, "live_at_end_bytes": live,
            "size_histogram": buckets}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("command", choices=["clean", "concat", "weights", "stats"])
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("-o", "--output")
    parser.add_argument("--bytes", type=int, help="weights: bytes of weights (at least)")
    parser.add_argument("--steps", type=int, default=4, help="weights: times the trace runs")
    args = parser.parse_args(argv)
    if args.command != "concat" and len(args.inputs) != 1:
        parser.error(f"{args.command} takes one input")
    if args.command == "stats":
        text = json.dumps(stats(list(read_events(args.inputs[0]))), indent=1) + "\n"
        if args.output:
            with open(args.output, "w", encoding="ascii") as out:
                out.write(text)
        else:
            sys.stdout.write(text)
        return 0
    if not args.output:
        parser.error(f"{args.command} needs -o OUT")
    if args.command == "weights":
        if args.bytes is None:
            parser.error("weights needs --bytes B")
        events = weights(args.inputs[0], args.bytes, args.steps)
    elif args.command == "clean":
        events = clean(args.inputs[0])
    else:
        events = concat(args.inputs)
    with open(args.output, "w", encoding="ascii") as out:
        write_events(events, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
