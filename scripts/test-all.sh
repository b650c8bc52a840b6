#!/usr/bin/env bash
# scripts/test-all.sh - the project's whole test run, the one command CI and the README use.
#
# Stages, in order, stopping at the first failure with the stage's name:
#   format    scripts/format.sh --check: every C/C++ file matches .clang-format, and
#             scripts/check-commit-subjects.sh: every commit subject since the rule is at most
#             72 characters (seconds)
#   release   configure (CMakePresets.json "release"), build, ctest
#   tidy      clang-tidy over the library's and tools' sources (src/, tools/) with the release
#             build's compile_commands.json
#             (bugprone findings are errors; skip with SDALLOC_SKIP_TIDY=1)
#   install   tests/install/check-install.sh: install the release build to a fresh prefix and
#             build and run a CMake consumer and a C consumer (pkg-config) against it
#   python    pytest over tests/python with /usr/bin/python3
#   wheel     tests/install/check-wheel.sh: the Python wheel built from the release tree
#             (nothing rebuilt), pip-installed offline into fresh venvs, used with no
#             SDALLOC_* variable: a pool, the `sdalloc` program, torch under the drop-in
#   peers     other people's suites on sdalloc (docs/peers.md): pytest over tests/peers (the
#             runner's own tests), then tests/peers/run_peers.py's CI slice: CPython's
#             regression-suite slice under the drop-in in every mode at threshold 4KiB, and
#             every ONNX backend test ORT passes, through the ORT adapter in every mode; a
#             difference from the runs without sdalloc fails it (about 4 minutes)
#   asan      configure, build, ctest with AddressSanitizer + UndefinedBehaviorSanitizer
#             (leaks checked)
#   tsan      the same with ThreadSanitizer
#   ubsan-preload  the CPU drop-in and its stress test built with UBSan alone (preset
#             "ubsan"), the stress test run with the drop-in preloaded in every mode (ASan
#             and TSan replace malloc themselves, so only UBSan can watch the drop-in work)
#   shim-without-cuda  the PyTorch shim's tests and pytest over that UBSan build, which is
#             configured without CUDA and without zlib, as a bare machine builds it (a shim
#             that lacked part of the C API without CUDA, and one that failed to link without
#             zlib, went unseen while only builds with both ran its tests)
#   fuzz      scripts/fuzz.sh --seconds 15: builds the libFuzzer targets (presets "fuzz" and
#             "fuzz-preload", clang)
#             and runs each 15 s (SDALLOC_FUZZ_SECONDS); a finding fails the stage
# tidy and install need only the release build and are quick, so they run before the long
# sanitizer builds: their failures show within minutes.
# Then prints one summary line with each stage's time.
#
# Environment:
#   SDALLOC_BUILD_ROOT  where the build trees go (default: <repo>/build, as in the presets)
#   SDALLOC_PRESETS     which sanitizer/release presets to run (default: "release asan tsan")
#   SDALLOC_SKIP_TIDY=1 skip the clang-tidy stage
#   SDALLOC_SKIP_FUZZ=1 skip the fuzz stage
#   SDALLOC_FUZZ_SECONDS seconds each fuzzer runs in the fuzz stage (default 15)
#   SDALLOC_JOBS        parallel compile jobs (default: number of CPUs)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_root=${SDALLOC_BUILD_ROOT:-$root/build}
presets=${SDALLOC_PRESETS:-release asan tsan}
jobs=${SDALLOC_JOBS:-$(nproc)}
ctest_jobs=2
cd "$root"
"$root/scripts/install-deps.sh"

# The sanitizers' settings: stop at the first report, print where it came from.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

