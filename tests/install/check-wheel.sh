#!/usr/bin/env bash
# tests/install/check-wheel.sh WORK BUILD_DIR - proves the Python distribution works as a
# user gets it (pyproject.toml, setup.py, docs/packaging.md).
#
# Offline (no package index), with Debian's python3-build, python3-venv and pip:
#   1. builds the wheel with `python3 -m build --no-isolation --wheel`, reusing the built tree
#      BUILD_DIR (SDALLOC_CMAKE_BUILD_DIR: only what is out of date is rebuilt), and checks its
#      files: the modules, libsdalloc.so, the shim, the drop-in and bin/sdalloc;
#   2. installs it with pip into a fresh `python3 -m venv --system-site-packages`, then, from a
#      folder outside the source tree and with no SDALLOC_* variable and no PYTHONPATH set:
#      a host pool allocates and frees from the package's own libsdalloc.so, __version__ is
#      CMakeLists.txt's, `sdalloc replay --help` and `python -m sdalloc replay --help` run the
#      bundled program, and torch runs under LD_PRELOAD=$(sdalloc.preload_path()) with its
#      tensors in the drop-in's pool;
#   3. installs the source tree itself (`pip install --no-build-isolation .`) into a second
#      fresh venv and imports it the same way.
# Any failing step stops the script with a message naming it.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 WORK BUILD_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1"
work=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)
python=/usr/bin/python3  # Debian's: it has build, setuptools, wheel and torch

step="start"
trap 'rc=$?; [[ $rc -ne 0 ]] && echo "check-wheel: FAILED at step: $step (exit $rc)" >&2' EXIT
rm -rf "$work"/dist "$work"/venv-wheel "$work"/venv-source "$work"/outside
mkdir -p "$work/outside"

# The installed package must find everything itself: no SDALLOC_* variable, no PYTHONPATH,
# and not the source tree's python/ (the checks run from $work/outside).
clean_env=(env)
while IFS= read -r name; do
  [[ $name == SDALLOC_* || $name == PYTHONPATH ]] && clean_env+=(-u "$name")
done < <(compgen -e)

version=$(sed -nE 's/^project\(sdalloc VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
[[ -n $version ]] || { echo "check-wheel: no project(sdalloc VERSION ...) in CMakeLists.txt" >&2; exit 1; }

step="python3 -m build --no-isolation --wheel (reusing $build_dir)"
echo "check-wheel: $step"
(cd "$root" && SDALLOC_CMAKE_BUILD_DIR=$build_dir "$python" -m build --no-isolation --wheel \
  --outdir "$work/dist" >"$work/build-wheel.log" 2>&1) || { cat "$work/build-wheel.log" >&2; exit 1; }
wheels=("$work"/dist/sdalloc-"$version"-py3-none-*.whl)
[[ -f ${wheels[0]} && ${#wheels[@]} -eq 1 ]] || {
  echo "check-wheel: expected one sdalloc-$version-py3-none-*.whl in $work/dist:" >&2
  ls -l "$work/dist" >&2
  exit 1
}
wheel=${wheels[0]}

step="checking the wheel's files"
"$python" - "$wheel" <<'EOF'
import stat, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = set(wheel.namelist())
need = ["sdalloc/__init__.py", "sdalloc/__main__.py", "sdalloc/_version.py",
        "sdalloc/libsdalloc.so", "sdalloc/libsdalloc_torch.so", "sdalloc/libsdalloc_preload.so",
        "sdalloc/bin/sdalloc"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"check-wheel: the wheel lacks {', '.join(missing)}")
mode = wheel.getinfo("sdalloc/bin/sdalloc").external_attr >> 16
if not mode & stat.S_IXUSR:
    sys.exit("check-wheel: sdalloc/bin/sdalloc is not executable in the wheel")
entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
if "sdalloc = sdalloc._cli:main" not in wheel.read(entry_points).decode():
    sys.exit("check-wheel: no console script sdalloc = sdalloc._cli:main")
EOF
echo "check-wheel: $(basename "$wheel"), $(stat -c %s "$wheel") bytes"

# A fresh venv that sees Debian's torch; pip installs from the given file only.
make_venv() {
  "$python" -m venv --system-site-packages "$1"
}

# The checks every installed copy must pass; $1 is the venv.
check_installed() {
  local venv=$1 preload
  step="import sdalloc from $venv: a pool allocates and frees, the version is $version"
  echo "check-wheel: $step"
  (cd "$work/outside" && "${clean_env[@]}" "$venv/bin/python" - "$version" <<'EOF'
import os, sys
import sdalloc
from sdalloc import _native
here = os.path.dirname(os.path.abspath(sdalloc.__file__))
assert here.startswith(sys.prefix), f"sdalloc imported from {here}, not from the venv"
for path in (_native.host().path, sdalloc.preload_path(), _native.find_program(),
             _native.find(_native.TORCH_LIBRARY)):
    assert os.path.dirname(path) in (here, os.path.join(here, "bin")), \
        f"{path} is not the package's own"
assert sdalloc.__version__ == sdalloc.version() == sys.argv[1], \
    (sdalloc.__version__, sdalloc.version(), sys.argv[1])
pool = sdalloc.Pool()
block = pool.malloc(3 << 20)
assert pool.stats()["live_bytes"] >= 3 << 20
pool.free(block)
assert pool.stats()["live_bytes"] == 0
pool.close()
print(f"check-wheel: sdalloc {sdalloc.__version__} from {here}")
EOF
  )
  step="$venv/bin/sdalloc replay --help and python -m sdalloc replay --help"
  echo "check-wheel: $step"
  (cd "$work/outside" && "${clean_env[@]}" "$venv/bin/sdalloc" replay --help | grep -q '^Usage: sdalloc replay')
  (cd "$work/outside" && "${clean_env[@]}" "$venv/bin/python" -m sdalloc replay --help |
    grep -q '^Usage: sdalloc replay')
  step="torch under LD_PRELOAD=\$(python -c 'import sdalloc; print(sdalloc.preload_path())')"
  echo "check-wheel: $step"
  preload=$(cd "$work/outside" && "${clean_env[@]}" "$venv/bin/python" -c \
    'import sdalloc; print(sdalloc.preload_path())')
  (cd "$work/outside" && "${clean_env[@]}" LD_PRELOAD="$preload" "$venv/bin/python" -c '
import torch, sdalloc
x = torch.randn(512, 1024)
y = torch.nn.functional.gelu(x @ x.T)
assert sdalloc.preloaded(), "the drop-in is not serving"
assert sdalloc.preload_owns(y.data_ptr()), "a 1 MiB tensor is not in the drop-in pool"
print(f"check-wheel: torch ran under the drop-in ({y.numel() * 4 >> 20} MiB result in its pool)")
')
}

step="python3 -m venv --system-site-packages; pip install --no-index the wheel"
echo "check-wheel: $step"
make_venv "$work/venv-wheel"
"$work/venv-wheel/bin/pip" install -q --no-index "$wheel"
check_installed "$work/venv-wheel"

step="python3 -m venv --system-site-packages; pip install --no-index --no-build-isolation ."
echo "check-wheel: $step"
make_venv "$work/venv-source"
(cd "$root" && SDALLOC_CMAKE_BUILD_DIR=$build_dir "$work/venv-source/bin/pip" install -q \
  --no-index --no-build-isolation . >"$work/pip-install-source.log" 2>&1) ||
  { cat "$work/pip-install-source.log" >&2; exit 1; }
check_installed "$work/venv-source"

step="done"
echo "check-wheel: OK"
