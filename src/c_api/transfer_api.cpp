// transfer_api.cpp - sdalloc_transfer.h: the TransferEngine and WeightOffloader for C (its
// stream devices and unit offloaders: unit_offload_api.cpp).
// Engines made here use the host copy backend and offloaders a CachingPool over host
// memory; the PyTorch shim makes CUDA ones (src/torch_shim/offload_api.cpp) that the same
// functions serve (the handles: transfer_objects.hpp). Every entry point runs through
// guarded() (boundary.hpp): no exception crosses. Request handles are numbers in a
// per-engine table, so a stale or foreign handle is refused (INVALID_POINTER) instead of
// being dereferenced.
#include "sdalloc/sdalloc_transfer.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/transfer_objects.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/transfer/host_copy_backend.hpp"
#include "sdalloc/transfer/transfer_engine.hpp"
#include "sdalloc/transfer/weight_offloader.hpp"

namespace sdalloc::c_api_detail {

TransferEngineOptions engine_options(const sdalloc_transfer_config_t& config) {
  TransferEngineOptions options;
  options.staging_budget = config.staging_budget;
  options.batch_bytes = config.batch_bytes;
  options.small_bytes = config.small_bytes;
  options.chunk_bytes = config.chunk_bytes;
  return options;
}

OffloadOptions offload_options(const sdalloc_offload_config_t& config) {
  return OffloadOptions{config.budget, config.prefetch, config.pin};
}

}  // namespace sdalloc::c_api_detail

namespace {

using sdalloc::c_api_detail::guarded;
using sdalloc::c_api_detail::require;
using sdalloc::c_api_detail::require_size;

// The host backend's "device" memory: a CachingPool over host memory.
class HostOffloadDevice final : public sdalloc::c_api_detail::OffloadDevice {
 public:
  sdalloc::MemoryResource& memory() override { return pool_; }
  std::size_t reserved_bytes() const override { return pool_.stats().reserved_bytes; }

 private:
  sdalloc::HostResource host_;
  sdalloc::CachingPool pool_{host_};
};

sdalloc_transfer_engine& engine_of(sdalloc_transfer_engine_t* engine) {
  require(engine != nullptr, "engine is NULL");
  return *engine;
}

sdalloc::TransferHandle handle_of(sdalloc_transfer_engine& e, sdalloc_transfer_t request) {
  const std::lock_guard lock(e.mutex);
  const auto it = e.requests.find(request);
  if (it == e.requests.end()) {
    throw sdalloc::InvalidPointer("no such transfer request (never made, or already waited for)");
  }
  return it->second;
}

sdalloc::WeightOffloader& offloader_of(sdalloc_offload_t* offload) {
  require(offload != nullptr, "offload is NULL");
  return *offload->offloader;
}

}  // namespace

extern "C" {

// The names in parentheses: the functions, not the header's macros of the same names.
void(sdalloc_transfer_config_init)(sdalloc_transfer_config_t* config) noexcept {
  sdalloc_transfer_config_init_sized(config, sizeof *config);
}

void sdalloc_transfer_config_init_sized(sdalloc_transfer_config_t* config,
                                        std::size_t struct_size) noexcept {
  const sdalloc::TransferEngineOptions defaults;
  sdalloc_transfer_config_t full;
  std::memset(&full, 0, sizeof full);  // padding too, so configs compare bytewise
  full.staging_budget = defaults.staging_budget;
  full.batch_bytes = defaults.batch_bytes;
  full.small_bytes = defaults.small_bytes;
  full.chunk_bytes = defaults.chunk_bytes;
  full.copy_streams = sdalloc::HostCopyBackendOptions{}.copy_streams;
  full.copy_bytes_per_second = 0;
  sdalloc::c_api_detail::copy_defaults(full, config, struct_size);
}

sdalloc_status_t sdalloc_transfer_engine_create(const sdalloc_transfer_config_t* config,
                                                sdalloc_transfer_engine_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_transfer_config");
    sdalloc::HostCopyBackendOptions backend;
    backend.copy_streams = config->copy_streams;
    backend.bytes_per_second = config->copy_bytes_per_second;
    auto made = std::make_unique<sdalloc_transfer_engine>();
    made->backend = std::make_unique<sdalloc::HostCopyBackend>(backend);
    made->engine = std::make_unique<sdalloc::TransferEngine>(
        *made->backend, sdalloc::c_api_detail::engine_options(*config));
    *out = made.release();
  });
}

