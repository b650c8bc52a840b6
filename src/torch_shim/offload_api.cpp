// offload_api.cpp - the transfer engine and weight offload on a CUDA device, for C and the
// Python package (sdalloc/torch_shim.h, "weight offload on a CUDA device").
//
// The C API layer may not include the CUDA layer (equal rank), so engines and offloaders
// on the CUDA backend are made here, in the shim that links both, and handed to the
// sdalloc_transfer.h functions this library carries (the handles: c_api/transfer_objects.hpp).
//
// What an offloader made here is (the rules CUDA documents, and why):
//  - its engine is a cuda::CudaCopyBackend: copies on non-blocking copy streams, an event
//    recorded after each call; weights are registered in place (cudaHostRegister) in the
//    background, and go through pinned staging until that is done;
//  - its device memory is a CachingPool over cudaMalloc with CudaStreamEvents, capped at
//    budget + max(budget / 4, 64 MiB) by a LimitResource: loads allocate on the copy stream
//    and evictions free on the compute stream, so a block returns to the loads only after
//    an event recorded on the compute stream at the eviction has completed (the layers that
//    read the weight, queued before the eviction, are done). When the cap is reached the
//    pool waits for those events (cudaEventSynchronize) before it grows: this is what keeps
//    the host from running more than the cap ahead of the device;
//  - stream_ordered with compute_stream: acquire makes the compute stream wait for each
//    load's event (cudaStreamWaitEvent) instead of blocking the host.
// sdalloc_torch_stream_device_create_cuda makes the unit offloader's device instead
// (sdalloc_unit_offload_*, sdalloc/transfer/unit_offloader.hpp): a cuda::CudaStreamDevice
// on the caller's compute stream - no pool, one cudaMalloc'd region, events only.
// Every entry point runs through the C API's guarded(): messages go to this library's
// sdalloc_last_error(), like those of the sdalloc_transfer.h functions used with them.
#include <algorithm>
#include <memory>
#include <string>

#include "c_api/boundary.hpp"
#include "c_api/transfer_objects.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/torch_shim.h"

#if SDALLOC_TORCH_WITH_CUDA
#include "sdalloc/cuda/cuda_copy_backend.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_device.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/runtime.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/limit_resource.hpp"
#endif

namespace {

using sdalloc::c_api_detail::guarded;
using sdalloc::c_api_detail::require;
using sdalloc::c_api_detail::require_size;

#if SDALLOC_TORCH_WITH_CUDA
constexpr std::size_t kMinSlack = std::size_t{64} << 20;

// Why CUDA cannot serve an offload here, or "" when it can.
std::string unusable(int device) {
  if (!sdalloc::cuda::available()) {
    return "CUDA is not usable here: " + sdalloc::cuda::unavailable_reason();
  }
  const int count = sdalloc::cuda::device_count();
  if (device < 0 || device >= count) {
    return "CUDA device " + std::to_string(device) + " does not exist (this machine has " +
           std::to_string(count) + ")";
  }
  return "";
}

// The offloader's device memory on a CUDA device (see the file comment). Members are
// destroyed in reverse: the pool before the events it uses and the memory under it.
class CudaOffloadDevice final : public sdalloc::c_api_detail::OffloadDevice {
 public:
  CudaOffloadDevice(int device, std::size_t cap)
      : memory_(device), limit_(memory_, cap), events_(device), pool_(limit_, options(events_)) {}
  sdalloc::MemoryResource& memory() override { return pool_; }
  std::size_t reserved_bytes() const override { return pool_.stats().reserved_bytes; }

 private:
  static sdalloc::CachingPoolOptions options(sdalloc::cuda::CudaStreamEvents& events) {
    sdalloc::CachingPoolOptions o;
    o.stream_events = &events;
    return o;
  }
  sdalloc::cuda::CudaResource memory_;
  sdalloc::LimitResource limit_;
  sdalloc::cuda::CudaStreamEvents events_;
  sdalloc::CachingPool pool_;
};
#else
[[noreturn]] void refuse_without_cuda() {
  throw sdalloc::InvalidArgument(
      "this libsdalloc_torch.so was built without CUDA: weights can be offloaded to a CUDA "
      "device only by a build with the CUDA toolkit (the host backend, "
      "sdalloc_transfer_engine_create, needs none)");
}
#endif

}  // namespace

