#!/usr/bin/env python3
"""scripts/fuzz_ledger.py - the fuzzers' cumulative record, from the ledger fuzz.sh keeps.

    scripts/fuzz_ledger.py [--ledger FILE] [--doc FILE] [--write | --check]

`scripts/fuzz.sh --keep` appends one line per fuzzer run to tests/fuzz/ledger.tsv (tab
separated, with a header): when it ended (UTC), the commit fuzzed, the fuzzer, its seconds,
its executions, the seed corpus's files after the merge, and `ok` or `finding`. This script
sums that ledger per fuzzer and prints a markdown table: runs, hours, executions, findings,
the last run and its commit, and the corpus's files now. With --write it replaces the table
between the doc's ledger markers (docs/fuzzing.md); with --check it fails when the doc's table
is not the ledger's, so no figure there is typed by hand (tests/python/test_fuzz_ledger.py).

A ledger line that does not parse is an error that names the file and the line: nothing is
summed from a ledger that is partly unreadable.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "tests" / "fuzz" / "ledger.tsv"
DOC = ROOT / "docs" / "fuzzing.md"
HEADER = ["ended_utc", "commit", "fuzzer", "seconds", "executions", "corpus_files", "result"]
BEGIN = "<!-- fuzz ledger: begin (scripts/fuzz_ledger.py --write) -->"
END = "<!-- fuzz ledger: end -->"


class LedgerError(Exception):
    pass


def read_ledger(path):
    """The ledger's runs as dicts; LedgerError on a header or line that does not parse."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise LedgerError(f"{path}: {e.strerror}") from e
    if not lines or lines[0].split("\t") != HEADER:
        raise LedgerError(f"{path}:1: the header must be: {' '.join(HEADER)}")
    runs = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{path}:{number}"
        if len(fields) != len(HEADER):
            raise LedgerError(f"{where}: {len(fields)} fields, {len(HEADER)} expected")
        run = dict(zip(HEADER, fields))
        try:
            run["seconds"] = float(run["seconds"])
            run["executions"] = int(run["executions"])
            run["corpus_files"] = int(run["corpus_files"])
        except ValueError as e:
            raise LedgerError(f"{where}: {e}") from e
        if run["seconds"] < 0 or run["executions"] < 0 or run["corpus_files"] < 0:
            raise LedgerError(f"{where}: a negative count")
        if run["result"] not in ("ok", "finding"):
            raise LedgerError(f"{where}: result must be ok or finding, not {run['result']!r}")
        if not run["fuzzer"]:
            raise LedgerError(f"{where}: no fuzzer named")
        runs.append(run)
    return runs


def table(runs):
    """One row per fuzzer (in the order first met), then the totals."""
    by_fuzzer = {}
    for run in runs:
        by_fuzzer.setdefault(run["fuzzer"], []).append(run)
    rows = ["| fuzzer | runs | hours | executions | findings | last run (UTC) | commit | corpus files |",
            "|---|---:|---:|---:|---:|---|---|---:|"]
    for name, own in by_fuzzer.items():
        last = max(own, key=lambda r: r["ended_utc"])
        rows.append(
            f"| {name} | {len(own)} | {sum(r['seconds'] for r in own) / 3600:.2f} | "
            f"{sum(r['executions'] for r in own):,} | "
            f"{sum(1 for r in own if r['result'] == 'finding')} | {last['ended_utc']} | "
            f"{last['commit']} | {last['corpus_files']} |")
    rows.append(
        f"| all | {len(runs)} | {sum(r['seconds'] for r in runs) / 3600:.2f} | "
        f"{sum(r['executions'] for r in runs):,} | "
        f"{sum(1 for r in runs if r['result'] == 'finding')} | | | |")
    return "\n".join(rows) + "\n"


def splice(doc_text, new_table, doc_path):
    begin = doc_text.find(BEGIN)
    end = doc_text.find(END)
    if begin < 0 or end < begin:
        raise LedgerError(f"{doc_path}: no ledger markers ({BEGIN} ... {END})")
    return doc_text[:begin + len(BEGIN)] + "\n" + new_table + doc_text[end:]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ledger", default=str(LEDGER))
    parser.add_argument("--doc", default=str(DOC))
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="replace the doc's table")
    action.add_argument("--check", action="store_true", help="fail if the doc's table is stale")
    args = parser.parse_args(argv)
    try:
        new_table = table(read_ledger(args.ledger))
        if not (args.write or args.check):
            sys.stdout.write(new_table)
            return 0
        doc = Path(args.doc)
        try:
            text = doc.read_text(encoding="utf-8")
        except OSError as e:
            raise LedgerError(f"{doc}: {e.strerror}") from e
        updated = splice(text, new_table, doc)
        if args.check:
            if updated != text:
                print(f"fuzz_ledger.py: {doc}'s table is not {args.ledger}'s; "
                      "run scripts/fuzz_ledger.py --write", file=sys.stderr)
                return 1
            return 0
        doc.write_text(updated, encoding="utf-8")
        return 0
    except LedgerError as e:
        print(f"fuzz_ledger.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
