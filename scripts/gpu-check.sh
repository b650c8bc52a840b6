#!/usr/bin/env bash
# scripts/gpu-check.sh - the check to run when an NVIDIA GPU and PyTorch are at hand: one
# call gives a verdict inside an overall deadline (default 9 minutes), for a device lent 15
# minutes in all (about 4 of them go to the machine's start and the transfers).
#
# Nothing is built here: the libraries and the CUDA test binary come from a bundle made on
# the CI machine (scripts/gpu-bundle.sh -> build/gpu-bundle, carried to the device) or from
# a build tree (--build-dir). Stages, each with a time budget, cut short by the deadline:
#   preflight   torch imports and sees CUDA; the bundle's files exist
#   cuda-tests  sdalloc_cuda_tests; any skipped test fails the check, except those that
#               need two GPUs (and the no-device tests, skipped where a device is present)
#   tensorrt    sdalloc_tensorrt_tests (the IGpuAsyncAllocator forwarder against TensorRT),
#               when the bundle has it (built only where TensorRT's headers were found);
#               otherwise the stage is recorded as skipped with a line saying so
#   contract    scripts/gpu_contract.py install: OOM raises, record_stream, empty_cache,
#               memory_stats, graph capture works or is refused clearly
#   mempool     scripts/gpu_contract.py mempool: a torch.cuda.MemPool served by sdalloc
#   transfer    sdalloc_transfer_gpu_bench: host->device bandwidth (pageable, pinned, the
#               engine) and weight offload step times at 50 % / 25 % budgets; its tables are
#               printed (not run with --cpu-smoke: it needs a GPU)
#   offload     scripts/gpu_workload.py offload (scripts/gpu_offload.py): the SD UNet's step
#               time (fp16, batch 2, 64x64 and 96x96) with all weights on the GPU, the pinned
#               bandwidth, and the weights in host memory offloaded through
#               sdalloc.torch.offload(device="cuda") at 50 % and 25 % budgets; a row each
#               with the floor max(T, X/BW) beside it, and the bars (step <= 1.10 x floor;
#               96x96 at 50 % <= 1.15 x all-on-GPU) as PASS/FAIL (with --cpu-smoke: the small
#               UNet on the simulated device, not judged)
#   run:CONFIG  scripts/gpu_workload.py run, one fresh process per configuration (SD 1.5
#               UNet, fp16, batch 2, 64x64 and 96x96 latents); each row is printed as its
#               run finishes
#   pipeline:CONFIG  scripts/gpu_pipeline.py run, one fresh process per configuration but
#               sdalloc-async: the whole SD 1.5 pipeline (text encoder, 10 guided UNet
#               steps, VAE decode; fp16) under an 8 GiB cap, a warm-up call and a server's
#               mixed sizes (512, 768, 640, 1024, 512 px), then the largest image that
#               completes (bisection, bounded by the stage's time); each row is printed as
#               its run finishes (with --cpu-smoke: the small pipeline on the CPU, no cap)
#   table       the tables, the bars, the outputs against native's, the VERDICT line
# Any line of the shim's stderr reports ("sdalloc_torch: ...") in a stage's output fails that
# stage. Output: DIR/gpu-check.json (everything: stages, contract checks, runs, bars,
# verdict) and DIR/gpu-check.log (every stage's output), nothing else.
#
# Usage: scripts/gpu-check.sh [--out DIR] [--bundle DIR | --build-dir DIR] [--configs LIST]
#                             [--iterations N] [--deadline S] [--strict] [--dry-run]
#                             [--cpu-smoke]
#   --out DIR       where gpu-check.json and gpu-check.log go (default: a new temporary dir)
#   --bundle DIR    scripts/gpu-bundle.sh's output: DIR/lib (the libraries), DIR/bin
#                   (sdalloc_cuda_tests, sdalloc_transfer_gpu_bench) (default: build/gpu-bundle)
#   --build-dir DIR a build tree instead (DIR/src, DIR/tests/cuda/sdalloc_cuda_tests)
#   --configs LIST  comma-separated subset of: native,expandable,async,sdalloc-vmm (sdalloc's
#                   default: install() with no mode),sdalloc-pool,sdalloc-async,
#                   sdalloc-planned (default: all; the pipeline runs each but sdalloc-async)
#   --iterations N  timed iterations per shape (default 20)
#   --deadline S    overall deadline in seconds (default 540)
#   --strict        a missed memory or time bar fails the verdict too
#   --dry-run       print every stage with its time budget and the total, run nothing
#   --cpu-smoke     no GPU: the contract's CPU-possible parts (gpu_contract.py host) and the
#                   small workload on the CPU for each configuration; libraries from
#                   --build-dir if given, else SDALLOC_LIBRARY_DIR or the package's search
# Environment: PYTHON (default python3) - the interpreter that has torch.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
out_dir=""
bundle=""
build_dir=""
dry_run=0
cpu_smoke=0
strict=0
iterations=20
deadline=540
configs="native,expandable,async,sdalloc-vmm,sdalloc-pool,sdalloc-async,sdalloc-planned"
pipeline_configs=" native expandable async sdalloc-vmm sdalloc-pool sdalloc-planned "

