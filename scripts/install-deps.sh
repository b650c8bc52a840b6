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
  libopenblas0-openmp                        # torch's BLAS: without it libblas.so.3 is the
                                             #   reference BLAS (SD UNet forward 132 s, not ~10)
  chromium                                   # renders `sdalloc replay --report` in a test
  libtcmalloc-minimal4 libjemalloc2          # system allocators `sdalloc replay` compares
  libmimalloc2.0                             #   against (LD_PRELOAD in a child process)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

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
