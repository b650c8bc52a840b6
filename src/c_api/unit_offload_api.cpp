// unit_offload_api.cpp - sdalloc_transfer.h's stream devices and unit offloaders for C: the
// simulated device (the host's stand-in for a GPU) and UnitOffloader over any StreamDevice;
// the PyTorch shim makes CUDA devices (src/torch_shim/offload_api.cpp) that the same
// functions serve (the handles: transfer_objects.hpp). Every entry point runs through
// guarded() (boundary.hpp): no exception crosses.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "c_api/boundary.hpp"
#include "c_api/transfer_objects.hpp"
#include "sdalloc/sdalloc_transfer.h"
#include "sdalloc/transfer/simulated_device.hpp"
#include "sdalloc/transfer/unit_offloader.hpp"

namespace {

using sdalloc::c_api_detail::guarded;
using sdalloc::c_api_detail::require;
using sdalloc::c_api_detail::require_size;

sdalloc_stream_device& device_of(sdalloc_stream_device_t* device) {
  require(device != nullptr, "device is NULL");
  return *device;
}

sdalloc::SimulatedDevice& simulated_of(sdalloc_stream_device_t* device) {
  sdalloc_stream_device& d = device_of(device);
  require(d.simulated != nullptr, "the device is not the simulated device");
  return *d.simulated;
}

sdalloc::UnitOffloader& unit_offloader_of(sdalloc_unit_offload_t* offload) {
  require(offload != nullptr, "offload is NULL");
  return *offload->offloader;
}

// Whether `bytes` at `reads` equal those at `expected`: 64 words spread over them, the last.
bool same_bytes(const void* reads, const void* expected, std::size_t bytes) {
  const auto* a = static_cast<const unsigned char*>(reads);
  const auto* b = static_cast<const unsigned char*>(expected);
  if (bytes <= 512) return std::memcmp(a, b, bytes) == 0;
  const std::size_t stride = (bytes - 8) / 64;
  for (std::size_t at = 0; at + 8 <= bytes; at += stride) {
    if (std::memcmp(a + at, b + at, 8) != 0) return false;
  }
  return std::memcmp(a + bytes - 8, b + bytes - 8, 8) == 0;
}

}  // namespace

extern "C" {

void(sdalloc_sim_device_config_init)(sdalloc_sim_device_config_t* config) noexcept {
  sdalloc_sim_device_config_init_sized(config, sizeof *config);
}

void sdalloc_sim_device_config_init_sized(sdalloc_sim_device_config_t* config,
                                          std::size_t struct_size) noexcept {
  sdalloc_sim_device_config_t full;
  std::memset(&full, 0, sizeof full);
  full.host_compute = true;
  sdalloc::c_api_detail::copy_defaults(full, config, struct_size);
}

sdalloc_status_t sdalloc_sim_device_create(const sdalloc_sim_device_config_t* config,
                                           sdalloc_stream_device_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_sim_device_config");
    sdalloc::SimulatedDeviceOptions o;
    o.copy_bytes_per_second = config->copy_bytes_per_second;
    o.seconds_per_copy = config->seconds_per_copy;
    o.seconds_per_call = config->seconds_per_call;
    o.host_compute = config->host_compute;
    auto made = std::make_unique<sdalloc_stream_device>();
    auto device = std::make_unique<sdalloc::SimulatedDevice>(o);
    made->simulated = device.get();
    made->device = std::move(device);
    *out = made.release();
  });
}

void sdalloc_stream_device_destroy(sdalloc_stream_device_t* device) noexcept {
  if (device == nullptr) return;
  (void)guarded(__func__, [&] { delete device; });
}

sdalloc_status_t sdalloc_stream_device_compute_stream(sdalloc_stream_device_t* device,
                                                      sdalloc_stream_t* stream) noexcept {
  return guarded(__func__, [&] {
    require(stream != nullptr, "stream is NULL");
    *stream = device_of(device).device->compute_stream().as_native<void>();
  });
}

sdalloc_status_t sdalloc_stream_device_synchronize(sdalloc_stream_device_t* device) noexcept {
  return guarded(__func__,
                 [&] { device_of(device).device->synchronize(sdalloc::DeviceQueue::kCompute); });
}

