#!/usr/bin/env bash
# scripts/gpu-bundle.sh - what scripts/gpu-check.sh needs on a GPU machine, built here (the CI
# machine, with the CUDA toolkit) into one folder to carry there, so nothing is built on the
# device and no GoogleTest, zlib headers or toolkit are needed there.
#
#   OUT/lib/libsdalloc_torch.so   the PyTorch shim (core and CUDA layer inside; cudart static)
#   OUT/lib/libsdalloc.so         the host library (the Python package's version, snapshots)
#   OUT/bin/sdalloc_cuda_tests    the CUDA layer's tests (GoogleTest linked in)
#   OUT/bin/sdalloc_transfer_gpu_bench  the transfer engine's bandwidth and offload tables
#   OUT/MANIFEST.txt              the commit, the build, each file's NEEDED libraries
#
# Invariant, checked (exit 1 otherwise): the shim and the test binary need nothing but libc,
# libstdc++, libgcc_s, libm and the dynamic loader (readelf -d NEEDED), and the shim was built
# with CUDA. libsdalloc.so may also need libz.so.1 (the core's trace reader links zlib);
# the GPU check loads it only for version strings and snapshots.
#
# Usage: scripts/gpu-bundle.sh [--build-dir DIR] [--out DIR] [--no-build]
#   --build-dir DIR  the build tree (default build/gpu-bundle-build: Release, CUDA on)
#   --out DIR        the bundle (default build/gpu-bundle; replaced)
#   --no-build       bundle the build tree as it is (e.g. CI's release build)
# Then on the device: scripts/gpu-check.sh --bundle DIR (carry DIR with the tree).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$root/build/gpu-bundle-build"
out="$root/build/gpu-bundle"
build=1

die() { echo "gpu-bundle: FAILED: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) [[ $# -ge 2 ]] || die "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

if [[ $build == 1 ]]; then
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    die "no CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)"
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DSDALLOC_WITH_CUDA=ON -DSDALLOC_BUILD_TESTS=ON -DSDALLOC_BUILD_BENCH=OFF \
    -DSDALLOC_BUILD_TOOLS=OFF || die "cmake configure failed"
  cmake --build "$build_dir" -j "${SDALLOC_JOBS:-$(nproc)}" \
    --target sdalloc sdalloc_torch sdalloc_cuda_tests sdalloc_transfer_gpu_bench || die "build failed"
  # The TensorRT forwarder's test exists only where CMake found TensorRT's headers.
  if grep -q 'sdalloc_tensorrt_tests' "$build_dir/build.ninja" "$build_dir/Makefile" 2>/dev/null; then
    cmake --build "$build_dir" -j "${SDALLOC_JOBS:-$(nproc)}" --target sdalloc_tensorrt_tests ||
      die "build failed (sdalloc_tensorrt_tests)"
  fi
fi

shim="$build_dir/src/torch_shim/libsdalloc_torch.so"
host="$build_dir/src/libsdalloc.so"
tests="$build_dir/tests/cuda/sdalloc_cuda_tests"
transfer="$build_dir/tests/cuda/sdalloc_transfer_gpu_bench"
for f in "$shim" "$host" "$tests" "$transfer"; do [[ -f $f ]] || die "missing $f (build it first)"; done
grep -q 'SDALLOC_TORCH_WITH_CUDA=1' "$build_dir/compile_commands.json" 2>/dev/null ||
  die "$shim was built without CUDA (CMake did not find the toolkit)"

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' '; }
allowed=" libc.so.6 libstdc++.so.6 libgcc_s.so.1 libm.so.6 ld-linux-x86-64.so.2 "
check_needed() {  # FILE EXTRA-ALLOWED
  local lib
  for lib in $(needed "$1"); do
    [[ $allowed == *" $lib "* || " $2 " == *" $lib "* ]] ||
      die "$(basename "$1") needs $lib (only libc, libstdc++, libgcc_s, libm allowed)"
  done
}
check_needed "$shim" ""
check_needed "$tests" ""
check_needed "$transfer" ""
check_needed "$host" "libz.so.1"

rm -rf "$out"
mkdir -p "$out/lib" "$out/bin"
cp "$shim" "$host" "$out/lib/"
cp "$tests" "$transfer" "$out/bin/"
trt_tests="$build_dir/tests/tensorrt/sdalloc_tensorrt_tests"
[[ -f $trt_tests ]] && cp "$trt_tests" "$out/bin/"  # gpu-check.sh's stage tensorrt
strip --strip-unneeded "$out/lib/"*.so "$out/bin/"* 2>/dev/null || true
{
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "built from $build_dir"
  for f in "$out/lib/"*.so "$out/bin/"*; do
    echo "$(basename "$f") $(stat -c %s "$f") bytes; needs: $(needed "$f")"
  done
} > "$out/MANIFEST.txt"
cat "$out/MANIFEST.txt"
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1)); on the device: scripts/gpu-check.sh --bundle $out"
