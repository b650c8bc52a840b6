#!/usr/bin/env bash
# scripts/planner-minimalloc.sh - `sdalloc plan` without a capacity on the eleven MiniMalloc
# "challenging" instances (data/minimalloc/), one after another, printed as the Markdown
# table of docs/planner.md: lower bound, arena, arena / bound, seconds.
#
#   scripts/planner-minimalloc.sh [SECONDS] [SDALLOC] [THREADS]
#
#   SECONDS   the time limit of each run (default 10, the figure the docs quote)
#   SDALLOC   the program (default build/release/tools/sdalloc)
#   THREADS   `sdalloc plan --threads` (default 0: one per hardware thread)
#
# The planner stops at its wall-clock limit: on a loaded machine it gets less CPU in the
# same time, so the line below the table gives the load average and the thread count.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit="${1:-10}"
sdalloc="${2:-build/release/tools/sdalloc}"
threads="${3:-0}"
[[ -x "$sdalloc" ]] || { echo "no $sdalloc: build the sdalloc_cli target first" >&2; exit 2; }

echo "| instance | buffers | lower bound | arena | arena / bound | seconds |"
echo "|---|---:|---:|---:|---:|---:|"
for name in A B C D E F G H I J K; do
  csv="data/minimalloc/$name.1048576.csv"
  buffers=$(($(wc -l <"$csv") - 1))
  "$sdalloc" plan "$csv" --time-limit "$limit" --threads "$threads" --json 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print("| %s | %s | %d | %d | %.4f | %.2f |" % (sys.argv[1], sys.argv[2], d["lower_bound"],
      d["arena"], d["arena"] / d["lower_bound"], d["seconds"]))' "$name" "$buffers"
done
echo
echo "time limit ${limit} s, --threads ${threads}; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