sdalloc_status_t sdalloc_sim_launch(sdalloc_stream_device_t* device, double host_seconds,
                                    double device_seconds, const void* reads, const void* expected,
                                    size_t bytes) noexcept {
  return guarded(__func__, [&] {
    sdalloc::SimulatedDevice& sim = simulated_of(device);
    require(host_seconds >= 0 && device_seconds >= 0, "a negative time");
    if (reads == nullptr || expected == nullptr || bytes == 0) {
      sim.launch(host_seconds, device_seconds);
      return;
    }
    std::atomic<std::uint64_t>* failures = &device->check_failures;
    sim.launch(host_seconds, device_seconds, [=] {
      if (!same_bytes(reads, expected, bytes)) ++*failures;
    });
  });
}

sdalloc_status_t sdalloc_sim_host_seconds(sdalloc_stream_device_t* device,
                                          double* seconds) noexcept {
  return guarded(__func__, [&] {
    require(seconds != nullptr, "seconds is NULL");
    *seconds = simulated_of(device).host_seconds();
  });
}

sdalloc_status_t sdalloc_sim_device_stats(sdalloc_stream_device_t* device,
                                          sdalloc_sim_device_stats_t* out) noexcept {
  return guarded(__func__, [&] {
    require_size(out, "sdalloc_sim_device_stats");
    const sdalloc::SimulatedDeviceCounters c = simulated_of(device).counters();
    *out = sdalloc_sim_device_stats_t{sizeof *out,
                                      c.kernels,
                                      c.copy_calls,
                                      c.copied_bytes,
                                      c.pageable_copies,
                                      c.calls,
                                      c.host_waits,
                                      c.device_allocations,
                                      device->check_failures.load(),
                                      c.device_bytes,
                                      c.locked_bytes};
  });
}

void(sdalloc_unit_offload_config_init)(sdalloc_unit_offload_config_t* config) noexcept {
  sdalloc_unit_offload_config_init_sized(config, sizeof *config);
}

void sdalloc_unit_offload_config_init_sized(sdalloc_unit_offload_config_t* config,
                                            std::size_t struct_size) noexcept {
  const sdalloc::UnitOffloadOptions defaults;
  sdalloc_unit_offload_config_t full;
  std::memset(&full, 0, sizeof full);
  full.budget = defaults.budget;
  full.pin = defaults.pin;
  full.register_chunk_bytes = defaults.register_chunk_bytes;
  full.staging_chunk_bytes = defaults.staging_chunk_bytes;
  sdalloc::c_api_detail::copy_defaults(full, config, struct_size);
}

sdalloc_status_t sdalloc_unit_offload_create(sdalloc_stream_device_t* device,
                                             const sdalloc_unit_offload_config_t* config,
                                             sdalloc_unit_offload_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    sdalloc_stream_device& d = device_of(device);
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_unit_offload_config");
    sdalloc::UnitOffloadOptions o;
    o.budget = config->budget;
    o.pin = config->pin;
    o.register_chunk_bytes = config->register_chunk_bytes;
    o.staging_chunk_bytes = config->staging_chunk_bytes;
    auto made = std::make_unique<sdalloc_unit_offload>();
    made->offloader = std::make_unique<sdalloc::UnitOffloader>(*d.device, o);
    *out = made.release();
  });
}

void sdalloc_unit_offload_destroy(sdalloc_unit_offload_t* offload) noexcept {
  if (offload == nullptr) return;
  (void)guarded(__func__, [&] { delete offload; });
}

sdalloc_status_t sdalloc_unit_offload_add_unit(sdalloc_unit_offload_t* offload, size_t bytes,
                                               int keep_resident, size_t* id) noexcept {
  return guarded(__func__, [&] {
    require(id != nullptr, "id is NULL");
    *id = unit_offloader_of(offload).add_unit(bytes, keep_resident != 0);
  });
}

sdalloc_status_t sdalloc_unit_offload_seal(sdalloc_unit_offload_t* offload) noexcept {
  return guarded(__func__, [&] { unit_offloader_of(offload).seal(); });
}

sdalloc_status_t sdalloc_unit_offload_host_image(sdalloc_unit_offload_t* offload, size_t unit,
                                                 void** host) noexcept {
  return guarded(__func__, [&] {
    require(host != nullptr, "host is NULL");
    *host = unit_offloader_of(offload).host_image(unit);
  });
}

sdalloc_status_t sdalloc_unit_offload_device_image(sdalloc_unit_offload_t* offload, size_t unit,
                                                   void** device) noexcept {
  return guarded(__func__, [&] {
    require(device != nullptr, "device is NULL");
    *device = unit_offloader_of(offload).device_image(unit);
  });
}

