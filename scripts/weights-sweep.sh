#!/bin/bash
# scripts/weights-sweep.sh - the pool on every trace with a model's weights under the work.
#
#   scripts/weights-sweep.sh [-b BYTES] [-s STEPS] [TRACE...]
#
# A process that serves its weights from the pool (the PyTorch shim on a GPU, the CPU
# drop-in, an ONNX Runtime session's initializers) never empties its stream, so the pool
# must consolidate at the floor the weights make (docs/notebook/caching_pool.md, "Consolidation
# around weights"). The traces of data/traces/ hold activations only; this script puts each
# under weights (`scripts/trace_tools.py weights`: BYTES of weights, default SD 1.5's fp32
# UNet, 3438083856 B, and half that for the traces recorded in fp16 on a GPU, gpu_*; the
# trace run STEPS times, default 4) and replays it once through the segment cache (pool: it
# takes whole segments, on a GPU as here) and through vmm as on a GPU (`--device-like`: 2 MiB
# pages that are unmapped and mapped, never moved). One row per trace: x live (peak reserved /
# peak live, the weights counted); for pool the segments taken and released over the steps
# (the weights take about 250) and its consolidations; for vmm the pages mapped and unmapped.
# A pool that consolidates takes a few segments after the weights and the same number over
# twice the steps; one that churns takes hundreds every step, as the GPU check found on an
# H200 (2026-12-04: 2720 cudaMalloc+cudaFree in 20 steps).
# Needs build/release/tools/sdalloc (SDALLOC_CLI overrides) and /usr/bin/python3; the
# composed traces and the JSON of every run are kept under $SWEEP_DIR (default a temporary
# directory, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${SDALLOC_CLI:-build/release/tools/sdalloc}
bytes=3438083856
steps=4
while getopts "b:s:" opt; do
  case $opt in
    b) bytes=$OPTARG ;;
    s) steps=$OPTARG ;;
    *) echo "usage: $0 [-b BYTES] [-s STEPS] [TRACE...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $bytes =~ ^[1-9][0-9]*$ ]] || { echo "$0: -b needs a positive byte count" >&2; exit 2; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "$0: -s needs a positive step count" >&2; exit 2; }
if [ $# -eq 0 ]; then set -- data/traces/*.csv data/traces/*.csv.gz; fi
[ -x "$cli" ] || { echo "$0: $cli not built" >&2; exit 1; }
dir=${SWEEP_DIR:-$(mktemp -d /tmp/weights-sweep.XXXXXX)}
mkdir -p "$dir"
n=0
for trace in "$@"; do
  n=$((n + 1))
  name=$(basename "$trace")
  name=${name%.gz}
  name=${name%.csv}
  weights=$bytes
  [[ $name == gpu_* ]] && weights=$((bytes / 2))
  echo "weights-sweep: $n/$#: $name" >&2
  /usr/bin/python3 scripts/trace_tools.py weights "$trace" --bytes "$weights" --steps "$steps" \
    -o "$dir/$name.csv"
  "$cli" replay -q -n 1 -a pool,vmm --device-like --json "$dir/$name.json" "$dir/$name.csv" \
    > /dev/null
done
/usr/bin/python3 - "$dir" "$@" <<'EOF'
import json, os, re, sys
out_dir, traces = sys.argv[1], sys.argv[2:]
def number(pattern, counters, missing="-"):
    m = re.search(pattern, counters or "")
    return m.group(1) if m else missing
def cells(path):
    by_name = {r["allocator"]: r for r in json.load(open(path))["results"]}
    pool, vmm = by_name["pool"], by_name["vmm"]
    return [f"{pool['ratio']:.3f}", number(r"segments \+(\d+)", pool.get("counters")),
            number(r"segments \+\d+ -(\d+)", pool.get("counters")),
            number(r"consolidated (\d+)", pool.get("counters"), "0"),
            f"{vmm['ratio']:.3f}", number(r"maps (\d+)", vmm.get("counters")),
            number(r"unmaps (\d+)", vmm.get("counters"))]
print("| trace | pool x live | taken | released | consolidations | vmm x live | maps | "
      "unmaps |")
print("|---|---|---|---|---|---|---|---|")
for trace in traces:
    name = re.sub(r"\.csv(\.gz)?$", "", os.path.basename(trace))
    row = [name] + cells(os.path.join(out_dir, name + ".json"))
    print("| " + " | ".join(row) + " |")
print(f"\n{len(traces)} traces under weights, one replay each; composed traces and JSON in {out_dir}")
EOF
