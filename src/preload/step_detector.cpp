// step_detector.cpp - StepDetector: the prefix function of the request string, and the lock.
#include "preload/step_detector.hpp"

#include "sdalloc/core/pool.hpp"

namespace sdalloc::preload {
namespace {
// The pools' rounding: sizes that round alike plan alike.
constexpr std::size_t kRounding = kPoolRounding;
}  // namespace

StepDetector::StepDetector() {
  keys_.reserve(kMaxLearned);
  prefix_.reserve(kMaxLearned);
  live_before_.reserve(kMaxLearned);
}

StepDetector::Action StepDetector::on_allocate(std::size_t bytes) {
  const std::int64_t live_before = live_++;
  if (period_ == 0) {
    learn((bytes + kRounding - 1) / kRounding, live_before);
    return Action::kNone;  // a lock counts from the next request on
  }
  // Locked: position_ requests until the next step begins (0: this one).
  if (position_ > 0) {
    --position_;
    return Action::kNone;
  }
  position_ = period_ - 1;
  if (!step_open_) {
    step_open_ = true;
    return Action::kBegin;
  }
  return Action::kEndAndBegin;
}

void StepDetector::push(std::uint64_t key, std::int64_t live_before) {
  const std::size_t n = keys_.size();
  keys_.push_back(key);
  live_before_.push_back(live_before);
  std::uint32_t j = n == 0 ? 0 : prefix_[n - 1];
  while (j > 0 && keys_[j] != key) j = prefix_[j - 1];
  if (n > 0 && keys_[j] == key) ++j;
  prefix_.push_back(j);
}

void StepDetector::learn(std::uint64_t key, std::int64_t live_before) {
  if (keys_.size() == kMaxLearned) restart();
  push(key, live_before);
  if (try_lock()) return;
  const std::size_t length = keys_.size();
  if (length < next_restart_) return;
  next_restart_ = next_restart_ * 2 > kMaxLearned ? kMaxLearned : next_restart_ * 2;
  const std::size_t period = length - prefix_.back();
  if (2 * period <= length) return;  // a period covers half: wait for the third repeat
  // No loop (yet): start again from the latest request of the last quarter made with the
  // fewest live. Once the loop runs, that is where its last step began (model loading only
  // grows, and its requests are then older), so what follows is whole periods.
  std::size_t from = length - length / 4;
  for (std::size_t i = from; i < length; ++i) {
    if (live_before_[i] <= live_before_[from]) from = i;
  }
  const std::vector<std::uint64_t> keys(keys_.begin() + static_cast<std::ptrdiff_t>(from),
                                        keys_.end());
  const std::vector<std::int64_t> lives(live_before_.begin() + static_cast<std::ptrdiff_t>(from),
                                        live_before_.end());
  restart();
  for (std::size_t i = 0; i < keys.size(); ++i) push(keys[i], lives[i]);
  try_lock();
}

bool StepDetector::try_lock() {
  const std::size_t length = keys_.size();
  const std::size_t period = length - prefix_.back();
  // Three periods, and a balanced one: the live count a period ago was what it is now (model
  // loading repeats its shapes too, but what it allocates stays).
  if (period < kMinPeriod || length < kRepeats * period ||
      live_before_[length - 1] != live_before_[length - 1 - period]) {
    return false;
  }
  // The step begins at the request of the last period with the fewest live.
  std::size_t best = length - period;
  for (std::size_t i = length - period; i < length; ++i) {
    if (live_before_[i] < live_before_[best]) best = i;
  }
  period_ = period;
  position_ = best + period - length;  // the next request is index `length`
  step_open_ = false;
  divergent_run_ = 0;
  ++locks_;
  restart();
  return true;
}

void StepDetector::restart() {
  keys_.clear();
  prefix_.clear();
  live_before_.clear();
}

StepDetector::Action StepDetector::step_ended(bool divergent) {
  divergent_run_ = divergent ? divergent_run_ + 1 : 0;
  if (divergent_run_ < kMaxDivergentRun) return Action::kNone;
  unlock();
  return Action::kEnd;
}

void StepDetector::unlock() {
  period_ = 0;
  position_ = 0;
  step_open_ = false;
  divergent_run_ = 0;
  next_restart_ = kFirstRestart;
  restart();
}

}  // namespace sdalloc::preload
