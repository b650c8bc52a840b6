#!/bin/sh
# expect_output.sh PATTERN... -- COMMAND...: runs COMMAND (stdout and stderr together) and
# passes when it exits 0 and its output holds every PATTERN (grep -E). For the drop-in's
# tests whose message matters as much as the exit status.
patterns=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do patterns="$patterns
$1"; shift; done
shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "expect_output: exit status $rc"; exit 1; }
printf '%s\n' "$patterns" | while IFS= read -r p; do
  [ -z "$p" ] && continue
  printf '%s\n' "$out" | grep -Eq -- "$p" || { echo "expect_output: no line matches '$p'"; exit 1; }
done
