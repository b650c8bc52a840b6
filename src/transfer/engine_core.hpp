// engine_core.hpp - the TransferEngine's shared state (internal): the request queue, the
// pinned ranges, the staging pool, and each request's status.
//
// Handles keep a weak reference to the core, so wait() on a queued request can flush the
// queue, and a handle outliving its engine still answers (the destructor ended every
// request). Lock order: flush_mutex_ (one flush at a time, so calls keep request order),
// then mutex_ (queue and books), then a status's own mutex; a backend's `done` takes only a
// status's mutex and the staging pool's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/transfer/transfer_engine.hpp"

namespace sdalloc::transfer_detail {

class EngineCore;

struct RequestStatus {
  std::mutex mutex;
  std::condition_variable changed;
  TransferState state = TransferState::kQueued;
  std::string error;
  std::size_t pending_calls = 0;     // calls still running for this request
  std::shared_ptr<CopyFence> fence;  // the last call submitted for it
  std::weak_ptr<EngineCore> core;

  bool ended() const {
    return state == TransferState::kDone || state == TransferState::kFailed ||
           state == TransferState::kCancelled;
  }
  // One of its calls ended: the request ends with the last (failed if any failed).
  void call_ended(const std::exception_ptr& error);
  void end(TransferState final_state, std::string reason);
};

struct Request {
  CopyKind kind;
  void* dst;
  const void* src;
  std::size_t bytes;
  std::shared_ptr<RequestStatus> status;
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  EngineCore(CopyBackend& backend, TransferEngineOptions options);
  ~EngineCore();

  TransferHandle copy(CopyKind kind, void* dst, const void* src, std::size_t bytes);
  void flush();
  void synchronize();
  void stream_wait(const TransferHandle& handle, Stream compute_stream);

  void register_host(void* ptr, std::size_t bytes);
  TransferHandle register_host_async(void* ptr, std::size_t bytes);
  void unregister_host(void* ptr);
  bool is_pinned(const void* ptr, std::size_t bytes) const;

  CopyBackend& backend() { return backend_; }
  StagingPool& staging() { return staging_; }
  const TransferEngineOptions& options() const { return options_; }
  TransferStats stats() const;
  void count_cancelled();

 private:
  bool is_pinned_locked(const void* ptr, std::size_t bytes) const;
  // Marks the requests submitted (dropping those cancelled meanwhile) and answers them.
  static std::vector<Request> claim(std::vector<Request> requests);
  void submit(CopyCall call, std::size_t copy_stream, const std::vector<Request>& requests);
  void flush_packed(CopyKind kind, const std::vector<Request>& group);
  void flush_large(const Request& request);
  std::size_t stream_of(CopyKind kind) const;

  CopyBackend& backend_;
  TransferEngineOptions options_;
  StagingPool staging_;
  std::mutex flush_mutex_;
  mutable std::mutex mutex_;
  std::vector<Request> queue_;
  std::size_t queued_bytes_ = 0;
  std::map<std::uintptr_t, std::size_t> pinned_;  // registered chunks: start -> bytes
  std::map<std::uintptr_t, std::vector<std::uintptr_t>> registrations_;  // base -> chunks
  struct RegisterJob {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    std::shared_ptr<RequestStatus> status;
  };
  void run_registrar();
  std::deque<RegisterJob> register_jobs_;
  std::map<std::uintptr_t, std::shared_ptr<RequestStatus>> registering_;
  std::condition_variable register_wake_;
  std::thread registrar_;
  bool stopping_ = false;
  TransferStats stats_;
};

}  // namespace sdalloc::transfer_detail
