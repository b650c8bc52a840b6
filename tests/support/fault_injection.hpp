// fault_injection.hpp - resources that fail the k-th call made through them, for tests and
// fuzzers.
//
// A FaultPlan numbers every call that reaches a resource through the adaptors that share it
// (0, 1, 2, ... in the order they are made) and can be armed to fail one of them: "the k-th
// call from now". FaultInjectingResource wraps a MemoryResource (allocate, deallocate, and
// coalesce where its upstream coalesces; split passes through) and FaultInjectingVirtualMemory a
// VirtualMemory (reserve, create, map, unmap, and move where it moves); both count into one
// FaultPlan, so a test that first counts the calls of a clean run can then fail each of them, one
// run per k.
//
// A failed call does nothing below and throws what a real failure of that call would:
// OutOfMemory for allocate, reserve and create (the resource has no memory) and for
// coalesce (whose ranges still go back, as its contract says), sdalloc::Error
// for deallocate, map, unmap and move (the driver refused). Calls that only give back what was
// never handed out or clean up (release, destroy) are passed through uncounted: pools call
// them from destructors and from rollbacks, where there is nothing left to fail to.
//
// Only one call fails per arming (the next one succeeds), unless the plan is armed with a
// probability instead (fuzzers): then each counted call fails with that chance, decided by
// a caller-seeded generator so a run replays exactly. Single-threaded use in the tests; the
// counters are atomics so a concurrent test stays well-defined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/resource.hpp"
#include "sdalloc/core/virtual_memory.hpp"

namespace sdalloc::test {

// What a counted call was: the failure thrown depends on it.
enum class ResourceCall : std::uint8_t {
  kAllocate,
  kDeallocate,
  kReserve,
  kCreate,
  kMap,
  kUnmap,
  kMove
};

inline const char* resource_call_name(ResourceCall call) {
  switch (call) {
    case ResourceCall::kAllocate:
      return "allocate";
    case ResourceCall::kDeallocate:
      return "deallocate";
    case ResourceCall::kReserve:
      return "reserve";
    case ResourceCall::kCreate:
      return "create";
    case ResourceCall::kMap:
      return "map";
    case ResourceCall::kUnmap:
      return "unmap";
    case ResourceCall::kMove:
      return "move";
  }
  return "?";
}

// Whether a real failure of `call` is a lack of memory (OutOfMemory) or another Error.
inline bool fails_as_out_of_memory(ResourceCall call) {
  return call == ResourceCall::kAllocate || call == ResourceCall::kReserve ||
         call == ResourceCall::kCreate;
}

// ===================================================================== the plan

class FaultPlan {
 public:
  // The k-th counted call from now (0: the next) fails; later ones pass.
  void fail_call(std::uint64_t k) {
    probability_ = 0;
    countdown_.store(static_cast<std::int64_t>(k));
  }
  // Every counted call from now fails with chance `per_65536` / 65536 (a fuzzer's failing
  // resource); `seed` makes the sequence of decisions reproducible.
  void fail_randomly(std::uint32_t per_65536, std::uint64_t seed) {
    countdown_.store(-1);
    probability_ = per_65536;
    state_ = seed | 1;
  }
  void disarm() {
    countdown_.store(-1);
    probability_ = 0;
  }
  // Counts (and may fail) only calls of the kinds in `kinds`; the others pass through
  // uncounted. All kinds by default.
  template <class Kinds = std::initializer_list<ResourceCall>>
  void count_only(const Kinds& kinds) {
    std::uint32_t mask = 0;
    for (const ResourceCall kind : kinds) mask |= bit(kind);
    mask_ = mask;
  }
  std::uint64_t calls() const { return calls_.load(); }
  std::uint64_t failures() const { return failures_.load(); }
  // The kind of the last call that was made to fail.
  ResourceCall last_failed() const { return last_failed_.load(); }

