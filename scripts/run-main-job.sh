#!/usr/bin/env bash
# scripts/run-main-job.sh - the README's first command: build the release preset and run the
# main job, `sdalloc replay --touch` on the bundled Stable Diffusion 1.5 UNet trace
# (data/traces/sd15_unet_b2_64x64_cpu_2pass.csv) with every allocator available: sdalloc's
# pool and planned arena, and glibc, jemalloc, mimalloc, tcmalloc in child processes. It
# prints one table: what each held at peak, its ratio to the trace's live peak, and its time
# per operation. Extra arguments replace the defaults and go to `sdalloc replay` (e.g.
# `--allocator pool,tcmalloc --passes 5 --report report.html`, or another trace).
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

# Without arguments: the bundled trace, three passes (a denoising loop repeats its step),
# every page written as a tensor would be, so page faults are part of the time.
if [[ $# -eq 0 ]]; then
  set -- --touch --passes 3
fi
echo "run-main-job: $build_dir/tools/sdalloc replay $*"
exec "$build_dir/tools/sdalloc" replay "$@"
