#!/usr/bin/env bash
# scripts/check-commit-subjects.sh [--base REV] [REV] - every commit subject landed since the
# rule is at most 72 characters.
#
# Checks `git log --format=%s BASE..REV` in the repository of the current directory (REV:
# HEAD by default). BASE is 11d63f6, the last commit before the rule: the subjects up to it
# are long and stay. Each offending commit is named (short hash, length, subject) and the exit
# status is 1; 0 when all fit. Merges count: they land too.
#
# A shallow clone (CI's `git clone --depth N`) that does not reach BASE cannot tell where the
# rule starts: every commit it has is then checked, and the script says so. Those are the N
# newest, all after BASE unless N reaches back past it, in which case BASE is there and the
# range is exact. A full clone without BASE is an error (wrong repository or --base). Not in
# a git work tree (a source tarball): nothing to check, exit 0 with a note.
set -euo pipefail
export LC_ALL=C.UTF-8  # ${#subject} counts characters, not bytes

max=72
base=11d63f634d8697293ccc3a6a3570d2266473b5d3
rev=HEAD
usage="usage: $0 [--base REV] [REV]"
while [[ $# -gt 0 ]]; do
  case $1 in
    --base) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; base=$2; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) rev=$1; shift ;;
  esac
done

if [[ $(git rev-parse --is-inside-work-tree 2>/dev/null) != true ]]; then
  echo "check-commit-subjects: not in a git work tree: no commits to check"
  exit 0
fi
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null ||
  { echo "check-commit-subjects: $rev is not a commit" >&2; exit 2; }

if git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  range=("$base..$rev")
  what="the commits after ${base:0:7}"
elif [[ $(git rev-parse --is-shallow-repository) == true ]]; then
  range=("$rev")
  what="every commit of this shallow clone (it does not reach ${base:0:7}, where the rule starts)"
else
  echo "check-commit-subjects: ${base:0:7} (the last commit before the rule) is not in this" \
    "repository, which is not shallow: wrong repository or --base" >&2
  exit 2
fi

checked=0
bad=0
while IFS=$'\t' read -r hash subject; do
  checked=$((checked + 1))
  if [[ ${#subject} -gt $max ]]; then
    bad=$((bad + 1))
    echo "check-commit-subjects: commit $hash: subject of ${#subject} characters (at most" \
      "$max): $subject" >&2
  fi
done < <(git log --format='%h%x09%s' "${range[@]}")

if [[ $bad -gt 0 ]]; then
  echo "check-commit-subjects: FAILED: $bad of $checked commit(s) with a subject over $max" \
    "characters, in" \
    "$what. Reword them (git rebase -i, 'reword'): a subject of at most $max characters," \
    "a blank line, then the body." >&2
  exit 1
fi
echo "check-commit-subjects: $checked commit(s), every subject at most $max characters" \
  "($what)"