void sdalloc_transfer_engine_destroy(sdalloc_transfer_engine_t* engine) noexcept {
  if (engine == nullptr) return;
  (void)guarded(__func__, [&] {
    engine->engine.reset();  // waits for every request
    delete engine;
  });
}

sdalloc_status_t sdalloc_transfer_copy(sdalloc_transfer_engine_t* engine, sdalloc_copy_kind_t kind,
                                       void* dst, const void* src, size_t bytes,
                                       sdalloc_transfer_t* out) noexcept {
  if (out != nullptr) *out = 0;
  return guarded(__func__, [&] {
    sdalloc_transfer_engine& e = engine_of(engine);
    require(out != nullptr, "out is NULL");
    const std::int32_t raw = sdalloc::c_api_detail::raw_value(kind);
    require(raw >= 0 && raw <= 2, "kind is not an sdalloc_copy_kind_t");
    sdalloc::TransferHandle handle =
        e.engine->copy(static_cast<sdalloc::CopyKind>(raw), dst, src, bytes);
    const std::lock_guard lock(e.mutex);
    const sdalloc_transfer_t id = e.next++;
    e.requests.emplace(id, std::move(handle));
    *out = id;
  });
}

sdalloc_status_t sdalloc_transfer_flush(sdalloc_transfer_engine_t* engine) noexcept {
  return guarded(__func__, [&] { engine_of(engine).engine->flush(); });
}

sdalloc_status_t sdalloc_transfer_synchronize(sdalloc_transfer_engine_t* engine) noexcept {
  return guarded(__func__, [&] { engine_of(engine).engine->synchronize(); });
}

sdalloc_status_t sdalloc_transfer_wait(sdalloc_transfer_engine_t* engine,
                                       sdalloc_transfer_t request) noexcept {
  return guarded(__func__, [&] {
    sdalloc_transfer_engine& e = engine_of(engine);
    const sdalloc::TransferHandle handle = handle_of(e, request);
    {
      const std::lock_guard lock(e.mutex);
      e.requests.erase(request);
    }
    handle.wait();
  });
}

sdalloc_status_t sdalloc_transfer_query(sdalloc_transfer_engine_t* engine,
                                        sdalloc_transfer_t request, int* done) noexcept {
  return guarded(__func__, [&] {
    require(done != nullptr, "done is NULL");
    *done = handle_of(engine_of(engine), request).ready() ? 1 : 0;
  });
}

sdalloc_status_t sdalloc_transfer_cancel(sdalloc_transfer_engine_t* engine,
                                         sdalloc_transfer_t request, int* cancelled) noexcept {
  return guarded(__func__, [&] {
    require(cancelled != nullptr, "cancelled is NULL");
    *cancelled = handle_of(engine_of(engine), request).cancel() ? 1 : 0;
  });
}

sdalloc_status_t sdalloc_transfer_register_host(sdalloc_transfer_engine_t* engine, void* ptr,
                                                size_t bytes) noexcept {
  return guarded(__func__, [&] { engine_of(engine).engine->register_host(ptr, bytes); });
}

sdalloc_status_t sdalloc_transfer_unregister_host(sdalloc_transfer_engine_t* engine,
                                                  void* ptr) noexcept {
  return guarded(__func__, [&] { engine_of(engine).engine->unregister_host(ptr); });
}

sdalloc_status_t sdalloc_transfer_staging_alloc(sdalloc_transfer_engine_t* engine, size_t bytes,
                                                void** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
    *out = engine_of(engine).engine->staging().allocate(bytes);
  });
}

sdalloc_status_t sdalloc_transfer_staging_free(sdalloc_transfer_engine_t* engine,
                                               void* ptr) noexcept {
  return guarded(__func__, [&] { engine_of(engine).engine->staging().deallocate(ptr); });
}

