// failing_virtual_memory.hpp - a VirtualMemory that fails on command, for tests.
//
// FailingVirtualMemory forwards to a real VirtualMemory (HostVirtualMemory) and counts the
// calls of each kind. A test arms one step ("fail the 3rd create from now, with
// OutOfMemory") and checks that the pool above reports the failure clearly and stays
// consistent. The steps that may fail by contract are armable (reserve, create, map), and
// unmap, which fails only when the system does (Linux at vm.max_map_count): an armed unmap
// throws without unmapping, so the mapping stays, as HostVirtualMemory's does. With `runs`,
// it maps runs where the real one does (map_run), and an armed map fails the whole run.
// Thread-safe like the VirtualMemory it wraps (the counters are atomics).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::test {

class FailingVirtualMemory final : public VirtualMemory {
 public:
  enum class Step { kReserve, kCreate, kMap, kUnmap };
  enum class Failure { kOutOfMemory, kError };

  explicit FailingVirtualMemory(VirtualMemory& real, bool runs = false)
      : real_(real), runs_(runs) {}

  // The `nth` call (0: the next one) of `step` from now throws `failure`; later calls pass,
  // unless `persistent`: then every call from the nth on fails until disarm().
  void fail(Step step, std::uint64_t nth, Failure failure = Failure::kOutOfMemory,
            bool persistent = false) {
    failure_[index(step)] = failure;
    persistent_[index(step)] = persistent;
    fired_[index(step)].store(false);
    countdown_[index(step)].store(static_cast<std::int64_t>(nth));
  }
  void disarm() {
    for (auto& c : countdown_) c.store(-1);
  }
  // Whether the armed failure has been thrown (and nothing is armed any more).
  bool fired(Step step) const { return fired_[index(step)].load(); }
  std::uint64_t calls(Step step) const { return calls_[index(step)].load(); }

  std::size_t granularity() const override { return real_.granularity(); }
  void* reserve(std::size_t bytes, std::size_t alignment) override {
    maybe_fail(Step::kReserve, "reserve");
    return real_.reserve(bytes, alignment);
  }
  void release(void* base, std::size_t bytes) override { real_.release(base, bytes); }
  PhysicalChunk create(std::size_t bytes) override {
    maybe_fail(Step::kCreate, "create");
    return real_.create(bytes);
  }
  void destroy(PhysicalChunk chunk) override { real_.destroy(chunk); }
  void map(void* address, PhysicalChunk chunk) override {
    maybe_fail(Step::kMap, "map");
    real_.map(address, chunk);
  }
  bool maps_runs() const override { return runs_ && real_.maps_runs(); }
  void map_run(void* address, const PhysicalChunk* chunks, std::size_t count) override {
    maybe_fail(Step::kMap, "map");
    real_.map_run(address, chunks, count);
  }
  void unmap(void* address, std::size_t bytes, Stream last_use) override {
    maybe_fail(Step::kUnmap, "unmap");
    real_.unmap(address, bytes, last_use);
  }
  std::size_t physical_capacity() const override { return real_.physical_capacity(); }
  std::size_t physical_ceiling() const override { return real_.physical_ceiling(); }
  std::string name() const override { return "failing(" + real_.name() + ")"; }

 private:
  static std::size_t index(Step step) { return static_cast<std::size_t>(step); }

  void maybe_fail(Step step, const char* what) {
    ++calls_[index(step)];
    std::atomic<std::int64_t>& countdown = countdown_[index(step)];
    std::int64_t left = countdown.load();
    for (;;) {
      if (left < 0) return;
      if (left == 0 && persistent_[index(step)]) break;
      if (countdown.compare_exchange_weak(left, left - 1)) {
        if (left != 0) return;
        break;
      }
    }
    fired_[index(step)].store(true);
    const std::string message = std::string("injected ") + what + " failure";
    if (failure_[index(step)] == Failure::kOutOfMemory) {
      OutOfMemoryInfo info;
      throw OutOfMemory::describe(name(), info, message);
    }
    throw Error(name() + ": " + message);
  }

  VirtualMemory& real_;
  bool runs_ = false;
  static constexpr std::size_t kSteps = 4;
  Failure failure_[kSteps] = {};
  bool persistent_[kSteps] = {};
  std::atomic<std::int64_t> countdown_[kSteps] = {-1, -1, -1, -1};
  std::atomic<bool> fired_[kSteps] = {false, false, false, false};
  std::atomic<std::uint64_t> calls_[kSteps] = {0, 0, 0, 0};
};

}  // namespace sdalloc::test
