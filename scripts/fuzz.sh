#!/usr/bin/env bash
# scripts/fuzz.sh - builds the libFuzzer targets (CMakePresets.json "fuzz": clang, ASan +
# UBSan; "fuzz-preload" for the drop-in's, UBSan alone) and runs each for a fixed time or a
# fixed number of executions.
#
#   scripts/fuzz.sh [--seconds N] [--runs N] [--jobs N] [--workers N] [--keep] [NAME...]
#
#   --seconds N  run each fuzzer N seconds (default 600; CI's short run uses 15)
#   --runs N     run each fuzzer N executions instead (e.g. --runs 10000000)
#   --jobs N     compile jobs (default: number of CPUs)
#   --workers N  fuzz in N processes at once (libFuzzer's -fork=N; default 1): the runs are
#                the sum over them, and a finding in any one stops the fuzzer
#   --keep       a session to keep (docs/fuzzing.md): after each fuzzer without a finding,
#                merge what it found into its seed corpus in the repository (libFuzzer's
#                -merge=1: only inputs that add coverage), and append its run, finding or not,
#                to tests/fuzz/ledger.tsv (scripts/fuzz_ledger.py sums it into the docs)
#   NAME...      fuzzers to run (default: all): trace interval planner conf c_api pools
#                preload_pool preload_vmm preload_planned (the drop-in's one target,
#                fuzz_preload, in each mode: SDALLOC_PRELOAD_CONF=mode:<mode>,$preload_conf
#                below, seed corpus tests/fuzz/corpus/preload/)
#
# Each fuzzer starts from its seed corpus, tests/fuzz/corpus/<name>/ (read only without
# --keep), and keeps what it finds new in build/fuzz/corpus/<name>/. A crash, a sanitizer
# report, a leak, a timeout (-timeout, 25 s per input) or an out-of-memory (-rss_limit_mb)
# is a finding: its input is written to build/fuzz/findings/<name>-*, and the script fails
# once every fuzzer has run. It prints, per fuzzer, the executions, the seconds and the
# executions per second.
# SDALLOC_BUILD_ROOT: where the build tree goes (default <repo>/build, as in the presets).
# Add a finding to the seed corpus once it is fixed, so ctest replays it (fuzz_<name>_corpus).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
all=(trace interval planner conf c_api pools preload_pool preload_vmm preload_planned)
# The drop-in's settings while fuzzed (tests/fuzz/CMakeLists.txt says why; keep the two equal).
preload_conf=threshold:4KiB,capacity:4MiB,granularity:256KiB,min_segment:256KiB,huge_threshold:2MiB,plan_nodes:1000
seconds=600
runs=""
jobs=$(nproc)
workers=1
keep=0
names=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")
for name in "${names[@]}"; do
  [[ " ${all[*]} " == *" $name "* ]] || { echo "fuzz.sh: no fuzzer '$name' (${all[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 1; }

build=${SDALLOC_BUILD_ROOT:-$root/build}/fuzz
preload_build=${SDALLOC_BUILD_ROOT:-$root/build}/fuzz-preload
cd "$root"
# The drop-in's target lives in a build of its own (no ASan); build only the trees needed.
need_asan=0
need_preload=0
for name in "${names[@]}"; do
  if [[ $name == preload_* ]]; then need_preload=1; else need_asan=1; fi
done
if [[ $need_asan == 1 ]]; then
  cmake --preset fuzz -B "$build" >/dev/null
  cmake --build "$build" -j "$jobs" --target sdalloc_fuzzers
fi
if [[ $need_preload == 1 ]]; then
  cmake --preset fuzz-preload -B "$preload_build" >/dev/null
  cmake --build "$preload_build" -j "$jobs" --target fuzz_preload
fi

# Leaks are findings; UBSan stops at its first report (the build makes it fatal as well).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:malloc_context_size=8}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mkdir -p "$build/findings"
ledger=$root/tests/fuzz/ledger.tsv
# The commit fuzzed; -dirty when code differs from it (what a session itself writes, the
# corpora and the ledger, does not count).
commit=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && ! git -C "$root" diff --quiet HEAD -- . ':!tests/fuzz/corpus' \
  ':!tests/fuzz/ledger.tsv' 2>/dev/null; then
  commit+=-dirty
fi
if [[ $keep == 1 && ! -s $ledger ]]; then
  printf 'ended_utc\tcommit\tfuzzer\tseconds\texecutions\tcorpus_files\tresult\n' >"$ledger"
fi
failed=()
summary=()
for name in "${names[@]}"; do
  binary=$build/tests/fuzz/fuzz_$name
  seeds=$root/tests/fuzz/corpus/$name
  conf=()
  if [[ $name == preload_* ]]; then
    binary=$preload_build/tests/fuzz/fuzz_preload
    seeds=$root/tests/fuzz/corpus/preload
    conf=(env "SDALLOC_PRELOAD_CONF=mode:${name#preload_},$preload_conf")
  fi
  corpus=$build/corpus/$name
  mkdir -p "$corpus"
  limit=(-max_total_time="$seconds")
  [[ -n $runs ]] && limit=(-runs="$runs")
  [[ $workers -gt 1 ]] && limit+=(-fork="$workers")
  log=$build/fuzz_$name.log
  echo "fuzz.sh: $name (${limit[*]})"
  start=$(date +%s.%N)
  rc=0
  # -entropic=0: clang 14's entropic scheduler spent 45-58 % of the c_api and pools
  # fuzzers' time in UpdateFeatureFrequency (perf); without it they ran 1.8-2.2x the
  # executions per second and reached as much coverage in the same 10 s.
  "${conf[@]}" "$binary" "${limit[@]}" -entropic=0 -max_len=4096 -timeout=25 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/findings/$name-" \
    "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # -fork prints no final stats: its last '#N: cov: ...' line counts every worker's runs.
  [[ -z $executions ]] && executions=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -1)
  elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  rate=$(awk -v n="${executions:-0}" -v t="$elapsed" 'BEGIN { printf "%.0f", (t > 0) ? n / t : 0 }')
  line="$name: ${executions:-?} executions in $elapsed s ($rate/s)"
  if [[ $rc -ne 0 ]]; then
    line+=" FINDING (exit $rc, log $log)"
    failed+=("$name")
    grep -E 'ERROR|runtime error|fuzzer: |Test unit written' "$log" | head -5 >&2 || true
  fi
  if [[ $keep == 1 ]]; then
    result=finding
    if [[ $rc -eq 0 ]]; then
      result=ok
      "${conf[@]}" "$binary" -merge=1 -entropic=0 -max_len=4096 -timeout=25 -rss_limit_mb=2048 \
        "$seeds" "$corpus" >"$build/merge_$name.log" 2>&1 ||
        { echo "fuzz.sh: merging $name's corpus failed (log $build/merge_$name.log)" >&2; exit 1; }
    fi
    files=$(find "$seeds" -maxdepth 1 -type f | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M)" "$commit" "$name" \
      "$elapsed" "${executions:-0}" "$files" "$result" >>"$ledger"
    line+=", seed corpus $files files"
  fi
  echo "fuzz.sh: $line"
  summary+=("$line")
done

echo
printf 'fuzz.sh: %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: FINDINGS in ${failed[*]} (inputs in $build/findings/)" >&2
  exit 1
fi
echo "fuzz.sh: no findings"
