"""sdalloc.step() / preloaded() against the preloaded drop-in (libsdalloc_preload.so).

Each case runs a child /usr/bin/python3 with LD_PRELOAD set, since the drop-in must be loaded
before the interpreter starts. Skipped when the library is not built.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _library():
    candidates = []
    if os.environ.get("SDALLOC_LIBRARY_DIR"):
        candidates.append(Path(os.environ["SDALLOC_LIBRARY_DIR"]) / "preload" / "libsdalloc_preload.so")
    # Not the sanitizer builds: an ASan/TSan-instrumented library cannot be preloaded.
    candidates += [ROOT / "build" / b / "src/preload/libsdalloc_preload.so" for b in ("release", "debug")]
    for c in candidates:
        if c.exists():
            return c
    pytest.skip("libsdalloc_preload.so is not built")


def _run(code, conf):
    env = dict(os.environ, LD_PRELOAD=str(_library()), SDALLOC_PRELOAD_CONF=conf,
               PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


STEPS = """
import ctypes, sdalloc
assert sdalloc.preloaded()
buffers = []
for _ in range(5):
    with sdalloc.step():
        a = ctypes.create_string_buffer(4 << 20)
        b = ctypes.create_string_buffer(2 << 20)
        assert sdalloc.preload_owns(ctypes.addressof(a))
        del a, b
print("steps ok")
"""


def test_step_marks_planned_steps_of_the_preloaded_library():
    r = _run(STEPS, "mode:planned,report:stderr")
    assert r.returncode == 0, r.stderr
    assert "steps ok" in r.stdout
    assert "detection      off (steps marked)" in r.stderr
    assert "4 planned, 0 divergent" in r.stderr, r.stderr


def test_step_outside_mode_planned_raises():
    r = _run("import sdalloc\ntry:\n    with sdalloc.step(): pass\nexcept RuntimeError as e:\n"
             "    print('refused:', e)\n", "mode:pool")
    assert r.returncode == 0, r.stderr
    assert "refused: sdalloc.step(): the drop-in refused" in r.stdout


def test_not_preloaded():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([sys.executable, "-c", "import sdalloc; print(sdalloc.preloaded())"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