sdalloc_status_t sdalloc_unit_offload_layout(sdalloc_unit_offload_t* offload, uint64_t* version,
                                             int* planned) noexcept {
  return guarded(__func__, [&] {
    require(version != nullptr && planned != nullptr, "version or planned is NULL");
    const sdalloc::UnitOffloader& o = unit_offloader_of(offload);
    *version = o.layout_version();
    *planned = o.planned() ? 1 : 0;
  });
}

sdalloc_status_t sdalloc_unit_offload_streamed(sdalloc_unit_offload_t* offload, size_t unit,
                                               int* streamed) noexcept {
  return guarded(__func__, [&] {
    require(streamed != nullptr, "streamed is NULL");
    *streamed = unit_offloader_of(offload).streamed(unit) ? 1 : 0;
  });
}

sdalloc_status_t sdalloc_unit_offload_begin_step(sdalloc_unit_offload_t* offload,
                                                 sdalloc_stream_t stream) noexcept {
  return guarded(__func__, [&] {
    unit_offloader_of(offload).begin_step(sdalloc::c_api_detail::stream_of(stream));
  });
}

sdalloc_status_t sdalloc_unit_offload_enter(sdalloc_unit_offload_t* offload, size_t unit) noexcept {
  return guarded(__func__, [&] { unit_offloader_of(offload).enter(unit); });
}

sdalloc_status_t sdalloc_unit_offload_end_step(sdalloc_unit_offload_t* offload) noexcept {
  return guarded(__func__, [&] { unit_offloader_of(offload).end_step(); });
}

sdalloc_status_t sdalloc_unit_offload_record_next(sdalloc_unit_offload_t* offload) noexcept {
  return guarded(__func__, [&] { unit_offloader_of(offload).record_next_step(); });
}

sdalloc_status_t sdalloc_unit_offload_stats(sdalloc_unit_offload_t* offload,
                                            sdalloc_unit_offload_stats_t* out) noexcept {
  return guarded(__func__, [&] {
    require_size(out, "sdalloc_unit_offload_stats");
    const sdalloc::UnitOffloader& o = unit_offloader_of(offload);
    const sdalloc::UnitOffloadStats s = o.stats();
    sdalloc_unit_offload_stats_t r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.steps = s.steps;
    r.recorded_steps = s.recorded_steps;
    r.planned_steps = s.planned_steps;
    r.divergent_steps = s.divergent_steps;
    r.plans = s.plans;
    r.copies = s.copies;
    r.copied_bytes = s.copied_bytes;
    r.staged_copies = s.staged_copies;
    r.host_waits = s.host_waits;
    r.device_allocations = s.device_allocations;
    r.layout_version = s.layout_version;
    r.units = s.units;
    r.streamed_units = s.streamed_units;
    r.model_bytes = s.model_bytes;
    r.resident_bytes = s.resident_bytes;
    r.ring_bytes = s.ring_bytes;
    r.region_bytes = s.region_bytes;
    r.streamed_bytes = s.streamed_bytes;
    r.registered_bytes = s.registered_bytes;
    r.arena_bytes_in_ram = o.arena().resident_bytes();
    r.registration_refused = s.registration_refused ? 1 : 0;
    r.planned = o.planned() ? 1 : 0;
    r.compute_seconds = s.compute_seconds;
    r.predicted_step_seconds = s.predicted_step_seconds;
    r.floor_seconds = s.floor_seconds;
    r.ideal_floor_seconds = s.ideal_floor_seconds;
    r.copy_bytes_per_second = s.copy_bytes_per_second;
    r.seconds_per_copy = s.seconds_per_copy;
    *out = r;
  });
}

sdalloc_status_t sdalloc_unit_offload_describe(sdalloc_unit_offload_t* offload, char* text,
                                               size_t size, size_t* needed) noexcept {
  return guarded(__func__, [&] {
    require(text != nullptr || size == 0, "text is NULL");
    const sdalloc::UnitOffloader& o = unit_offloader_of(offload);
    std::string out = o.planned() ? o.plan().describe() : "not planned yet (a step is recorded)";
    const std::string refusal = o.registration_refusal();
    if (!refusal.empty()) out += "; registration: " + refusal + " (those units are staged)";
    if (needed != nullptr) *needed = out.size() + 1;
    if (size == 0) return;
    const std::size_t n = std::min(size - 1, out.size());
    std::memcpy(text, out.data(), n);
    text[n] = '\0';
  });
}

}  // extern "C"
