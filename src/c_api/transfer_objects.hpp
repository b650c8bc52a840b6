// transfer_objects.hpp - what sdalloc_transfer.h's handles are (internal), so a front end
// of a higher layer (the PyTorch shim, which links the CUDA layer) can make engines and
// offloaders on another backend and hand them to the same C functions.
//
// An engine owns its copy backend (the host backend here; the shim gives it a
// cuda::CudaCopyBackend); an offloader owns its device memory (OffloadDevice: the resource
// stack the weights are loaded into, destroyed after the offloader that uses it). Request
// handles are numbers in the engine's table (transfer_api.cpp). A stream device owns a
// StreamDevice (the simulated one here, a CUDA one in the shim); a unit offload its
// UnitOffloader, which uses the stream device it was made on.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/sdalloc_transfer.h"
#include "sdalloc/transfer/copy_backend.hpp"
#include "sdalloc/transfer/simulated_device.hpp"
#include "sdalloc/transfer/stream_device.hpp"
#include "sdalloc/transfer/transfer_engine.hpp"
#include "sdalloc/transfer/unit_offloader.hpp"
#include "sdalloc/transfer/weight_offloader.hpp"

struct sdalloc_transfer_engine {
  std::unique_ptr<sdalloc::CopyBackend> backend;
  std::unique_ptr<sdalloc::TransferEngine> engine;  // declared after: destroyed first
  std::mutex mutex;
  std::map<sdalloc_transfer_t, sdalloc::TransferHandle> requests;
  sdalloc_transfer_t next = 1;
};

namespace sdalloc::c_api_detail {

// The memory an offloader loads weights into, with whatever it stands on.
class OffloadDevice {
 public:
  OffloadDevice() = default;
  OffloadDevice(const OffloadDevice&) = delete;
  OffloadDevice& operator=(const OffloadDevice&) = delete;
  virtual ~OffloadDevice() = default;
  virtual MemoryResource& memory() = 0;
  // Bytes the memory holds from its upstream now (its segments, cached blocks included).
  virtual std::size_t reserved_bytes() const = 0;
};

// A C struct's struct_size must be its size: the caller ran NAME_init first.
template <typename Struct>
void require_size(const Struct* s, const char* name) {
  if (s == nullptr) throw InvalidArgument("config is NULL");
  if (s->struct_size != sizeof(Struct)) {
    throw InvalidArgument(std::string(name) + "->struct_size is " + std::to_string(s->struct_size) +
                          ", not " + std::to_string(sizeof(Struct)) + ": call " + name +
                          "_init first");
  }
}

// The engine's options from a C config (already checked for its struct_size).
TransferEngineOptions engine_options(const sdalloc_transfer_config_t& config);
// The offloader's options from a C config (already checked for its struct_size).
OffloadOptions offload_options(const sdalloc_offload_config_t& config);

}  // namespace sdalloc::c_api_detail

struct sdalloc_offload {
  std::unique_ptr<sdalloc::c_api_detail::OffloadDevice> device;
  std::unique_ptr<sdalloc::WeightOffloader> offloader;  // declared after: destroyed first
};

// A device for unit offloads: the simulated one (made here) or a CUDA one (made by the
// shim); `simulated` is set for the first, for sdalloc_sim_*.
struct sdalloc_stream_device {
  std::unique_ptr<sdalloc::StreamDevice> device;
  sdalloc::SimulatedDevice* simulated = nullptr;
  std::atomic<std::uint64_t> check_failures{0};
};

struct sdalloc_unit_offload {
  std::unique_ptr<sdalloc::UnitOffloader> offloader;
};