# Budgets in seconds; with every configuration they sum to 538 (<= the 540 s deadline).
# Measured on an H200 (2026-12-04): a fresh machine's first torch import and CUDA start took
# more than 8 s; each run stage 7-9 s; the whole check 100 s. The pipeline stages are not
# measured yet: each stops probing for the largest image 5 s before its budget.
budget_preflight=30
budget_cuda_tests=41
budget_tensorrt=3  # a skip line where the bundle has no TensorRT check
budget_contract=40
budget_mempool=20
budget_transfer=14
budget_offload=36  # torch start, model, 2 latents x (all on GPU + 2 budgets), 1.7 GB packed twice
budget_run=22  # per configuration (each took 7-9 s on the H200)
budget_pipeline=32  # per configuration: start, models, 6 calls, <= 8 probes
budget_table=8
device_time=900  # what a lent device gives a session, all tries together
device_overhead=240  # its start and the transfers: about 4 minutes are allowed for them

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu-check: FAILED: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out_dir=$2; shift 2 ;;
    --bundle) [[ $# -ge 2 ]] || die "--bundle needs a directory"; bundle=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || die "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    --configs) [[ $# -ge 2 ]] || die "--configs needs a list"; configs=$2; shift 2 ;;
    --iterations)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--iterations needs a positive integer"
      iterations=$2; shift 2 ;;
    --deadline)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--deadline needs a positive integer"
      deadline=$2; shift 2 ;;
    --strict) strict=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --cpu-smoke) cpu_smoke=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -z $bundle || -z $build_dir ]] || die "--bundle and --build-dir exclude each other"

