"""scripts/fuzz_ledger.py: the fuzzers' ledger summed into docs/fuzzing.md, a stale table
caught, and a malformed ledger refused with the file and line named."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fuzz_ledger.py"
HEADER = "ended_utc\tcommit\tfuzzer\tseconds\texecutions\tcorpus_files\tresult\n"
DOC = ("# Fuzzing\n\n<!-- fuzz ledger: begin (scripts/fuzz_ledger.py --write) -->\n"
       "stale\n<!-- fuzz ledger: end -->\n\nafter\n")


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, check=False)


def ledger(tmp_path, *lines):
    path = tmp_path / "ledger.tsv"
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return path


def test_the_repositorys_doc_is_its_ledgers_table():
    result = run("--check")
    assert result.returncode == 0, result.stderr


def test_runs_are_summed_per_fuzzer_and_in_all(tmp_path):
    path = ledger(tmp_path,
                  "2026-12-07T13:00\tabc1234\tpools\t600.5\t1000000\t40\tok",
                  "2026-12-07T14:00\tdef5678\tpools\t599.5\t500000\t45\tfinding",
                  "2026-12-07T13:10\tabc1234\ttrace\t3600\t2000\t9\tok")
    result = run("--ledger", path)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in result.stdout.splitlines()[2:]}
    assert rows["pools"] == ["2", "0.33", "1,500,000", "1", "2026-12-07T14:00", "def5678", "45"]
    assert rows["trace"] == ["1", "1.00", "2,000", "0", "2026-12-07T13:10", "abc1234", "9"]
    assert rows["all"][:4] == ["3", "1.33", "1,502,000", "1"]


def test_write_replaces_only_the_table_and_check_then_passes(tmp_path):
    path = ledger(tmp_path, "2026-12-07T13:00\tabc1234\tconf\t10\t77\t3\tok")
    doc = tmp_path / "fuzzing.md"
    doc.write_text(DOC)
    assert run("--ledger", path, "--doc", doc, "--check").returncode == 1
    assert run("--ledger", path, "--doc", doc, "--write").returncode == 0
    text = doc.read_text()
    assert "stale" not in text and "| conf | 1 |" in text
    assert text.startswith("# Fuzzing\n") and text.endswith("\n\nafter\n")
    assert run("--ledger", path, "--doc", doc, "--check").returncode == 0
    # Another run in the ledger makes the doc stale again.
    with path.open("a") as f:
        f.write("2026-12-07T14:00\tabc1234\tconf\t10\t23\t3\tok\n")
    stale = run("--ledger", path, "--doc", doc, "--check")
    assert stale.returncode == 1 and "--write" in stale.stderr


def test_malformed_ledgers_and_docs_are_refused_naming_the_line(tmp_path):
    cases = {
        "2026-12-07T13:00\tabc\tpools\t600\t1000\t40": ":2: 6 fields, 7 expected",
        "2026-12-07T13:00\tabc\tpools\tsoon\t1000\t40\tok": ":2: could not convert",
        "2026-12-07T13:00\tabc\tpools\t600\t-1\t40\tok": ":2: a negative count",
        "2026-12-07T13:00\tabc\tpools\t600\t1000\t40\tcrashed": ":2: result must be",
        "2026-12-07T13:00\tabc\t\t600\t1000\t40\tok": ":2: no fuzzer named",
    }
    for line, message in cases.items():
        result = run("--ledger", ledger(tmp_path, line))
        assert result.returncode == 2 and message in result.stderr, (line, result.stderr)
    bad_header = tmp_path / "bad.tsv"
    bad_header.write_text("when\tfuzzer\n")
    result = run("--ledger", bad_header)
    assert result.returncode == 2 and ":1: the header must be" in result.stderr
    result = run("--ledger", tmp_path / "missing.tsv")
    assert result.returncode == 2 and "missing.tsv" in result.stderr
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("# no table here\n")
    result = run("--ledger", ledger(tmp_path), "--doc", no_markers, "--write")
    assert result.returncode == 2 and "no ledger markers" in result.stderr
    assert no_markers.read_text() == "# no table here\n"
