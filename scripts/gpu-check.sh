#!/usr/bin/env bash
# scripts/gpu-check.sh - the check to run whenever an NVIDIA GPU and PyTorch are at hand.
#
#   1. builds sdalloc with CUDA (Release, its own build tree),
#   2. runs the CUDA conformance tests (sdalloc_cuda_tests),
#   3. runs a PyTorch inference workload (scripts/gpu_workload.py: UNet-like model, random
#      weights, fp16, several iterations, two input shapes), each configuration in a fresh
#      process: PyTorch's native allocator, expandable_segments:True, backend:cudaMallocAsync,
#      and sdalloc in each of its modes (sdalloc-planned: each iteration one step of the
#      planned pool; the table notes where its allocations were served),
#   4. prints one table (peak reserved, peak allocated, time per iteration) and the verdicts
#      of the bars (sdalloc below native, <= expandable, <= 1.05 x its time).
# Designed to finish in under 8 minutes on one H200-class GPU; every step has a timeout and
# prints a clear FAILED line naming the step when it fails.
#
# Usage: scripts/gpu-check.sh [--out DIR] [--build-dir DIR] [--skip-build] [--configs LIST]
#                             [--iterations N] [--strict] [--dry-run] [--cpu-smoke]
#   --out DIR       also write the table as JSON (DIR/gpu-check.json) and keep the per-run
#                   results and logs in DIR
#   --build-dir DIR build tree (default: build/gpu-check)
#   --skip-build    use the build tree as it is (its libraries must exist)
#   --configs LIST  comma-separated subset of: native,expandable,async,sdalloc-pool,
#                   sdalloc-async,sdalloc-vmm,sdalloc-planned (default: all)
#   --iterations N  timed iterations per configuration (default 6, after 2 warm-up ones)
#   --strict        exit 1 when a bar is missed (a failed step always exits 1)
#   --dry-run       print the steps that would run, run nothing
#   --cpu-smoke     no build, no GPU: run the workload's tiny CPU version for each
#                   configuration and print the table (checks this script end to end);
#                   sdalloc-planned then steps a host pool of libsdalloc_torch.so, found
#                   through --build-dir if given, else SDALLOC_LIBRARY_DIR or the package's
#                   default search (the source tree's build*/ directories)
# Environment: PYTHON (default python3) - the interpreter that has torch;
#              SDALLOC_GPU_CHECK_RUN_TIMEOUT (default 150) - seconds per workload run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
out_dir=""
build_dir="$root/build/gpu-check"
build_dir_given=0
skip_build=0
dry_run=0
cpu_smoke=0
strict=0
iterations=6
configs="native,expandable,async,sdalloc-pool,sdalloc-async,sdalloc-vmm,sdalloc-planned"
run_timeout=${SDALLOC_GPU_CHECK_RUN_TIMEOUT:-150}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu-check: FAILED: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out_dir=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || die "--build-dir needs a directory"; build_dir=$2
                 build_dir_given=1; shift 2 ;;
    --configs) [[ $# -ge 2 ]] || die "--configs needs a list"; configs=$2; shift 2 ;;
    --iterations)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--iterations needs a positive integer"
      iterations=$2; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --strict) strict=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --cpu-smoke) cpu_smoke=1; skip_build=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