known=" native expandable async sdalloc-vmm sdalloc-pool sdalloc-async sdalloc-planned "
IFS=',' read -r -a config_list <<< "$configs"
[[ ${#config_list[@]} -gt 0 ]] || die "--configs is empty"
for c in "${config_list[@]}"; do
  [[ $c != sdalloc-chunked ]] || die "sdalloc-chunked is retired (segments:chunked, 0.2):" \
    "sdalloc's default, sdalloc-vmm, maps CUDA's virtual memory page by page"
  [[ $known == *" $c "* ]] || die "unknown configuration '$c' (known:$known)"
done

# --- where the libraries and the test binary are ------------------------------------------
libs="" cuda_tests="" transfer_bench="" tensorrt_tests=""
if [[ -n $build_dir ]]; then
  libs="$build_dir/src" cuda_tests="$build_dir/tests/cuda/sdalloc_cuda_tests"
  transfer_bench="$build_dir/tests/cuda/sdalloc_transfer_gpu_bench"
  tensorrt_tests="$build_dir/tests/tensorrt/sdalloc_tensorrt_tests"
elif [[ $cpu_smoke == 0 ]]; then
  bundle=${bundle:-$root/build/gpu-bundle}
  libs="$bundle/lib" cuda_tests="$bundle/bin/sdalloc_cuda_tests"
  transfer_bench="$bundle/bin/sdalloc_transfer_gpu_bench"
  tensorrt_tests="$bundle/bin/sdalloc_tensorrt_tests"
fi
[[ -n $libs ]] && export SDALLOC_LIBRARY_DIR="$libs"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"

# --- the stage list with budgets ------------------------------------------------------------
stages=(preflight)
[[ $cpu_smoke == 0 ]] && stages+=(cuda-tests tensorrt)
stages+=(contract)
[[ $cpu_smoke == 0 ]] && stages+=(mempool transfer)
stages+=(offload)
for c in "${config_list[@]}"; do stages+=("run:$c"); done
for c in "${config_list[@]}"; do
  [[ $pipeline_configs == *" $c "* ]] && stages+=("pipeline:$c")
done
stages+=(table)
budget_of() {
  case $1 in
    preflight) echo $budget_preflight ;; cuda-tests) echo $budget_cuda_tests ;;
    tensorrt) echo $budget_tensorrt ;;
    contract) echo $budget_contract ;; mempool) echo $budget_mempool ;;
    transfer) echo $budget_transfer ;; offload) echo $budget_offload ;;
    table) echo $budget_table ;; run:*) echo $budget_run ;;
    pipeline:*) echo $budget_pipeline ;;
  esac
}
total=0
for s in "${stages[@]}"; do total=$((total + $(budget_of "$s"))); done

if [[ $dry_run == 1 ]]; then
  smoke_note=""
  [[ $cpu_smoke == 1 ]] && smoke_note=" (--cpu-smoke)"
  echo "gpu-check: dry run$smoke_note; deadline $deadline s; libraries: ${libs:-sdalloc package search}"
  for s in "${stages[@]}"; do
    printf 'stage %-26s budget %3d s\n' "$s" "$(budget_of "$s")"
  done
  echo "gpu-check: total budget $total s of the $deadline s deadline"
  # A lent device has 15 minutes in all; its start and the transfers take about 4.
  echo "gpu-check: on a lent device: ~$device_overhead s start and transfers + the $deadline s" \
    "deadline = $((device_overhead + deadline)) s of its $device_time s"
  [[ -n $out_dir ]] && echo "gpu-check: would write $out_dir/gpu-check.json and $out_dir/gpu-check.log"
  [[ $total -le $deadline ]] || die "the budgets ($total s) exceed the deadline ($deadline s)"
  exit 0
fi

[[ -n $out_dir ]] || out_dir=$(mktemp -d "${TMPDIR:-/tmp}/sdalloc-gpu-check.XXXXXX")
mkdir -p "$out_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/sdalloc-gpu-check-work.XXXXXX")  # not carried back
trap 'rm -rf "$work"' EXIT
log="$out_dir/gpu-check.log"
: > "$log"
: > "$work/stages.tsv"
start=$SECONDS
echo "gpu-check: deadline $deadline s; log $log; libraries: ${SDALLOC_LIBRARY_DIR:-sdalloc package search}"

