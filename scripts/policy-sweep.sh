#!/bin/bash
# scripts/policy-sweep.sh - sdalloc's pools and their baselines on every trace, in one table.
#
#   scripts/policy-sweep.sh [-n PASSES] [-r ROUNDS] [-a ALLOCATORS] [-c POOL_CONF] [TRACE...]
#
# For each trace (default: every data/traces/*.csv and *.csv.gz) runs `sdalloc replay --touch`
# ROUNDS times (default 3) with all ALLOCATORS in the same run (default
# vmm,pool,planned,torch-native,tcmalloc: interleaved, so a busy machine slows them alike) over
# PASSES passes (default 5), and prints one row per trace: x live (peak reserved / peak live)
# of each allocator; vmm's and pool's total time over the passes and steady pass (the median
# of passes 3-5) as ratios to tcmalloc's (medians over the rounds); and the calls to the memory
# under vmm and pool after pass 2 (pages mapped, unmapped or moved; segments taken or
# released), which are 0 once a repeated trace has settled.
#
# Then it lists each trace that misses one of the bars of docs/pools.md and on how many all
# hold: vmm <= 1.05 x live; vmm's total <= 1.10 x and steady pass <= 1.25 x tcmalloc's on
# diffusion-shaped traces (1.5 x both on the classifiers, rec_tv_* and torchvision_*); pool
# <= torch-native's x live and no segment call after pass 2; planned 1.000 x. pool takes whole
# segments on any memory, so its figures here are those it has on a GPU (--device-like
# changes only vmm's pages); the GPU check measures the rest.
# -c passes --pool-conf to the pool (e.g. -c huge_threshold:128MiB).
# Needs build/release/tools/sdalloc (SDALLOC_CLI overrides) and /usr/bin/python3; the JSON
# of every run is kept under $SWEEP_DIR (default a temporary directory, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${SDALLOC_CLI:-build/release/tools/sdalloc}
passes=5
rounds=3
allocators=vmm,pool,planned,torch-native,tcmalloc
conf=
while getopts "n:r:a:c:" opt; do
  case $opt in
    n) passes=$OPTARG ;;
    r) rounds=$OPTARG ;;
    a) allocators=$OPTARG ;;
    c) conf=$OPTARG ;;
    *) echo "usage: $0 [-n PASSES] [-r ROUNDS] [-a ALLOCATORS] [-c POOL_CONF] [TRACE...]" >&2
       exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "$0: -n needs a positive pass count" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "$0: -r needs a positive round count" >&2; exit 2; }
if [ $# -eq 0 ]; then set -- data/traces/*.csv data/traces/*.csv.gz; fi
[ -x "$cli" ] || { echo "$0: $cli not built" >&2; exit 1; }
dir=${SWEEP_DIR:-$(mktemp -d /tmp/policy-sweep.XXXXXX)}
mkdir -p "$dir"
extra=()
[ -n "$conf" ] && extra=(--pool-conf "$conf")
n=0
for trace in "$@"; do
  n=$((n + 1))
  name=$(basename "$trace")
  echo "policy-sweep: $n/$#: $name" >&2
  for round in $(seq 1 "$rounds"); do
    "$cli" replay -q --touch -n "$passes" -a "$allocators" "${extra[@]}" \
      --json "$dir/${name}.r${round}.json" "$trace" > /dev/null || {
      echo "$0: replay of $trace failed (round $round)" >&2; exit 1; }
  done
done
exec /usr/bin/python3 scripts/policy_sweep_table.py "$dir" "$allocators" "$@"