  // Counts a call of kind `call`; throws its failure if this is the one armed.
  void count(ResourceCall call, const std::string& resource_name) {
    if ((mask_ & bit(call)) == 0) return;
    ++calls_;
    if (!should_fail()) return;
    ++failures_;
    last_failed_.store(call);
    const std::string message =
        resource_name + ": injected " + resource_call_name(call) + " failure";
    if (fails_as_out_of_memory(call)) throw OutOfMemory(message, OutOfMemoryInfo{});
    throw Error(message);
  }

 private:
  static std::uint32_t bit(ResourceCall call) { return 1u << static_cast<unsigned>(call); }

  bool should_fail() {
    if (probability_ != 0) {
      // xorshift64*: cheap, and the same seed gives the same failures.
      state_ ^= state_ >> 12;
      state_ ^= state_ << 25;
      state_ ^= state_ >> 27;
      const std::uint64_t r = state_ * 0x2545F4914F6CDD1DULL;
      return (r >> 48) < probability_;
    }
    std::int64_t left = countdown_.load();
    while (left >= 0) {
      if (countdown_.compare_exchange_weak(left, left - 1)) return left == 0;
    }
    return false;
  }

  std::atomic<std::int64_t> countdown_{-1};
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<ResourceCall> last_failed_{ResourceCall::kAllocate};
  std::uint32_t mask_ = ~0u;
  std::uint32_t probability_ = 0;
  std::uint64_t state_ = 1;
};

// ===================================================================== the adaptors

class FaultInjectingResource final : public MemoryResource {
 public:
  // `upstream` and `plan` must outlive this adaptor.
  FaultInjectingResource(MemoryResource& upstream, FaultPlan& plan)
      : upstream_(upstream), plan_(plan) {}

  std::size_t capacity() const override { return upstream_.capacity(); }
  std::string name() const override { return "faulty(" + upstream_.name() + ")"; }

 private:
  void* do_allocate(std::size_t bytes, Stream stream) override {
    plan_.count(ResourceCall::kAllocate, name());
    return upstream_.allocate(bytes, stream);
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    plan_.count(ResourceCall::kDeallocate, name());
    upstream_.deallocate(ptr, bytes, stream);
  }

  MemoryResource& upstream_;
  FaultPlan& plan_;
};

class FaultInjectingVirtualMemory final : public VirtualMemory {
 public:
  // `real` and `plan` must outlive this adaptor.
  FaultInjectingVirtualMemory(VirtualMemory& real, FaultPlan& plan) : real_(real), plan_(plan) {}

  std::size_t granularity() const override { return real_.granularity(); }
  void* reserve(std::size_t bytes, std::size_t alignment) override {
    plan_.count(ResourceCall::kReserve, name());
    return real_.reserve(bytes, alignment);
  }
  void release(void* base, std::size_t bytes) override { real_.release(base, bytes); }
  PhysicalChunk create(std::size_t bytes) override {
    plan_.count(ResourceCall::kCreate, name());
    return real_.create(bytes);
  }
  void destroy(PhysicalChunk chunk) override { real_.destroy(chunk); }
  void map(void* address, PhysicalChunk chunk) override {
    plan_.count(ResourceCall::kMap, name());
    real_.map(address, chunk);
  }
  void unmap(void* address, std::size_t bytes, Stream last_use) override {
    plan_.count(ResourceCall::kUnmap, name());
    real_.unmap(address, bytes, last_use);
  }
  bool can_move() const override { return real_.can_move(); }
  void move(void* from, void* to, const PhysicalChunk* chunks, std::size_t count,
            Stream last_use) override {
    plan_.count(ResourceCall::kMove, name());
    real_.move(from, to, chunks, count, last_use);
  }
  std::size_t physical_capacity() const override { return real_.physical_capacity(); }
  std::size_t physical_ceiling() const override { return real_.physical_ceiling(); }
  std::string name() const override { return "faulty(" + real_.name() + ")"; }

 private:
  VirtualMemory& real_;
  FaultPlan& plan_;
};

}  // namespace sdalloc::test
