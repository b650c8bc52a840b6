// unit_table.hpp - the SD 1.5 UNet's offload units (sd_unet_units.csv, written by
// sd_unet_units.py from workloads/sd_unet.py on the meta device) and a step of it on the
// simulated device: what sdalloc_offload_bench and the offloader's tests run.
//
// A step's times come from two figures: T, the host's time to issue the whole step (a
// launch-bound step: each unit costs the host T x its share of the kernels), and the
// device's share of T (each unit's kernels take device_share x T x its share of the
// FLOPs). So the 1280-channel blocks, 84 % of the bytes and 32 % of the FLOPs, compute
// little for their bytes, and the high-resolution ones much.
//
// The images are filled with a pattern of their unit and offset; a kernel checks what it
// reads (sampled words, or all of them) against the pattern, on the device's thread when
// it runs, so a copy that landed late or a slot overwritten early is counted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sdalloc/transfer/simulated_device.hpp"
#include "sdalloc/transfer/unit_offloader.hpp"

namespace sdalloc::bench {

struct UnitRow {
  std::string name;
  std::size_t bytes = 0;
  double flops = 0;
  std::size_t kernels = 1;
  bool keep_resident = false;
};

inline std::vector<UnitRow> read_unit_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the unit table " + path);
  std::string line;
  std::getline(in, line);
  if (line.rfind("name,bytes,flops,kernels,keep_resident", 0) != 0) {
    throw std::runtime_error(path + ": not a unit table (header " + line + ")");
  }
  std::vector<UnitRow> rows;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string name, bytes, flops, kernels, keep;
    std::getline(fields, name, ',');
    std::getline(fields, bytes, ',');
    std::getline(fields, flops, ',');
    std::getline(fields, kernels, ',');
    std::getline(fields, keep, ',');
    rows.push_back(UnitRow{name, std::stoull(bytes), std::stod(flops),
                           std::max<std::size_t>(1, std::stoull(kernels)), keep == "1"});
  }
  if (rows.empty()) throw std::runtime_error(path + ": no units");
  return rows;
}

// The word at `index` of unit `unit`'s image.
inline std::uint64_t pattern(std::size_t unit, std::size_t index) {
  std::uint64_t x = (static_cast<std::uint64_t>(unit) << 40) ^ (index * 0x9E3779B97F4A7C15ULL);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 32);
}

inline void fill_image(std::byte* image, std::size_t unit, std::size_t bytes) {
  const std::size_t words = bytes / 8;
  for (std::size_t i = 0; i < words; ++i) {
    const std::uint64_t w = pattern(unit, i);
    std::memcpy(image + i * 8, &w, 8);
  }
}

// Whether `image` holds unit's pattern: every word, or `samples` spread over it.
inline bool image_is(const std::byte* image, std::size_t unit, std::size_t bytes,
                     std::size_t samples) {
  const std::size_t words = bytes / 8;
  if (words == 0) return true;
  const std::size_t stride = samples == 0 || samples >= words ? 1 : words / samples;
  for (std::size_t i = 0; i < words; i += stride) {
    std::uint64_t w = 0;
    std::memcpy(&w, image + i * 8, 8);
    if (w != pattern(unit, i)) return false;
  }
  std::uint64_t last = 0;
  std::memcpy(&last, image + (words - 1) * 8, 8);
  return last == pattern(unit, words - 1);
}

// One step's work per unit on the simulated device.
struct UnitWork {
  std::size_t bytes = 0;
  std::size_t kernels = 1;
  double host_seconds = 0;    // to launch all its kernels
  double device_seconds = 0;  // all its kernels on the device
  bool keep_resident = false;
};

// `rows` scaled: bytes / byte_scale (multiples of 256), times from T and the device share.
inline std::vector<UnitWork> unit_work(const std::vector<UnitRow>& rows, double step_seconds,
                                       double device_share, double byte_scale) {
  double flops = 0, kernels = 0;
  for (const UnitRow& r : rows) {
    flops += r.flops;
    kernels += static_cast<double>(r.kernels);
  }
  std::vector<UnitWork> work;
  for (const UnitRow& r : rows) {
    UnitWork w;
    const auto scaled = static_cast<std::size_t>(static_cast<double>(r.bytes) / byte_scale);
    w.bytes = std::max<std::size_t>(256, (scaled + 255) / 256 * 256);
    w.kernels = r.kernels;
    w.host_seconds = step_seconds * static_cast<double>(r.kernels) / kernels;
    w.device_seconds = device_share * step_seconds * r.flops / flops;
    w.keep_resident = r.keep_resident;
    work.push_back(w);
  }
  return work;
}

// Runs one step: for each unit in order, offloader->enter (when given) and its kernels,
// each checking (samples words; 0: all) the bytes it reads - the unit's device image, or
// `images[unit]` without an offloader. Counts mismatches in `bad`. Answers the step's
// time on the device's clock, up to the compute queue's end.
inline double run_step(SimulatedDevice& device, UnitOffloader* offloader,
                       const std::vector<UnitWork>& work, const std::vector<std::byte*>& images,
                       std::size_t samples, std::atomic<std::uint64_t>& bad) {
  const double start = device.host_seconds();
  if (offloader != nullptr) offloader->begin_step(device.compute_stream());
  for (std::size_t u = 0; u < work.size(); ++u) {
    if (offloader != nullptr) offloader->enter(u);
    const auto* image = static_cast<const std::byte*>(
        offloader != nullptr ? offloader->device_image(u) : images[u]);
    const std::size_t bytes = work[u].bytes;
    const auto k = static_cast<double>(work[u].kernels);
    for (std::size_t i = 0; i < work[u].kernels; ++i) {
      device.launch(work[u].host_seconds / k, work[u].device_seconds / k, [=, &bad] {
        if (!image_is(image, u, bytes, samples)) ++bad;
      });
    }
  }
  if (offloader != nullptr) offloader->end_step();
  device.synchronize(DeviceQueue::kCompute);
  return device.host_seconds() - start;
}

}  // namespace sdalloc::bench
