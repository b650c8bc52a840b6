"""scripts/weights-sweep.sh: every trace under a model's weights, one row per trace with x live
of the segment cache and of vmm as on a GPU, the segments the first takes and releases and the
pages the second maps. A pool that settles under its weights releases the same segments over
eight steps as over four; bad options are refused with a reason.

Needs the release build's sdalloc program (SDALLOC_LIBRARY_DIR's sibling tools/sdalloc).
Run: SDALLOC_LIBRARY_DIR=build/release/src /usr/bin/python3 -m pytest -q tests/python/test_weights_sweep.py
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "weights-sweep.sh"


def cli():
    library_dir = os.environ.get("SDALLOC_LIBRARY_DIR", str(ROOT / "build" / "release" / "src"))
    path = Path(library_dir).parent / "tools" / "sdalloc"
    if not path.exists():
        pytest.skip(f"{path} not built")
    return path


def sweep(tmp_path, *args):
    env = dict(os.environ, SDALLOC_CLI=str(cli()), SWEEP_DIR=str(tmp_path / "sweep"))
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, check=False)


def test_one_row_per_trace_and_a_pool_that_settles_under_its_weights(tmp_path):
    traces = [ROOT / "data" / "traces" / "rec_tv_resnet18_b1_224.csv",
              ROOT / "data" / "traces" / "rec_vae_b1_8x8.csv"]
    by_steps = {}
    for steps in (4, 8):
        result = sweep(tmp_path / str(steps), "-b", 500_000_000, "-s", steps, *traces)
        assert result.returncode == 0, result.stderr
        assert "weights-sweep: 2/2: rec_vae_b1_8x8" in result.stderr  # progress on stderr
        rows = [[c.strip() for c in line.split("|")[1:-1]] for line in result.stdout.splitlines()
                if line.startswith("| rec_")]
        assert [r[0] for r in rows] == ["rec_tv_resnet18_b1_224", "rec_vae_b1_8x8"]
        by_steps[steps] = rows
        assert (tmp_path / str(steps) / "sweep" / "rec_vae_b1_8x8.json").exists()
    for four, eight in zip(by_steps[4], by_steps[8]):
        pool_x, taken, released, consolidations, vmm_x, maps, _ = four[1:]
        assert 1.0 <= float(pool_x) <= 1.10 and 1.0 <= float(vmm_x) <= 1.10, four
        assert int(consolidations) >= 1, four
        # Settled: what the weights and the first steps took is all it takes.
        assert (taken, released) == (eight[2], eight[3]), (four, eight)
        assert maps == eight[6], (four, eight)


def test_bad_options_are_refused_with_a_reason(tmp_path):
    for args, words in [(["-b", "0"], "-b needs a positive byte count"),
                        (["-s", "x"], "-s needs a positive step count"),
                        (["-q"], "usage")]:
        result = sweep(tmp_path, *args)
        assert result.returncode == 2 and words in result.stderr, (args, result.stderr)
