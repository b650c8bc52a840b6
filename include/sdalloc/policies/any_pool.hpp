// sdalloc/policies/any_pool.hpp - any pool behind one run-time interface.
//
// Front ends choose the kind of pool at run time (the C API's config struct, SDALLOC_CONF's
// mode:pool|vmm|planned) and then call it through AnyPool: the Pool concept's members
// (core/pool.hpp, whose contract they keep) as virtual functions, plus the two things some
// pools have, asked for explicitly: a segment layout (every pool here: a VirtualMemoryPool's
// segments are its runs of mapped pages) and steps (PlannedArena).
//
// PoolOf<P> owns a P, built in place from the constructor's arguments, and forwards to it.
// The virtual call costs a few nanoseconds on top of the pool's own cache-hit path; code that
// knows its pool type uses the pool directly.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"

namespace sdalloc {

static_assert(Pool<CachingPool>);
static_assert(Pool<VirtualMemoryPool>);
static_assert(Pool<PlannedArena>);

class AnyPool {
 public:
  AnyPool() = default;
  AnyPool(const AnyPool&) = delete;
  AnyPool& operator=(const AnyPool&) = delete;
  virtual ~AnyPool() = default;

  // The Pool concept's members (core/pool.hpp).
  virtual void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, Stream stream) = 0;
  virtual void free(void* ptr, Stream stream) = 0;
  virtual void record_stream(void* ptr, Stream stream) = 0;
  virtual std::size_t allocation_size(const void* ptr) const = 0;
  virtual std::size_t trim() = 0;
  virtual PoolStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void check_invariants() const = 0;
  virtual std::string name() const = 0;

  // Whether layout() answers; it throws InvalidArgument saying why where it does not.
  virtual bool has_layout() const = 0;
  virtual PoolLayout layout() const = 0;
  // The PlannedArena behind this handle, or nullptr for pools without steps.
  virtual PlannedArena* planned() = 0;
  // The VirtualMemoryPool behind this handle (its page figures: vm_stats), or nullptr.
  virtual VirtualMemoryPool* vmm() = 0;
};

template <Pool P>
class PoolOf final : public AnyPool {
 public:
  template <typename... Args>
  explicit PoolOf(Args&&... args) : pool_(std::forward<Args>(args)...) {}

  void* allocate(std::size_t bytes, std::size_t alignment, Stream stream) override {
    return pool_.allocate(bytes, alignment, stream);
  }
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    pool_.deallocate(ptr, bytes, stream);
  }
  void free(void* ptr, Stream stream) override { pool_.free(ptr, stream); }
  void record_stream(void* ptr, Stream stream) override { pool_.record_stream(ptr, stream); }
  std::size_t allocation_size(const void* ptr) const override { return pool_.allocation_size(ptr); }
  std::size_t trim() override { return pool_.trim(); }
  PoolStats stats() const override { return pool_.stats(); }
  void reset_peak() override { pool_.reset_peak(); }
  void check_invariants() const override { pool_.check_invariants(); }
  std::string name() const override { return pool_.name(); }

  bool has_layout() const override {
    return requires(const P& p) { p.layout(); };
  }
  PoolLayout layout() const override {
    if constexpr (requires(const P& p) { p.layout(); }) {
      return pool_.layout();
    } else {
      throw InvalidArgument(pool_.name() + " has no segment layout (use the statistics)");
    }
  }
  PlannedArena* planned() override {
    if constexpr (std::is_same_v<P, PlannedArena>) {
      return &pool_;
    } else {
      return nullptr;
    }
  }

  VirtualMemoryPool* vmm() override {
    if constexpr (std::is_same_v<P, VirtualMemoryPool>) {
      return &pool_;
    } else {
      return nullptr;
    }
  }

  P& pool() { return pool_; }
  const P& pool() const { return pool_; }

 private:
  P pool_;
};

}  // namespace sdalloc
