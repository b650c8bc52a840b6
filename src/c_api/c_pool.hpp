// c_pool.hpp - what an sdalloc_pool_t handle of the C API is (internal, C++ only).
//
// A handle owns a PoolStack (sdalloc/config/make_pool.hpp: the pool make_pool() built and
// the memory under it) and the recorder behind sdalloc_pool_trace_start. Its pool is an
// AnyPool (sdalloc/policies/any_pool.hpp), so every sdalloc_* function works on every kind;
// only a planned pool has steps, and the step calls fail with InvalidArgument elsewhere.
// sdalloc_pool_create builds host stacks; the PyTorch shim (src/torch_shim/) builds device stacks,
// through the same make_pool().
#pragma once

#include <memory>
#include <utility>

#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/any_pool.hpp"
#include "trace/allocation_recorder.hpp"

namespace sdalloc::detail {

// The PlannedArena behind a handle; InvalidArgument for a pool without steps.
inline PlannedArena& planned_of(AnyPool& pool) {
  PlannedArena* arena = pool.planned();
  if (arena == nullptr) {
    throw InvalidArgument(
        "the pool is not a planned pool: steps need sdalloc_pool_config_t.mode "
        "SDALLOC_MODE_PLANNED (C API) or mode:planned (SDALLOC_CONF)");
  }
  return *arena;
}

}  // namespace sdalloc::detail

struct sdalloc_pool {
  explicit sdalloc_pool(std::unique_ptr<sdalloc::PoolStack> built)
      : stack(std::move(built)), pool(stack->pool.get()) {}
  sdalloc_pool(const sdalloc_pool&) = delete;
  sdalloc_pool& operator=(const sdalloc_pool&) = delete;
  ~sdalloc_pool() = default;

  std::unique_ptr<sdalloc::PoolStack> stack;
  sdalloc::AnyPool* pool;  // stack->pool
  sdalloc::detail::AllocationRecorder recorder;
};
