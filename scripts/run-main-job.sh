#!/usr/bin/env bash
# scripts/run-main-job.sh - the README's first command: build the release preset and replay
# the bundled Stable Diffusion 1.5 UNet trace (data/traces/sd15_unet_b2_64x64_cpu_2pass.csv)
# through a CachingPool, printing the pool's statistics and its overhead over the trace's
# live peak. Extra arguments go to sdalloc-pool-replay (e.g. --capacity 4G, or another trace).
#
# Environment: SDALLOC_BUILD_ROOT (default <repo>/build), SDALLOC_JOBS (default: CPUs).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${SDALLOC_BUILD_ROOT:-$root/build}/release
cd "$root"
"$root/scripts/install-deps.sh"

# The build's output goes to a log, shown only if the build fails: the job's output is the point.
log=$build_dir/run-main-job-build.log
echo "run-main-job: building sdalloc-pool-replay (release preset) in $build_dir"
mkdir -p "$build_dir"
if ! { cmake --preset release -B "$build_dir" &&
       cmake --build "$build_dir" -j "${SDALLOC_JOBS:-$(nproc)}" --target sdalloc-pool-replay
     } >"$log" 2>&1; then
  cat "$log" >&2
  echo "run-main-job: FAILED: the build did not succeed (log above, also in $log)" >&2
  exit 1
fi

# Without arguments: the bundled trace, three times over on one pool (a denoising loop
# repeats its step), so the per-pass lines show the pool settling into one arena.
trace=$root/data/traces/sd15_unet_b2_64x64_cpu_2pass.csv
if [[ $# -eq 0 ]]; then
  set -- "$trace" --passes 3
fi
echo "run-main-job: $build_dir/tools/sdalloc-pool-replay $*"
exec "$build_dir/tools/sdalloc-pool-replay" "$@"
