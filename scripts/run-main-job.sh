#!/usr/bin/env bash
# scripts/run-main-job.sh [--full | REPLAY_ARGS...] - the README's first command: build the
# release preset and run the main job, `sdalloc replay --touch` on the bundled Stable
# Diffusion 1.5 UNet trace (data/traces/sd15_unet_b2_64x64_cpu_2pass.csv, 2.1 GiB live).
#
# Default (a few minutes with the build on a 2-core VM): sdalloc's modes (pool, planned, vmm)
# and tcmalloc, 3 passes each, then glibc for 1 pass. glibc hands the large blocks back to
# the kernel and faults them in again every pass, which takes it from 20 s to 2 min a pass on
# such a VM, so one pass shows its cost. scripts/main_job_summary.py prints one table of both
# runs (with each row's pass count) and what it means in plain words.
#   --full          every allocator (also jemalloc, mimalloc), 3 passes each: sdalloc replay's
#                   own table (5-25 min on that VM)
#   REPLAY_ARGS     anything else replaces the defaults and goes to `sdalloc replay` (e.g.
#                   `--allocator pool,tcmalloc --passes 5 --report report.html`, another trace)
#
# Environment: SDALLOC_BUILD_ROOT (default <repo>/build), SDALLOC_JOBS (default: CPUs).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${SDALLOC_BUILD_ROOT:-$root/build}/release
cd "$root"
"$root/scripts/install-deps.sh"

# The build's output goes to a log, shown only if the build fails: the job's output is the point.
log=$build_dir/run-main-job-build.log
echo "run-main-job: building sdalloc (release preset) in $build_dir"
mkdir -p "$build_dir"
if ! { cmake --preset release -B "$build_dir" &&
       cmake --build "$build_dir" -j "${SDALLOC_JOBS:-$(nproc)}" --target sdalloc_cli
     } >"$log" 2>&1; then
  cat "$log" >&2
  echo "run-main-job: FAILED: the build did not succeed (log above, also in $log)" >&2
  exit 1
fi

# The bundled trace, three passes (a denoising loop repeats its step), every page written as
# a tensor would be, so page faults are part of the time.
cli=$build_dir/tools/sdalloc
if [[ ${1:-} == --full && $# -eq 1 ]]; then
  set -- --touch --passes 3
fi
if [[ $# -gt 0 ]]; then
  echo "run-main-job: $cli replay $*"
  exec "$cli" replay "$@"
fi

# The default: two replays of the same trace (progress on stderr), one table from their JSON.
work=$(mktemp -d "${TMPDIR:-/tmp}/sdalloc-main-job.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2054  # the allocators are one comma-separated argument
kept=(--touch --passes 3 --allocator pool,planned,vmm,tcmalloc)
given_back=(--touch --passes 1 --allocator glibc)
echo "run-main-job: sdalloc's modes and tcmalloc, 3 passes: sdalloc replay ${kept[*]}"
"$cli" replay "${kept[@]}" --json "$work/kept.json" >/dev/null
echo "run-main-job: glibc, 1 pass (each of its passes faults 2 GiB in): sdalloc replay ${given_back[*]}"
"$cli" replay "${given_back[@]}" --json "$work/given_back.json" >/dev/null
echo
/usr/bin/python3 "$root/scripts/main_job_summary.py" "$work/kept.json" "$work/given_back.json"