known=" native expandable async sdalloc-pool sdalloc-async sdalloc-vmm sdalloc-planned "
IFS=',' read -r -a config_list <<< "$configs"
[[ ${#config_list[@]} -gt 0 ]] || die "--configs is empty"
for c in "${config_list[@]}"; do
  [[ $known == *" $c "* ]] || die "unknown configuration '$c' (known:$known)"
done

step() { echo; echo "==== gpu-check: $* ===="; }
# Runs a command, or only prints it with --dry-run.
act() {
  if [[ $dry_run == 1 ]]; then printf 'would run:'; printf ' %q' "$@"; echo; return 0; fi
  "$@"
}

if [[ -n $out_dir ]]; then
  work=$out_dir
elif [[ $dry_run == 1 ]]; then
  work="${TMPDIR:-/tmp}/sdalloc-gpu-check.DRY-RUN"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/sdalloc-gpu-check.XXXXXX")
fi
[[ $dry_run == 1 ]] || mkdir -p "$work"
start=$SECONDS

# --- 0. the interpreter --------------------------------------------------------------------
if [[ $dry_run == 0 ]]; then
  if [[ $cpu_smoke == 1 ]]; then
    "$python" -c 'import torch' 2>/dev/null || die "$python cannot import torch (set PYTHON)"
  else
    "$python" -c 'import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)' ||
      die "$python: torch missing or torch.cuda.is_available() is False (set PYTHON)"
  fi
fi

# --- 1. build ----------------------------------------------------------------------------
if [[ $skip_build == 0 ]]; then
  step "build with CUDA ($build_dir)"
  if [[ $dry_run == 0 ]]; then
    command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
      die "build: no CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)"
    command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  configure=(cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
             -DSDALLOC_WITH_CUDA=ON -DSDALLOC_BUILD_BENCH=OFF -DSDALLOC_BUILD_TOOLS=OFF)
  with_tests=1
  if ! act timeout 300 "${configure[@]}" -DSDALLOC_BUILD_TESTS=ON; then
    # A machine without GoogleTest still gets the workload; the missing tests are reported.
    echo "gpu-check: configure with tests failed; retrying without them (GoogleTest missing?)"
    with_tests=0
    act timeout 300 "${configure[@]}" -DSDALLOC_BUILD_TESTS=OFF ||
      die "build: cmake configure failed (output above)"
  fi
  targets=(sdalloc sdalloc_torch)
  [[ $with_tests == 1 ]] && targets+=(sdalloc_cuda_tests)
  act timeout 400 cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" ||
    die "build: compilation failed (is the CUDA toolkit complete?)"
  if [[ $dry_run == 0 ]]; then
    grep -q 'SDALLOC_TORCH_WITH_CUDA=1' "$build_dir/compile_commands.json" ||
      die "build: libsdalloc_torch.so was built without CUDA (CMake did not find the toolkit)"
  fi

  # --- 2. CUDA conformance tests ---------------------------------------------------------
  step "CUDA conformance tests"
  if [[ $with_tests == 1 ]]; then
    act timeout 300 "$build_dir/tests/cuda/sdalloc_cuda_tests" --gtest_brief=1 ||
      die "CUDA conformance tests failed (output above)"
  else
    echo "gpu-check: SKIPPED: CUDA conformance tests (the build has no tests: see above)"
    tests_skipped=1
  fi
fi

# --- 3. the workload under each allocator --------------------------------------------------
step "PyTorch workload: ${config_list[*]}"
# The CPU smoke builds nothing: unless a build tree was named, the caller's libraries stay.
if [[ $cpu_smoke == 0 || $build_dir_given == 1 ]]; then
  export SDALLOC_LIBRARY_DIR="$build_dir/src"
fi
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
smoke=()
[[ $cpu_smoke == 1 ]] && smoke=(--cpu-smoke --iterations 1 --warmup 0 --steps 1)
[[ $cpu_smoke == 1 ]] || smoke=(--iterations "$iterations")
results=()
for c in "${config_list[@]}"; do
  result="$work/$c.json"
  results+=("$result")
  [[ $dry_run == 0 ]] && rm -f "$result"
  echo "-- $c"
  status=0
  if [[ $dry_run == 1 ]]; then
    act timeout "$run_timeout" "$python" "$root/scripts/gpu_workload.py" run --config "$c" \
      --out "$result" "${smoke[@]}"
  else
    timeout "$run_timeout" "$python" "$root/scripts/gpu_workload.py" run --config "$c" \
      --out "$result" "${smoke[@]}" 2>&1 | tee "$work/$c.log" || status=${PIPESTATUS[0]}
  fi
  if [[ $status != 0 ]]; then
    echo "gpu-check: run '$c' FAILED or timed out after ${run_timeout} s (log: $work/$c.log)" >&2
    if [[ $dry_run == 0 && ! -s $result ]]; then
      printf '{"config": "%s", "error": "exited with an error or timed out; see %s"}\n' \
        "$c" "$work/$c.log" > "$result"
    fi
  fi
done

# --- 4. the table --------------------------------------------------------------------------
step "results ($((SECONDS - start)) s)"
table_args=()
[[ -n $out_dir ]] && table_args+=(--json "$out_dir/gpu-check.json")
[[ $strict == 1 ]] && table_args+=(--strict)
act "$python" "$root/scripts/gpu_workload.py" table "${results[@]}" "${table_args[@]}" ||
  die "one or more runs failed, or (with --strict) a bar was missed: see the table above"
[[ -n $out_dir && $dry_run == 0 ]] && echo "gpu-check: JSON written to $out_dir/gpu-check.json"
[[ ${tests_skipped:-0} == 1 ]] && echo "gpu-check: WARNING: the CUDA conformance tests did not run"
echo "gpu-check: done in $((SECONDS - start)) s"
