// sdalloc/transfer/transfer_handle.hpp - the completion handle of one copy request.
//
// TransferEngine::copy() answers a TransferHandle at once; the copy itself runs later, on
// the engine's copy streams, packed with other requests into a few copy calls. The handle
// says where the request is (queued in the engine, submitted to the backend, done, failed,
// cancelled), waits for it, and cancels it while it is still queued.
//
// Invariants: a request ends exactly once, in kDone, kFailed or kCancelled, and never
// leaves that state. wait() on a queued request first flushes the engine's queue (so a
// wait never deadlocks on a batch nobody submits). Handles are cheap shared references;
// copying one does not copy the request. Thread-safe.
//
// Errors: wait() throws TransferError with the backend's reason when the copy failed, and
// TransferCancelled after a successful cancel(). Neither leaves the engine unusable.
#pragma once

#include <memory>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

// A copy the backend could not carry out (the device refused, the memory went away).
class TransferError : public Error {
 public:
  using Error::Error;
};

// wait() on a request that was cancelled before it was submitted.
class TransferCancelled : public TransferError {
 public:
  using TransferError::TransferError;
};

enum class TransferState { kQueued, kSubmitted, kDone, kFailed, kCancelled };
const char* to_string(TransferState state);

namespace transfer_detail {
struct RequestStatus;
}  // namespace transfer_detail

class TransferHandle {
 public:
  TransferHandle() = default;  // an empty handle: ready, nothing to wait for
  explicit TransferHandle(std::shared_ptr<transfer_detail::RequestStatus> status)
      : status_(std::move(status)) {}

  TransferState state() const;
  // True once the request ended (done, failed or cancelled). Never blocks.
  bool ready() const;
  // Blocks until the request ended; throws TransferError / TransferCancelled as above.
  void wait() const;
  // Cancels a request still queued in the engine and answers true; false when it was
  // already submitted (it then runs to its end) or had ended.
  bool cancel() const;
  // The failure's reason, empty unless the state is kFailed or kCancelled.
  std::string error() const;

  const std::shared_ptr<transfer_detail::RequestStatus>& status() const { return status_; }

 private:
  std::shared_ptr<transfer_detail::RequestStatus> status_;
};

}  // namespace sdalloc
