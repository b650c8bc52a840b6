"""setup.py - the CMake half of the sdalloc wheel (pyproject.toml's backend is setuptools').

The package's modules come from python/sdalloc as for any package; build_py then has CMake
build the native targets and install the wheel's component (cmake/PythonPackage.cmake) into
the package's folder of the build, so the wheel carries libsdalloc.so, libsdalloc_torch.so,
libsdalloc_preload.so and bin/sdalloc next to the modules, where sdalloc._native looks first.

The version is written once, in CMakeLists.txt's project(sdalloc VERSION ...): read here for
the wheel's metadata (which setuptools needs before anything is built) and written by CMake
into sdalloc/_version.py (sdalloc.__version__); the build checks that the two agree.

The wheel is tagged py3-none-<platform>: the package is Python over ctypes and loads no
extension module, so any Python 3 will do, but its files are native code for this platform.

Build-time environment (the installed package reads none of it):
  SDALLOC_CMAKE_BUILD_DIR  an existing, configured build tree to build the targets in and
                           install from (e.g. build/release: nothing is rebuilt when it is
                           up to date); default <source>/build/wheel, configured here with
                           tests and benchmarks off
  SDALLOC_CMAKE_ARGS       extra arguments for that configuration (e.g. -DSDALLOC_WITH_CUDA=OFF)
  SDALLOC_JOBS             parallel compile jobs (default: the CPUs)
"""

import os
import re
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
# What the wheel's component must have installed, relative to the package's folder.
TARGETS = ("sdalloc", "sdalloc_torch", "sdalloc_preload", "sdalloc_cli")
NATIVE_FILES = ("libsdalloc.so", "libsdalloc_torch.so", "libsdalloc_preload.so",
                os.path.join("bin", "sdalloc"), "_version.py")


def cmake_version():
    """project(sdalloc VERSION x.y.z)'s version, from the top CMakeLists.txt."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as file:
        match = re.search(r"project\(\s*sdalloc\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", file.read())
    if not match:
        raise SystemExit("setup.py: CMakeLists.txt has no project(sdalloc VERSION x.y.z)")
    return match.group(1)


def _run(command):
    print("setup.py: " + shlex.join(command), flush=True)
    subprocess.run(command, check=True)


def _cache_value(build_dir, name):
    """A variable of build_dir's CMakeCache.txt, "" when it is not set there."""
    with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8") as cache:
        for line in cache:
            key, _, value = line.rstrip("\n").partition("=")
            if key.split(":")[0] == name:
                return value
    return ""


def _build_tree():
    """The CMake build tree, configured: SDALLOC_CMAKE_BUILD_DIR's, or build/wheel."""
    given = os.environ.get("SDALLOC_CMAKE_BUILD_DIR")
    if given:
        build_dir = os.path.abspath(given)
        if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
            raise SystemExit(f"setup.py: SDALLOC_CMAKE_BUILD_DIR={given} is not a configured "
                             "CMake build tree (no CMakeCache.txt)")
        if _cache_value(build_dir, "SDALLOC_SANITIZE"):
            raise SystemExit(f"setup.py: {build_dir} is a sanitizer build (SDALLOC_SANITIZE="
                             f"{_cache_value(build_dir, 'SDALLOC_SANITIZE')}): its libraries "
                             "cannot be loaded without the sanitizer's runtime")
        return build_dir
    build_dir = os.path.join(ROOT, "build", "wheel")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
          "-DSDALLOC_BUILD_TESTS=OFF", "-DSDALLOC_BUILD_BENCH=OFF", "-DSDALLOC_BUILD_TOOLS=ON",
          "-DSDALLOC_SANITIZE=", *shlex.split(os.environ.get("SDALLOC_CMAKE_ARGS", ""))])
    return build_dir


class CMakeBuildPy(build_py):
    """build_py, then the native files from CMake into the built package's folder."""

    def run(self):
        super().run()
        build_dir = _build_tree()
        jobs = os.environ.get("SDALLOC_JOBS") or str(os.cpu_count() or 1)
        package_dir = os.path.join(os.path.abspath(self.build_lib), "sdalloc")
        for name in NATIVE_FILES:  # a previous build's files must not linger
            path = os.path.join(package_dir, name)
            if os.path.exists(path):
                os.remove(path)
        try:
            _run(["cmake", "--build", build_dir, "-j", jobs, "--target", *TARGETS])
            _run(["cmake", "--install", build_dir, "--component", "sdalloc_wheel",
                  "--prefix", package_dir])
        except subprocess.CalledProcessError as error:
            raise SystemExit(f"setup.py: CMake failed in {build_dir} (exit {error.returncode}): "
                             f"{shlex.join(error.cmd)}") from error
        missing = [n for n in NATIVE_FILES if not os.path.isfile(os.path.join(package_dir, n))]
        if missing:
            raise SystemExit(f"setup.py: {build_dir} did not install {', '.join(missing)} "
                             "(component sdalloc_wheel; a build without tools has no program)")
        with open(os.path.join(package_dir, "_version.py"), encoding="utf-8") as file:
            built = re.search(r'__version__ = "([^"]*)"', file.read())
        if not built or built.group(1) != cmake_version():
            raise SystemExit(f"setup.py: {build_dir} was configured at version "
                             f"{built and built.group(1)}, CMakeLists.txt says "
                             f"{cmake_version()}: reconfigure it")


class NativeFilesDistribution(Distribution):
    """A distribution with native files: not pure, so they install to platlib, not purelib."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A wheel for this platform (its files are native), for any Python 3 (no extension)."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


# setuptools' own scratch space (its build and the .egg-info) beside CMake's trees.
SCRATCH = os.path.join("build", "setuptools")
os.makedirs(SCRATCH, exist_ok=True)
setup(version=cmake_version(), distclass=NativeFilesDistribution,
      cmdclass={"build_py": CMakeBuildPy, "bdist_wheel": PlatformWheel},
      options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}})