# --- bookkeeping: which stage runs, how long each took ------------------------------------
stage="setup"
stage_start=$SECONDS
summary=()
on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo >&2
    echo "test-all: FAILED in stage '$stage' (exit code $rc, after $((SECONDS - stage_start)) s;" \
      "total $SECONDS s)" >&2
    [[ ${#summary[@]} -gt 0 ]] && echo "test-all: stages passed before it: ${summary[*]}" >&2
  fi
}
trap on_exit EXIT

begin() {
  stage=$1
  stage_start=$SECONDS
  echo
  echo "==== test-all: stage '$stage' ===="
}
end() {
  summary+=("$stage=$((SECONDS - stage_start))s")
  echo "==== test-all: stage '$stage' passed in $((SECONDS - stage_start)) s ===="
}

# ThreadSanitizer maps its shadow memory at fixed addresses; on kernels with high mmap
# randomisation (vm.mmap_rnd_bits > 28) it dies with "unexpected memory mapping". Running
# with ASLR off avoids that; the personality is inherited by every test ctest starts.
no_aslr=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
  no_aslr=(setarch "$(uname -m)" -R)
fi

run_preset() {
  local preset=$1 dir=$build_root/$1
  local wrapper=()
  [[ $preset == tsan ]] && wrapper=("${no_aslr[@]}")
  cmake --preset "$preset" -B "$dir"
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && "${wrapper[@]}" ctest --output-on-failure -j "$ctest_jobs" --timeout 600 \
    --no-tests=error)
}

run_tidy() {
  local dir=$build_root/release
  if ! command -v clang-tidy >/dev/null; then
    echo "test-all: clang-tidy not found (install clang-tidy or set SDALLOC_SKIP_TIDY=1)" >&2
    return 1
  fi
  [[ -f $dir/compile_commands.json ]] || {
    echo "test-all: $dir/compile_commands.json missing: the release stage must run first" >&2
    return 1
  }
  # The checks come from .clang-tidy; one file per process, two at a time. The "N warnings
  # generated" lines count system-header warnings that the header filter hides: noise.
  # Every library and tool source the build compiled (src/, its CUDA and shim folders when
  # built, tools/), read from the compilation database so each file has its flags.
  local -a sources
  mapfile -t sources < <(/usr/bin/python3 -c '
import json, sys
root = sys.argv[1]
files = {e["file"] for e in json.load(open(sys.argv[2]))}
for f in sorted(files):
    if f.endswith(".cpp") and (f.startswith(root + "/src/") or f.startswith(root + "/tools/")):
        print(f)' "$root" "$dir/compile_commands.json")
  echo "clang-tidy: ${#sources[@]} files"
  printf '%s\0' "${sources[@]}" |
    xargs -0 -n 1 -P "$ctest_jobs" clang-tidy -p "$dir" --quiet 2>&1 |
    { grep -vE '^[0-9]+ warnings? generated\.$' || true; }
}

# Python tests (the tools' scripts, the sdalloc package, the PyTorch shim, gpu-check.sh's
# CPU paths) run with Debian's interpreter, which has pytest and torch; a python3 earlier on
# PATH (pyenv, a venv) may not. The package loads the release build's libraries
# (SDALLOC_LIBRARY_DIR); CI=1 makes missing libraries or a missing torch failures, not skips.
# run_python_tests [LIBRARY_DIR]: the package over that build's libraries (default: release).
run_python_tests() {
  if ! compgen -G "$root/tests/python/test_*.py" >/dev/null; then
    echo "test-all: no Python tests yet"
    return 0
  fi
  SDALLOC_LIBRARY_DIR="${1:-$build_root/release/src}" CI="${CI:-1}" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python"
}

# Other people's suites (tests/peers/, docs/peers.md) over the release build: the runner's
# tests, then the slice; run_peers.py --full runs the whole suites.
run_peers() {
  SDALLOC_BUILD_DIR="$build_root/release" CI="${CI:-1}" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/peers"
  /usr/bin/python3 "$root/tests/peers/run_peers.py" --build "$build_root/release"
}

run_install_check() {
  local prefix=$build_root/install-check
  rm -rf "$prefix"
  "$root/tests/install/check-install.sh" "$prefix" "$build_root/release"
}

# --- the stages ---------------------------------------------------------------------------
echo "test-all: presets '$presets', build root $build_root, $jobs compile jobs"
begin format
"$root/scripts/format.sh" --check
"$root/scripts/check-commit-subjects.sh"
end
for preset in $presets; do
  begin "$preset"
  run_preset "$preset"
  end
  # Lint and the install check need only the release build and take a minute: run them
  # before the long sanitizer builds, so their failures show early.
  if [[ $preset == release ]]; then
    if [[ ${SDALLOC_SKIP_TIDY:-0} != 1 ]]; then
      begin tidy
      run_tidy
      end
    fi
    begin install
    run_install_check
    end
    begin python
    run_python_tests
    end
    begin wheel
    "$root/tests/install/check-wheel.sh" "$build_root/wheel-check" "$build_root/release"
    end
    begin peers
    run_peers
    end
  fi
done

if [[ " $presets " == *" asan "* ]]; then
  begin ubsan-preload
  cmake --preset ubsan -B "$build_root/ubsan"
  cmake --build "$build_root/ubsan" -j "$jobs" --target sdalloc_preload preload_stress
  (cd "$build_root/ubsan" && ctest --output-on-failure -R '^preload_stress_' --no-tests=error)
  end
  begin shim-without-cuda
  cmake --build "$build_root/ubsan" -j "$jobs" \
    --target sdalloc sdalloc_torch sdalloc_torch_shim_tests
  (cd "$build_root/ubsan" &&
    ctest --output-on-failure -R '^(TorchShim|shim_exports_)' --no-tests=error)
  # The Python package over those libraries (python3 loads the UBSan runtime first): only
  # here does offload(device="cuda") meet a shim built without CUDA and refuse saying so.
  # The tests that drive the sdalloc program skip: that build has no tools.
  ubsan_runtime=$(c++ -print-file-name=libubsan.so.1)
  [[ -f $ubsan_runtime ]] || { echo "test-all: no libubsan.so.1 next to c++" >&2; exit 1; }
  LD_PRELOAD=$ubsan_runtime run_python_tests "$build_root/ubsan/src"
  end
fi

# The fuzzers last: they need clang and a build of their own, and find what the sanitizer
# runs of the fixed tests above cannot. Each runs a short fixed time; scripts/fuzz.sh alone
# runs them long.
if [[ ${SDALLOC_SKIP_FUZZ:-0} != 1 ]]; then
  begin fuzz
  SDALLOC_BUILD_ROOT=$build_root "$root/scripts/fuzz.sh" --seconds "${SDALLOC_FUZZ_SECONDS:-15}" \
    --jobs "$jobs"
  end
fi

stage="summary"
echo
echo "test-all: ALL PASSED in $SECONDS s (${summary[*]})"
