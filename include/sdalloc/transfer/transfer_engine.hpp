// sdalloc/transfer/transfer_engine.hpp - batched asynchronous host<->device copies.
//
// TransferEngine takes copy requests (host->device, device->host, device->device), queues
// them, and on flush() moves them in few copy calls on its backend's copy streams:
//  - small requests (<= small_bytes) are packed: their host sides gathered into one pinned
//    staging buffer of up to batch_bytes and moved in one call (device->host: one call into
//    staging, then scattered to the host destinations); device->device ones go as one call;
//  - large requests go directly when their host side is pinned (registered with
//    register_host, or a staging block), and through staging chunks of chunk_bytes when it
//    is pageable: the next chunk is gathered while the previous one is copied, the staging
//    budget bounding how many are in flight.
// Host->device and device->device copies run on copy stream 0, device->host on stream 1
// (when the backend has two), so uploads and downloads overlap each other and the caller's
// compute. Each request answers a TransferHandle (wait, query, cancel); stream_wait makes a
// compute stream wait for one (an event on CUDA). The queue is flushed by flush(), by
// synchronize(), when it holds batch_bytes, and by wait() on a queued handle.
//
// Pinned memory: staging() is a StagingPool over the backend's pinned host memory (exact
// sizes, capped by staging_budget). register_host() page-locks memory the user has (an
// mmapped weights file) in place; register_host_async() does it on a background thread in
// chunks (cudaHostRegister runs at ~1-2 GB/s), and copies use staging until it is done.
// map() gives mapped host memory the device reads directly (data read once).
//
// Bookkeeping: a copy whose host side lies in a staging block that was freed is refused
// (InvalidPointer) before anything is queued. A failed call fails the requests in it
// (TransferError from wait()); the engine stays usable. The destructor waits for every
// request. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/transfer/copy_backend.hpp"
#include "sdalloc/transfer/staging_pool.hpp"
#include "sdalloc/transfer/transfer_handle.hpp"

namespace sdalloc {

struct TransferEngineOptions {
  std::size_t staging_budget = std::size_t{256} << 20;       // pinned staging pool's cap
  std::size_t batch_bytes = std::size_t{16} << 20;           // one packed call moves up to this
  std::size_t small_bytes = std::size_t{1} << 20;            // at or below: packed
  std::size_t chunk_bytes = std::size_t{8} << 20;            // pageable large copies, per chunk
  std::size_t register_chunk_bytes = std::size_t{64} << 20;  // register_host_async's step
};

struct TransferStats {
  std::uint64_t requests = 0;          // copy() calls accepted
  std::uint64_t bytes = 0;             // bytes requested
  std::uint64_t calls = 0;             // copy calls this engine submitted
  std::uint64_t packed_requests = 0;   // small requests moved in packed calls
  std::uint64_t direct_requests = 0;   // large requests with a pinned host side
  std::uint64_t chunked_requests = 0;  // large pageable requests through staging chunks
  std::uint64_t failed_requests = 0;
  std::uint64_t cancelled_requests = 0;
};

namespace transfer_detail {
class EngineCore;
}  // namespace transfer_detail

class TransferEngine {
 public:
  explicit TransferEngine(CopyBackend& backend, TransferEngineOptions options = {});
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;
  ~TransferEngine();

  TransferHandle copy(CopyKind kind, void* dst, const void* src, std::size_t bytes);
  void flush();
  void synchronize();  // flush, then wait for every request
  void stream_wait(const TransferHandle& handle, Stream compute_stream);

  void register_host(void* ptr, std::size_t bytes);
  TransferHandle register_host_async(void* ptr, std::size_t bytes);
  void unregister_host(void* ptr);  // the base given to register_host(_async)
  bool is_pinned(const void* ptr, std::size_t bytes) const;

  MappedBuffer map(std::size_t bytes);
  void unmap(const MappedBuffer& buffer);

  StagingPool& staging();
  CopyBackend& backend();
  const TransferEngineOptions& options() const;
  TransferStats stats() const;

 private:
  std::shared_ptr<transfer_detail::EngineCore> core_;
};

}  // namespace sdalloc
