"""Shared set-up of the sdalloc package tests (tests/python/test_sdalloc_*.py).

The package is imported from python/ in this tree; its libraries come from
SDALLOC_LIBRARY_DIR, which scripts/test-all.sh points at the release build's src/
directory (run by hand: SDALLOC_LIBRARY_DIR=build/<dir>/src /usr/bin/python3 -m pytest
tests/python). When the libraries are missing the tests FAIL in CI (CI set) and are skipped
otherwise; torch-dependent tests are skipped only when torch is missing and CI is unset.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))

IN_CI = bool(os.environ.get("CI"))


def _missing_libraries():
    import sdalloc._native as native  # pylint: disable=import-outside-toplevel
    missing = []
    for name in (native.HOST_LIBRARY, native.TORCH_LIBRARY):
        try:
            native.find(name)
        except native.LibraryNotFound as error:
            missing.append(str(error))
    return missing


@pytest.fixture(scope="session")
def libraries():
    """Fails (CI) or skips (elsewhere) when libsdalloc.so / libsdalloc_torch.so are missing."""
    missing = _missing_libraries()
    if missing:
        if IN_CI:
            pytest.fail("\n".join(missing))
        pytest.skip("sdalloc libraries not built: " + missing[0])
    return True


@pytest.fixture(scope="session")
def torch(libraries):  # pylint: disable=redefined-outer-name,unused-argument
    if importlib.util.find_spec("torch") is None:
        if IN_CI:
            pytest.fail("torch is not importable (CI needs Debian's python3-torch)")
        pytest.skip("torch is not installed")
    import torch as torch_module  # pylint: disable=import-outside-toplevel
    return torch_module


def run_python(code, env=None, timeout=240):
    """Runs `code` in a fresh interpreter (the shim's state is per process) with the
    package on the path; answers the CompletedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(PYTHON_DIR) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("SDALLOC_CONF", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)
