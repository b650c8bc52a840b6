#!/usr/bin/env bash
# tests/install/check-install.sh PREFIX BUILD_DIR - proves an installed sdalloc is usable.
#
# Installs the (already built) tree BUILD_DIR into PREFIX, checks the files a user needs are
# there, then builds and runs, against PREFIX only:
#   1. tests/install/ as a CMake project: find_package(sdalloc), linked once with
#      sdalloc::sdalloc (shared) and once with sdalloc::sdalloc_static;
#   2. tests/install/consumer.c with gcc -std=c11 -pedantic -Werror and the flags of
#      `pkg-config --cflags --libs sdalloc` (the C API through the shared library);
#   3. the installed Python package (<libdir>/sdalloc/python) with /usr/bin/python3, which
#      must find the installed libsdalloc.so, libsdalloc_torch.so and libsdalloc_preload.so
#      on its own, with CMake's version in sdalloc.__version__.
# Any failing step stops the script with a message naming it.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PREFIX BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)
work=$build_dir/install-consumer

step="start"
trap 'rc=$?; [[ $rc -ne 0 ]] && echo "check-install: FAILED at step: $step (exit $rc)" >&2' EXIT

step="cmake --install $build_dir --prefix $prefix"
echo "check-install: $step"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null

step="checking the installed files"
pc_file=$(find "$prefix" -path '*/pkgconfig/sdalloc.pc' | head -n 1)
config_file=$(find "$prefix" -path '*/cmake/sdalloc/sdallocConfig.cmake' | head -n 1)
[[ -n $pc_file ]] || { echo "check-install: no pkgconfig/sdalloc.pc under $prefix" >&2; exit 1; }
[[ -n $config_file ]] || { echo "check-install: no sdallocConfig.cmake under $prefix" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pc_file")")
for f in "$libdir/libsdalloc.so" "$libdir/libsdalloc.a" "$libdir/libsdalloc_torch.so" \
         "$libdir/libsdalloc_preload.so" "$libdir/sdalloc/python/sdalloc/__init__.py" \
         "$libdir/sdalloc/python/sdalloc/_version.py" \
         "$prefix/include/sdalloc/sdalloc.hpp" "$prefix/include/sdalloc/sdalloc.h" \
         "$prefix/include/sdalloc/version.hpp" \
         "$(dirname "$config_file")/sdallocConfigVersion.cmake" \
         "$(dirname "$config_file")/sdallocTargets.cmake"; do
  [[ -e $f ]] || { echo "check-install: missing $f" >&2; exit 1; }
done
# Nothing private may leak into the install: src/ headers stay in the source tree.
if find "$prefix/include" -type f ! -path '*/include/sdalloc/*' | grep -q .; then
  echo "check-install: unexpected files under $prefix/include:" >&2
  find "$prefix/include" -type f ! -path '*/include/sdalloc/*' >&2
  exit 1
fi
echo "check-install: files OK (libdir $libdir)"

export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rm -rf "$work"
mkdir -p "$work"

# The consumer is built without the sanitizers or the project's settings: it is a stranger.
step="configure the CMake consumer (find_package(sdalloc))"
echo "check-install: $step"
env -u CMAKE_PREFIX_PATH cmake -S "$here" -B "$work/cmake" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; exit 1; }
grep 'Found sdalloc' "$work/configure.log"

step="build the CMake consumer"
echo "check-install: $step"
cmake --build "$work/cmake" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }

step="run the CMake consumer linked with sdalloc::sdalloc (shared)"
echo "check-install: $step"
"$work/cmake/consumer_shared"
step="check consumer_shared loaded the installed libsdalloc.so"
ldd "$work/cmake/consumer_shared" | grep -F "$libdir/libsdalloc.so" >/dev/null ||
  { echo "check-install: consumer_shared does not use $libdir/libsdalloc.so:" >&2;
    ldd "$work/cmake/consumer_shared" >&2; exit 1; }

step="run the CMake consumer linked with sdalloc::sdalloc_static"
echo "check-install: $step"
"$work/cmake/consumer_static"

step="compile the C consumer with pkg-config flags"
export PKG_CONFIG_PATH=$(dirname "$pc_file")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pc_flags=$(pkg-config --cflags --libs sdalloc)
echo "check-install: gcc -std=c11 -Wall -Wextra -pedantic -Werror consumer.c $pc_flags"
# shellcheck disable=SC2086  # the pkg-config flags are meant to split into words
gcc -std=c11 -Wall -Wextra -pedantic -Werror "$here/consumer.c" -o "$work/consumer_c" $pc_flags

step="run the C consumer"
echo "check-install: $step"
"$work/consumer_c"

step="import the installed Python package and use both libraries"
echo "check-install: $step"
env -u SDALLOC_LIBRARY_DIR PYTHONPATH="$libdir/sdalloc/python" /usr/bin/python3 -c '
import sys, sdalloc, sdalloc.torch as st
pool = sdalloc.Pool()
p = pool.malloc(4096)
assert pool.stats()["live_bytes"] == 4096
pool.free(p)
st.configure(backend="host")
assert st.pool(0).library.startswith(sys.argv[1]), st.pool(0).library
assert pool.library.startswith(sys.argv[1]), pool.library
assert sdalloc.preload_path() == sys.argv[1] + "libsdalloc_preload.so", sdalloc.preload_path()
assert sdalloc.__version__ == sdalloc.version(), (sdalloc.__version__, sdalloc.version())
' "$libdir/"

step="python -m sdalloc --version runs the installed program (<prefix>/bin/sdalloc)"
echo "check-install: $step"
(cd "$work" && env -u SDALLOC_LIBRARY_DIR PYTHONPATH="$libdir/sdalloc/python" \
  /usr/bin/python3 -m sdalloc --version | grep -qx "$(sed -nE \
    's/^#define SDALLOC_VERSION_STRING "(.*)"/\1/p' "$prefix/include/sdalloc/version.hpp")")

step="done"
echo "check-install: OK: installed sdalloc works from CMake (shared, static), from C (pkg-config)" \
  "and from Python"
