#!/usr/bin/env bash
# scripts/install-deps.sh - installs the Debian packages sdalloc builds and tests with.
#
# Idempotent and quick when everything is there (one dpkg query per package). Installs what
# is missing with apt-get when run as root (or through sudo when available); otherwise
# prints the apt-get line to run and fails. Called by scripts/run-main-job.sh,
# scripts/test-all.sh and .ci/run, so the README's commands work on a fresh machine.
set -euo pipefail

packages=(
  cmake ninja-build g++ gcc pkg-config       # build
  zlib1g-dev                                 # gzip traces (library)
  libcli11-dev nlohmann-json3-dev            # command-line tools
  libgtest-dev libgmock-dev libbenchmark-dev # tests and benchmarks
  clang-tidy clang-format                    # lint and format stages of scripts/test-all.sh
  clang libclang-rt-14-dev                   # the fuzz stage (libFuzzer, preset "fuzz")
  python3 python3-pytest python3-torch       # Python tests (through /usr/bin/python3)
  python3-build python3-setuptools          # the Python wheel (pyproject.toml), built and
  python3-wheel python3-venv python3-pip     #   installed offline by check-wheel.sh
  libopenblas0-openmp                        # torch's BLAS: without it libblas.so.3 is the
                                             #   reference BLAS (SD UNet forward 132 s, not ~10)
  chromium                                   # renders `sdalloc replay --report` in a test
  libtcmalloc-minimal4 libjemalloc2          # system allocators `sdalloc replay` compares
  libmimalloc2.0                             #   against (LD_PRELOAD in a child process)
  python3-torchvision                        # ResNet-50 exported for the ONNX Runtime tests
  libpython3.11-testsuite                    # other people's suites (tests/peers/run_peers.py):
  libonnx-testdata python3-onnx              #   CPython's regrtest, ONNX's backend test data
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$p")
done
# npm fetches ONNX Runtime (below; `npm pack` only). A nodejs from elsewhere (NodeSource)
# brings its own npm and conflicts with Debian's npm package: ask for it only when absent.
command -v npm >/dev/null || missing+=(npm)
# ONNX Runtime 1.29 (not in Debian): the npm package com.github.asus4.onnxruntime carries the
# Linux x64 library and the C headers. `npm pack` fetches the tarball (no npm install, no
# install scripts run); tar unpacks the two parts into the cache folder the build looks in
# (ONNXRUNTIME_ROOT's default, cmake/FindOnnxRuntime.cmake). Done once: skipped when present.
install_onnxruntime() {
  local root=${SDALLOC_DEPS:-$HOME/.cache/sdalloc}/onnxruntime-1.29.0
  [[ -f $root/lib/libonnxruntime.so.1 && -f $root/include/onnxruntime_c_api.h ]] && return 0
  command -v npm >/dev/null || { echo "install-deps: npm is needed for ONNX Runtime" >&2; return 1; }
  local tmp
  tmp=$(mktemp -d)
  echo "install-deps: fetching ONNX Runtime 1.29.0 (com.github.asus4.onnxruntime@0.4.9) into $root"
  (cd "$tmp" && npm pack --silent com.github.asus4.onnxruntime@0.4.9 >/dev/null)
  local headers=package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers
  tar -xzf "$tmp"/com.github.asus4.onnxruntime-0.4.9.tgz -C "$tmp" \
    package/Plugins/Linux/x64/libonnxruntime.so "$headers"
  mkdir -p "$root.partial/lib" "$root.partial/include"
  cp "$tmp"/package/Plugins/Linux/x64/libonnxruntime.so "$root.partial/lib/libonnxruntime.so.1"
  ln -sf libonnxruntime.so.1 "$root.partial/lib/libonnxruntime.so"
  cp "$tmp/$headers"/*.h "$root.partial/include/"
  rm -rf "$tmp" "$root"
  mv "$root.partial" "$root"  # whole or not at all: a broken fetch leaves no half folder
}

if [[ ${#missing[@]} -eq 0 ]]; then
  install_onnxruntime
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo_cmd=(sudo -n)
  else
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
install_onnxruntime