sdalloc_status_t sdalloc_transfer_stats(sdalloc_transfer_engine_t* engine,
                                        sdalloc_transfer_stats_t* out) noexcept {
  return guarded(__func__, [&] {
    require_size(out, "sdalloc_transfer_stats");
    sdalloc_transfer_engine& e = engine_of(engine);
    const sdalloc::TransferStats s = e.engine->stats();
    const sdalloc::StagingPoolStats staging = e.engine->staging().stats();
    *out = sdalloc_transfer_stats_t{sizeof *out,
                                    s.requests,
                                    s.bytes,
                                    s.calls,
                                    s.packed_requests,
                                    s.direct_requests,
                                    s.chunked_requests,
                                    s.failed_requests,
                                    s.cancelled_requests,
                                    staging.held_bytes,
                                    staging.peak_held_bytes};
  });
}

void(sdalloc_offload_config_init)(sdalloc_offload_config_t* config) noexcept {
  sdalloc_offload_config_init_sized(config, sizeof *config);
}

void sdalloc_offload_config_init_sized(sdalloc_offload_config_t* config,
                                       std::size_t struct_size) noexcept {
  const sdalloc::OffloadOptions defaults;
  sdalloc_offload_config_t full;
  std::memset(&full, 0, sizeof full);
  full.budget = defaults.budget;
  full.prefetch = defaults.prefetch;
  full.pin = defaults.pin;
  sdalloc::c_api_detail::copy_defaults(full, config, struct_size);
}

sdalloc_status_t sdalloc_offload_create(sdalloc_transfer_engine_t* engine,
                                        const sdalloc_offload_config_t* config,
                                        sdalloc_offload_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    sdalloc_transfer_engine& e = engine_of(engine);
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_offload_config");
    auto made = std::make_unique<sdalloc_offload>();
    made->device = std::make_unique<HostOffloadDevice>();
    made->offloader = std::make_unique<sdalloc::WeightOffloader>(
        *e.engine, made->device->memory(), sdalloc::c_api_detail::offload_options(*config));
    *out = made.release();
  });
}

void sdalloc_offload_destroy(sdalloc_offload_t* offload) noexcept {
  if (offload == nullptr) return;
  (void)guarded(__func__, [&] {
    offload->offloader.reset();
    delete offload;
  });
}

sdalloc_status_t sdalloc_offload_add_weight(sdalloc_offload_t* offload, const void* host,
                                            size_t bytes, size_t* id) noexcept {
  return guarded(__func__, [&] {
    require(id != nullptr, "id is NULL");
    *id = offloader_of(offload).add_weight(host, bytes);
  });
}

sdalloc_status_t sdalloc_offload_begin_step(sdalloc_offload_t* offload) noexcept {
  return guarded(__func__, [&] { offloader_of(offload).begin_step(); });
}

sdalloc_status_t sdalloc_offload_acquire(sdalloc_offload_t* offload, const size_t* ids,
                                         size_t count, void** device) noexcept {
  return guarded(__func__, [&] {
    require(count == 0 || (ids != nullptr && device != nullptr), "ids or device is NULL");
    const std::vector<void*> pointers =
        offloader_of(offload).acquire(std::span<const std::size_t>(ids, count));
    for (std::size_t i = 0; i < count; ++i) device[i] = pointers[i];
  });
}

sdalloc_status_t sdalloc_offload_end_step(sdalloc_offload_t* offload) noexcept {
  return guarded(__func__, [&] { offloader_of(offload).end_step(); });
}

sdalloc_status_t sdalloc_offload_stats(sdalloc_offload_t* offload,
                                       sdalloc_offload_stats_t* out) noexcept {
  return guarded(__func__, [&] {
    require_size(out, "sdalloc_offload_stats");
    const sdalloc::WeightOffloader& o = offloader_of(offload);
    const sdalloc::OffloadStats s = o.stats();
    *out = sdalloc_offload_stats_t{
        sizeof *out,     s.loads,          s.loaded_bytes,        s.evictions,
        s.waits,         s.recorded_steps, s.planned_steps,       s.divergent_steps,
        s.plans,         s.resident_bytes, s.peak_resident_bytes, o.options().budget,
        s.largest_weight};
  });
}

}  // extern "C"