# record NAME STATUS DETAIL: one stage's line in the TSV and on stdout.
record() {
  local seconds=$((SECONDS - stage_start))
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$seconds" "${3//$'\t'/ }" >> "$work/stages.tsv"
  # A run's row says how it went; its stage line is printed only when it failed.
  [[ ($1 == run:* || $1 == pipeline:*) && $2 == ok ]] && return 0
  printf 'gpu-check: stage %-26s %-7s %4d s  %s\n' "$1" "$2" "$seconds" "$3"
}

# stage NAME CMD...: runs CMD within min(budget, time left before the table), its output
# into the log; records ok / FAILED (exit status, timeout, or a "sdalloc_torch:" line).
stage() {
  local name=$1; shift
  stage_start=$SECONDS
  local left=$((deadline - (SECONDS - start) - budget_table))
  local limit
  limit=$(budget_of "$name")
  [[ $left -lt $limit ]] && limit=$left
  if [[ $limit -lt 5 ]]; then
    record "$name" FAILED "not run: the overall deadline ($deadline s) is reached"
    return 0
  fi
  local stage_log="$work/stage.log" rc=0
  # Through bash -c: `timeout` runs programs, and some stages are this script's functions.
  timeout -k 5 "$limit" bash -c '"$@"' stage "$@" > "$stage_log" 2>&1 || rc=$?
  { echo "==== $name (limit $limit s, exit $rc) ===="; cat "$stage_log"; } >> "$log"
  local reported
  reported=$(grep -m1 '^sdalloc_torch: ' "$stage_log" || true)
  if [[ $rc == 124 || $rc == 137 ]]; then
    record "$name" FAILED "timed out after $limit s"
  elif [[ $rc != 0 ]]; then
    record "$name" FAILED "exit $rc: $(grep -v '^\s*$' "$stage_log" | tail -n 1 | cut -c1-160)"
  elif [[ -n $reported ]]; then
    record "$name" FAILED "error line: ${reported:0:160}"
  else
    record "$name" ok "${stage_detail:-}"
  fi
  stage_detail=""
}

preflight() {
  if [[ $cpu_smoke == 1 ]]; then
    "$python" -c 'import torch; print("torch", torch.__version__)' || return 1
  else
    "$python" -c 'import sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else "torch.cuda.is_available() is False")' || return 1
    [[ -x $cuda_tests ]] || { echo "no CUDA test binary at $cuda_tests (make the bundle on" \
      "the CI machine: scripts/gpu-bundle.sh)"; return 1; }
    [[ -f $libs/libsdalloc_torch.so || -f $libs/torch_shim/libsdalloc_torch.so ]] ||
      { echo "no libsdalloc_torch.so under $libs"; return 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  fi
}

# The CUDA tests; a skipped test fails unless its reason is that it needs two GPUs.
cuda_tests_stage() {
  "$cuda_tests" > "$work/cuda-tests.txt" 2>&1 || { cat "$work/cuda-tests.txt"; return 1; }
  cat "$work/cuda-tests.txt"
  "$python" - "$work/cuda-tests.txt" <<'EOF'
import re, sys
lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
bad, since_run = [], []
for line in lines:
    if line.startswith("[ RUN      ]"):
        since_run = []
    elif line.startswith("[  SKIPPED ]") and "(" in line:
        reason = " ".join(since_run)
        if not re.search(r"two (CUDA )?(GPUs|devices)|second (GPU|device)|2 GPUs|"
                         r"a CUDA device is present here", reason, re.I):
            bad.append(f"{line[13:].split(' (')[0]}: {reason[:120]}")
    else:
        since_run.append(line.strip())
if bad:
    print("skipped CUDA tests (only those needing two GPUs may skip):", "; ".join(bad))
    sys.exit(1)
print("no test skipped but those needing two GPUs")
EOF
}

# The transfer engine's tables; a missed bar fails the stage only with --strict.
transfer_stage() {
  [[ -x $transfer_bench ]] || { echo "no transfer bench at $transfer_bench (make the bundle" \
    "on the CI machine: scripts/gpu-bundle.sh)"; return 1; }
  local args=()
  [[ $strict == 1 ]] && args+=(--strict)
  "$transfer_bench" "${args[@]}" | tee "$work/transfer.txt"
}

export -f preflight cuda_tests_stage transfer_stage
export python cpu_smoke cuda_tests transfer_bench strict libs work
smoke=()
[[ $cpu_smoke == 1 ]] && smoke=(--cpu-smoke --iterations 1 --warmup 1)
[[ $cpu_smoke == 1 ]] || smoke=(--iterations "$iterations")

stage preflight preflight
if [[ $cpu_smoke == 0 ]]; then
  stage cuda-tests cuda_tests_stage
  if [[ -x $tensorrt_tests ]]; then
    stage tensorrt "$tensorrt_tests"
  else
    stage_start=$SECONDS
    note="TensorRT was not found where the bundle was built (no $tensorrt_tests):"
    record tensorrt skipped "$note the IGpuAsyncAllocator forwarder is untested against TensorRT"
  fi
  stage contract "$python" "$root/scripts/gpu_contract.py" install --out "$work/contract.json"
else
  stage contract "$python" "$root/scripts/gpu_contract.py" host --out "$work/contract.json"
fi
grep '^gpu_contract: ' "$log" || true
contracts=("$work/contract.json")
if [[ $cpu_smoke == 0 ]]; then
  stage mempool "$python" "$root/scripts/gpu_contract.py" mempool --out "$work/mempool.json"
  grep '^gpu_contract: mempool' "$log" || true
  contracts+=("$work/mempool.json")
  stage transfer transfer_stage
  [[ -s $work/transfer.txt ]] && cat "$work/transfer.txt"
fi
offload_args=(--out "$work/offload.json")
[[ $cpu_smoke == 1 ]] && offload_args+=(--cpu-smoke --iterations 1 --warmup 2)
stage offload "$python" "$root/scripts/gpu_workload.py" offload "${offload_args[@]}"
[[ -s $work/offload.json ]] || printf '{"error": "no result (see gpu-check.log)"}\n' \
  > "$work/offload.json"
PYTHONPATH="$root/scripts:$PYTHONPATH" "$python" -c 'import sys, gpu_offload as o
print(o.format_offload(o.load_offload(sys.argv[1])))' "$work/offload.json"

"$python" "$root/scripts/gpu_workload.py" row --header
results=()
for c in "${config_list[@]}"; do
  result="$work/$c.json"
  results+=("$result")
  stage "run:$c" "$python" "$root/scripts/gpu_workload.py" run --config "$c" --out "$result" \
    "${smoke[@]}"
  [[ -s $result ]] || printf '{"config": "%s", "error": "no result (see gpu-check.log)"}\n' \
    "$c" > "$result"
  "$python" "$root/scripts/gpu_workload.py" row "$result"
done

pipeline_results=()
pipeline_smoke=()
[[ $cpu_smoke == 1 ]] && pipeline_smoke=(--cpu-smoke)
for c in "${config_list[@]}"; do
  [[ $pipeline_configs == *" $c "* ]] || continue
  if [[ ${#pipeline_results[@]} == 0 ]]; then
    echo
    "$python" "$root/scripts/gpu_pipeline.py" row --header
  fi
  result="$work/pipeline-$c.json"
  pipeline_results+=("$result")
  # The run stops starting probes 5 s before the stage's limit (its budget, or less when the
  # deadline is near), so it writes its result before the stage is cut.
  left=$((deadline - (SECONDS - start) - budget_table))
  [[ $left -lt $budget_pipeline ]] || left=$budget_pipeline
  time_limit=$((left > 10 ? left - 5 : 5))
  stage "pipeline:$c" "$python" "$root/scripts/gpu_pipeline.py" run --config "$c" \
    --out "$result" --time-limit "$time_limit" "${pipeline_smoke[@]}"
  [[ -s $result ]] || printf '{"config": "%s", "error": "no result (see gpu-check.log)"}\n' \
    "$c" > "$result"
  "$python" "$root/scripts/gpu_pipeline.py" row "$result"
done

stage_start=$SECONDS
table_args=(--json "$out_dir/gpu-check.json" --stages "$work/stages.tsv")
for f in "${pipeline_results[@]}"; do table_args+=(--pipeline "$f"); done
table_args+=(--offload "$work/offload.json")
for f in "${contracts[@]}"; do table_args+=(--contract "$f"); done
[[ $strict == 1 ]] && table_args+=(--strict)
echo
echo "==== gpu-check: results ($((SECONDS - start)) s) ===="
status=0
"$python" "$root/scripts/gpu_workload.py" table "${results[@]}" "${table_args[@]}" 2>&1 |
  tee -a "$log" || status=${PIPESTATUS[0]}
echo "gpu-check: wrote $out_dir/gpu-check.json and $log in $((SECONDS - start)) s"
exit "$status"
