"""scripts/trace_tools.py (clean, concat, weights, stats) and workloads/vae_decoder.py: the edits keep a
valid trace (ids renumbered, frees repeating sizes), clean drops what lives for most of the
trace, weights holds the stream across the steps, a bad input is an error naming the file and line; the decoder's tiny run gives the
image side 8 x the latent and the same checksum twice.

Run: /usr/bin/python3 -m pytest -q tests/python/test_trace_tools.py
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "scripts" / "trace_tools.py"
VAE = ROOT / "workloads" / "vae_decoder.py"


def run(*args):
    return subprocess.run([sys.executable, str(TOOLS), *map(str, args)], capture_output=True,
                          text=True, check=False)


def write(path, lines):
    path.write_text("op,id,size\n" + "".join(line + "\n" for line in lines))
    return path


def events(path):
    return [tuple(line.split(",")) for line in path.read_text().splitlines()[1:]]


def test_clean_drops_what_lives_for_most_of_the_trace_and_renumbers(tmp_path):
    # id 5 is a weight: allocated first, freed last; the rest are short temporaries.
    lines = ["a,5,1000"]
    for i in range(10):
        lines += [f"a,{10 + i},{100 + i}", f"f,{10 + i},{100 + i}"]
    lines += ["a,99,7", "f,5,1000"]  # 99 is never freed
    out = tmp_path / "clean.csv"
    result = run("clean", write(tmp_path / "raw.csv", lines), "-o", out)
    assert result.returncode == 0, result.stderr
    got = events(out)
    assert len(got) == 20
    assert got[0] == ("a", "0", "100") and got[1] == ("f", "0", "100")
    assert got[-1] == ("f", "9", "109")


def test_concat_renumbers_so_ids_stay_unique(tmp_path):
    a = write(tmp_path / "a.csv", ["a,0,10", "a,1,20", "f,0,10", "f,1,20"])
    b = write(tmp_path / "b.csv", ["a,0,30", "f,0,30"])
    out = tmp_path / "ab.csv"
    assert run("concat", a, b, "-o", out).returncode == 0
    assert events(out) == [("a", "0", "10"), ("a", "1", "20"), ("f", "0", "10"),
                           ("f", "1", "20"), ("a", "2", "30"), ("f", "2", "30")]
    stats = json.loads(run("stats", out).stdout)
    assert stats["allocations"] == 3
    assert stats["peak_live_bytes"] == 30
    assert stats["total_allocated_bytes"] == 60
    assert stats["live_at_end_bytes"] == 0


def test_weights_hold_the_stream_across_every_step(tmp_path):
    step = write(tmp_path / "step.csv", ["a,0,100", "a,1,50", "f,0,100", "f,1,50"])
    out = tmp_path / "w.csv"
    result = run("weights", step, "--bytes", 3_000_000, "--steps", 3, "-o", out)
    assert result.returncode == 0, result.stderr
    ev = events(out)
    weights = [e for e in ev if e[0] == "a" and e[2] not in ("100", "50")]
    # At least 3 MB of weights, allocated first and freed last, never in between.
    assert sum(int(e[2]) for e in weights) >= 3_000_000
    assert ev[:len(weights)] == weights
    assert [e[1] for e in ev[-len(weights):]] == [e[1] for e in weights]
    assert len(ev) == 2 * len(weights) + 3 * 4
    ids = [e[1] for e in ev if e[0] == "a"]
    assert len(ids) == len(set(ids))  # renumbered: every step's ids are new
    stats = json.loads(run("stats", out).stdout)
    assert stats["live_at_end_bytes"] == 0
    assert stats["peak_live_bytes"] == sum(int(e[2]) for e in weights) + 150
    assert run("weights", step, "-o", out).returncode != 0  # --bytes is needed
    assert run("weights", step, "--bytes", 0, "-o", out).returncode != 0


@pytest.mark.parametrize("lines, message", [
    (["a,0,10", "a,0,10"], "raw.csv:3: id 0 allocated twice"),
    (["a,0,10", "f,0,11"], "raw.csv:3: free of 0 not live with size 11"),
    (["x,0,10"], "raw.csv:2: bad event"),
])
def test_a_bad_event_names_the_file_and_line(tmp_path, lines, message):
    result = run("stats", write(tmp_path / "raw.csv", lines))
    assert result.returncode != 0
    assert message in result.stderr


def test_a_bad_header_and_usage_are_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("op,id,bytes\n")
    assert "not an event trace header" in run("stats", bad).stderr
    assert run("clean", bad).returncode == 2  # no -o
    assert run("stats", bad, bad).returncode == 2  # one input only


def test_vae_decoder_runs_and_repeats_itself():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    result = subprocess.run([sys.executable, str(VAE), "--latent", "2", "--passes", "2",
                             "--threads", "1"], capture_output=True, text=True, check=False,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "(1, 3, 16, 16)" in lines[0]
    assert lines[0].split("checksum")[1] == lines[1].split("checksum")[1]
    bad = subprocess.run([sys.executable, str(VAE), "--latent", "0"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2