extern "C" {

sdalloc_status_t sdalloc_torch_transfer_engine_create_cuda(
    const sdalloc_transfer_config_t* config, int device, sdalloc_transfer_engine_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_transfer_config");
#if SDALLOC_TORCH_WITH_CUDA
    if (const std::string why = unusable(device); !why.empty()) {
      throw sdalloc::InvalidArgument("no CUDA device to offload to: " + why);
    }
    sdalloc::cuda::CudaCopyBackendOptions backend;
    backend.device = device;
    auto made = std::make_unique<sdalloc_transfer_engine>();
    made->backend = std::make_unique<sdalloc::cuda::CudaCopyBackend>(backend);
    made->engine = std::make_unique<sdalloc::TransferEngine>(
        *made->backend, sdalloc::c_api_detail::engine_options(*config));
    *out = made.release();
#else
    (void)device;
    refuse_without_cuda();
#endif
  });
}

sdalloc_status_t sdalloc_torch_offload_create_cuda(sdalloc_transfer_engine_t* engine,
                                                   const sdalloc_offload_config_t* config,
                                                   int device, cudaStream_t compute_stream,
                                                   sdalloc_offload_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(engine != nullptr, "engine is NULL");
    require(out != nullptr, "out is NULL");
    require_size(config, "sdalloc_offload_config");
#if SDALLOC_TORCH_WITH_CUDA
    const auto* backend =
        dynamic_cast<const sdalloc::cuda::CudaCopyBackend*>(engine->backend.get());
    if (backend == nullptr) {
      throw sdalloc::InvalidArgument(
          "the engine is not on the CUDA backend (make it with "
          "sdalloc_torch_transfer_engine_create_cuda)");
    }
    if (backend->name() != "cuda_copy(device " + std::to_string(device) + ")") {
      throw sdalloc::InvalidArgument("the engine copies to " + backend->name() +
                                     ", not to CUDA device " + std::to_string(device));
    }
    if (const std::string why = unusable(device); !why.empty()) {
      throw sdalloc::InvalidArgument("no CUDA device to offload to: " + why);
    }
    sdalloc::OffloadOptions options = sdalloc::c_api_detail::offload_options(*config);
    // Checked before the cap is computed from it (the offloader says the same).
    if (options.budget == 0) throw sdalloc::InvalidArgument("the budget is 0 bytes");
    options.stream_ordered = true;
    options.compute_stream = sdalloc::Stream::from_native(compute_stream);
    const std::size_t slack = std::max(options.budget / 4, kMinSlack);
    auto made = std::make_unique<sdalloc_offload>();
    made->device = std::make_unique<CudaOffloadDevice>(device, options.budget + slack);
    made->offloader = std::make_unique<sdalloc::WeightOffloader>(*engine->engine,
                                                                 made->device->memory(), options);
    *out = made.release();
#else
    (void)device;
    (void)compute_stream;
    refuse_without_cuda();
#endif
  });
}

sdalloc_status_t sdalloc_torch_stream_device_create_cuda(int device, cudaStream_t compute_stream,
                                                         sdalloc_stream_device_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
#if SDALLOC_TORCH_WITH_CUDA
    if (const std::string why = unusable(device); !why.empty()) {
      throw sdalloc::InvalidArgument("no CUDA device to offload to: " + why);
    }
    sdalloc::cuda::CudaStreamDeviceOptions options;
    options.device = device;
    options.compute_stream = compute_stream;
    auto made = std::make_unique<sdalloc_stream_device>();
    made->device = std::make_unique<sdalloc::cuda::CudaStreamDevice>(options);
    *out = made.release();
#else
    (void)device;
    (void)compute_stream;
    refuse_without_cuda();
#endif
  });
}

sdalloc_status_t sdalloc_torch_offload_reserved_bytes(sdalloc_offload_t* offload,
                                                      size_t* reserved) noexcept {
  return guarded(__func__, [&] {
    require(offload != nullptr, "offload is NULL");
    require(reserved != nullptr, "reserved is NULL");
    *reserved = offload->device->reserved_bytes();
  });
}

}  // extern "C"
