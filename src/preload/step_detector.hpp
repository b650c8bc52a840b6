// step_detector.hpp - finds the step of an inference loop in the drop-in's stream of requests.
//
// Under LD_PRELOAD nobody calls begin_step(), but an inference loop repeats its sequence of
// large requests step after step (a denoiser's steps do, byte for byte). StepDetector watches
// that sequence (mode:planned) and says where steps begin, so the PlannedArena can record one,
// plan it and serve the next ones from its arena.
//
// The period: the sizes (rounded as the pools round) since a start point are a string; its
// prefix function (KMP, amortised O(1) per request) gives the string's smallest period at
// every length. Once the string is three periods long (a block repeated twice inside a step
// is not a period of the string, so it is never taken for the step), the detector locks.
// When the string has no period covering half of it at a length of 64, 128, 256, ...
// (doubling: a long step still gets its three periods), the start point moves to the latest
// request of its last quarter made with the fewest allocations live (rebuilt from there),
// so the requests of model loading are dropped and the start falls where a step begins.
// A period locks only when the live count is balanced over it (what it was one period ago):
// model loading repeats its shapes too, but what it allocates stays.
//
// The phase: a step begins, in the last period seen, at the request made while the fewest
// allocations were live (the carried state: weights and latents), so the planned step holds
// as few buffers across its end as possible. From then on a step begins every `period`
// requests: kBegin the first time, kEndAndBegin after.
//
// Divergence is the PlannedArena's business (it serves what differs from its fallback pool and
// re-records after replan_after divergent steps); the caller reports each step's outcome to
// step_ended(), and after kMaxDivergentRun divergent steps in a row the detector answers kEnd,
// unlocks and learns again: the loop ended or changed.
//
// Cost before it locks: one mutex (the caller's), one prefix-function step and two ring
// writes per large request (docs/preload.md has the figure); after, one counter.
// Not thread-safe by itself: the Runtime calls it under one mutex. Allocates its buffers once
// (kMaxLearned requests), inside sdalloc (from glibc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sdalloc::preload {

class StepDetector {
 public:
  enum class Action { kNone, kBegin, kEndAndBegin, kEnd };

  static constexpr std::size_t kRepeats = 3;
  static constexpr std::size_t kMaxDivergentRun = 8;
  static constexpr std::size_t kMinPeriod = 2;
  static constexpr std::size_t kFirstRestart = 64;
  static constexpr std::size_t kMaxLearned = std::size_t{1} << 16;  // a step of up to 21845

  StepDetector();

  // Before the pool serves a request of `bytes`: what to do with the steps first. Counts the
  // request as live (allocation_failed() takes that back).
  Action on_allocate(std::size_t bytes);
  void allocation_failed() { --live_; }
  void on_free() { --live_; }
  // After a kEndAndBegin or kEnd: whether the step that ended diverged from its plan.
  // Answers kEnd when the detector gives up and unlocks (the caller ends the open step).
  Action step_ended(bool divergent);

  bool locked() const { return period_ > 0; }
  std::size_t step_allocations() const { return period_; }  // 0 until locked
  std::uint64_t locks() const { return locks_; }

 private:
  void learn(std::uint64_t key, std::int64_t live_before);
  void push(std::uint64_t key, std::int64_t live_before);  // one prefix-function step
  bool try_lock();
  void restart();
  void unlock();

  std::int64_t live_ = 0;
  // Learning: the string since the start point, its prefix function, the live counts.
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> prefix_;
  std::vector<std::int64_t> live_before_;
  std::size_t next_restart_ = kFirstRestart;
  // Locked: a step every period_ requests; position_ counts from the phase.
  std::size_t period_ = 0;
  std::size_t position_ = 0;  // requests until the next step begins
  bool step_open_ = false;
  std::size_t divergent_run_ = 0;
  std::uint64_t locks_ = 0;
};

}  // namespace sdalloc::preload
