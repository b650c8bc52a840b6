"""The package's packaging side: `python -m sdalloc` (sdalloc._cli) runs the compiled program
with the same arguments, sdalloc.preload_path() finds the drop-in, __version__ is CMake's.

The installed wheel is tested by tests/install/check-wheel.sh (scripts/test-all.sh, stage
wheel); here the same code runs from the source tree against a build (SDALLOC_LIBRARY_DIR)
and against a fake layout in a temporary folder, where the program is /usr/bin/env: it
prints the environment it was given and takes arguments, so both are visible.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYTHON_DIR, ROOT, run_python

ENV_PROGRAM = shutil.which("env") or "/usr/bin/env"


def run_module(args, library_dir, extra_env=None):
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), SDALLOC_LIBRARY_DIR=str(library_dir))
    env.pop("SDALLOC_PRELOAD_LIBRARY", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "sdalloc", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def wheel_layout(tmp_path):
    """A folder laid out as the wheel's package: bin/sdalloc (here /usr/bin/env) and the
    drop-in's file (empty: only its path is used)."""
    (tmp_path / "bin").mkdir()
    shutil.copy(ENV_PROGRAM, tmp_path / "bin" / "sdalloc")
    (tmp_path / "libsdalloc_preload.so").write_bytes(b"")
    return tmp_path


def test_the_program_gets_the_arguments_and_the_packages_drop_in(wheel_layout):
    result = run_module(["-u", "SDALLOC_TEST_MARK"], wheel_layout, {"SDALLOC_TEST_MARK": "1"})
    assert result.returncode == 0, result.stderr
    # `env -u SDALLOC_TEST_MARK`: the arguments arrived.
    assert "\nSDALLOC_TEST_MARK=" not in "\n" + result.stdout
    preload = wheel_layout / "libsdalloc_preload.so"
    assert f"SDALLOC_PRELOAD_LIBRARY={preload}\n" in result.stdout


def test_a_drop_in_the_user_named_is_kept(wheel_layout):
    result = run_module([], wheel_layout, {"SDALLOC_PRELOAD_LIBRARY": "/mine.so"})
    assert result.returncode == 0, result.stderr
    assert "SDALLOC_PRELOAD_LIBRARY=/mine.so\n" in result.stdout


def test_a_script_named_sdalloc_is_not_the_program(tmp_path):
    """A venv's bin/sdalloc is the console script itself: running it would loop."""
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "sdalloc"
    script.write_text("#!/bin/sh\necho looped\n")
    script.chmod(0o755)
    result = run_module(["replay", "--help"], tmp_path)
    assert result.returncode == 1
    assert "looped" not in result.stdout
    assert "the sdalloc program was not found" in result.stderr
    assert str(script) in result.stderr  # it says where it looked


def test_no_program_and_no_drop_in_say_where_they_were_looked_for(tmp_path):
    result = run_module(["replay"], tmp_path)
    assert result.returncode == 1
    assert "the sdalloc program was not found" in result.stderr
    result = run_python("""
        import sdalloc
        try:
            sdalloc.preload_path()
        except sdalloc.LibraryNotFound as error:
            print("refused:", error)
        """, env={"SDALLOC_LIBRARY_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert f"refused: sdalloc: libsdalloc_preload.so not found in SDALLOC_LIBRARY_DIR: " \
           f"{tmp_path}" in result.stdout


def _built_program(library_dir):
    program = Path(library_dir).parent / "tools" / "sdalloc"
    if not program.exists():
        pytest.skip(f"{program} is not built (a build without tools)")
    return program


def test_python_m_sdalloc_runs_the_builds_program(libraries):  # pylint: disable=unused-argument
    library_dir = os.environ.get("SDALLOC_LIBRARY_DIR") or str(ROOT / "build/release/src")
    _built_program(library_dir)
    result = run_module(["replay", "--help"], library_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Replay allocation traces")
    assert "Usage: sdalloc replay" in result.stdout


def test_preload_path_and_version_in_the_source_tree(libraries):  # pylint: disable=unused-argument
    cmake = (ROOT / "CMakeLists.txt").read_text()
    version = re.search(r"project\(sdalloc VERSION ([0-9.]+)", cmake).group(1)
    result = run_python("""
        import os, sdalloc
        path = sdalloc.preload_path()
        assert os.path.basename(path) == "libsdalloc_preload.so" and os.path.isfile(path), path
        print(sdalloc.__version__, sdalloc.version())
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [version, version]
