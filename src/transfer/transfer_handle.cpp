// transfer_handle.cpp - a request's status: its one ending, waiting, cancelling.
#include "sdalloc/transfer/transfer_handle.hpp"

#include "transfer/engine_core.hpp"

namespace sdalloc {

const char* to_string(TransferState state) {
  switch (state) {
    case TransferState::kQueued:
      return "queued";
    case TransferState::kSubmitted:
      return "submitted";
    case TransferState::kDone:
      return "done";
    case TransferState::kFailed:
      return "failed";
    case TransferState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace transfer_detail {

void RequestStatus::end(TransferState final_state, std::string reason) {
  {
    const std::lock_guard lock(mutex);
    if (ended()) return;
    state = final_state;
    error = std::move(reason);
  }
  changed.notify_all();
}

void RequestStatus::call_ended(const std::exception_ptr& failure) {
  {
    const std::lock_guard lock(mutex);
    if (failure && error.empty()) {
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown failure of a copy call";
      }
    }
    if (pending_calls > 0) --pending_calls;
    if (pending_calls > 0 || ended()) return;
    state = error.empty() ? TransferState::kDone : TransferState::kFailed;
  }
  changed.notify_all();
}

}  // namespace transfer_detail

TransferState TransferHandle::state() const {
  if (!status_) return TransferState::kDone;
  const std::lock_guard lock(status_->mutex);
  return status_->state;
}

bool TransferHandle::ready() const {
  if (!status_) return true;
  const std::lock_guard lock(status_->mutex);
  return status_->ended();
}

void TransferHandle::wait() const {
  if (!status_) return;
  bool queued = false;
  {
    const std::lock_guard lock(status_->mutex);
    queued = status_->state == TransferState::kQueued;
  }
  if (queued) {
    if (const auto core = status_->core.lock()) core->flush();
  }
  std::unique_lock lock(status_->mutex);
  status_->changed.wait(lock, [&] { return status_->ended(); });
  if (status_->state == TransferState::kFailed) throw TransferError(status_->error);
  if (status_->state == TransferState::kCancelled) throw TransferCancelled(status_->error);
}

bool TransferHandle::cancel() const {
  if (!status_) return false;
  {
    const std::lock_guard lock(status_->mutex);
    if (status_->state != TransferState::kQueued) return false;
    status_->state = TransferState::kCancelled;
    status_->error = "the copy request was cancelled before it was submitted";
  }
  status_->changed.notify_all();
  if (const auto core = status_->core.lock()) core->count_cancelled();
  return true;
}

std::string TransferHandle::error() const {
  if (!status_) return {};
  const std::lock_guard lock(status_->mutex);
  return status_->error;
}

}  // namespace sdalloc
