#!/usr/bin/env bash
# scripts/format.sh - clang-format every C and C++ file git tracks, with the repo's
# .clang-format (Google base, 100 columns).
#
#   scripts/format.sh           rewrite the files in place
#   scripts/format.sh --check   change nothing; list each file that differs and exit 1 when
#                               any does (scripts/test-all.sh runs this, so CI fails on drift)
#
# Uses clang-format-14 (Debian 12's; scripts/install-deps.sh installs it) when present, so
# that every machine formats alike, else the clang-format on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *)
    echo "usage: scripts/format.sh [--check]" >&2
    exit 2
    ;;
esac

tool=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $tool ]]; then
  echo "format.sh: clang-format not found (apt-get install clang-format)" >&2
  exit 1
fi

mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cu')
if [[ $check -eq 0 ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$tool" -i --style=file
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi

differ=()
for f in "${files[@]}"; do
  if ! "$tool" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
    differ+=("$f")
  fi
done
if [[ ${#differ[@]} -gt 0 ]]; then
  printf 'format.sh: %s differs from clang-format --style=file\n' "${differ[@]}" >&2
  echo "format.sh: ${#differ[@]} of ${#files[@]} files need formatting: run scripts/format.sh" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files match .clang-format"
