// c_entry_points.cpp - sdalloc_ort.h: the OrtAllocator adapter over a C API pool handle.
// Each entry runs through the C API's guarded() (c_api/boundary.hpp), so statuses and the
// thread's message are the C API's own. The adapter borrows the handle's AnyPool (a
// shared_ptr that does not own it: the handle outlives the adapter, sdalloc_ort.h's rule).
#include "sdalloc/onnxruntime/sdalloc_ort.h"

#include <memory>
#include <optional>

#include "c_api/boundary.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/onnxruntime/planned_run.hpp"

struct sdalloc_ort_allocator {
  explicit sdalloc_ort_allocator(sdalloc::AnyPool& pool)
      : allocator(std::shared_ptr<sdalloc::AnyPool>(&pool, [](sdalloc::AnyPool*) {})) {}
  // The registration is destroyed first (it unregisters), then the allocator.
  sdalloc::onnxruntime::OrtPoolAllocator allocator;
  std::optional<sdalloc::onnxruntime::OrtEnvAllocator> registration;
};

namespace {
using sdalloc::c_api_detail::guarded;
using sdalloc::c_api_detail::pool_of;
using sdalloc::c_api_detail::require;
}  // namespace

extern "C" {

sdalloc_status_t sdalloc_ort_allocator_create(sdalloc_pool_t* pool,
                                              sdalloc_ort_allocator_t** out) noexcept {
  return guarded("sdalloc_ort_allocator_create", [&] {
    require(out != nullptr, "out is NULL");
    *out = nullptr;
    // guarded() turns a std::bad_alloc into SDALLOC_ERROR_OUT_OF_MEMORY.
    *out = std::make_unique<sdalloc_ort_allocator>(pool_of(pool)).release();
  });
}

OrtAllocator* sdalloc_ort_allocator_get(sdalloc_ort_allocator_t* allocator) noexcept {
  return allocator != nullptr ? allocator->allocator.get() : nullptr;
}

sdalloc_status_t sdalloc_ort_register(sdalloc_ort_allocator_t* allocator, OrtEnv* env) noexcept {
  return guarded("sdalloc_ort_register", [&] {
    require(allocator != nullptr, "allocator is NULL");
    require(!allocator->registration.has_value(),
            "this adapter is already registered (sdalloc_ort_unregister first)");
    allocator->registration.emplace(env, allocator->allocator);
  });
}

sdalloc_status_t sdalloc_ort_unregister(sdalloc_ort_allocator_t* allocator) noexcept {
  return guarded("sdalloc_ort_unregister", [&] {
    require(allocator != nullptr, "allocator is NULL");
    require(allocator->registration.has_value(), "this adapter is not registered");
    allocator->registration.reset();
  });
}

sdalloc_status_t sdalloc_ort_planned_run(sdalloc_ort_allocator_t* allocator, OrtSession* session,
                                         const OrtRunOptions* run_options,
                                         const char* const* input_names,
                                         const OrtValue* const* inputs, size_t input_count,
                                         const char* const* output_names, size_t output_count,
                                         OrtValue** outputs, OrtStatus** ort_status) noexcept {
  return guarded("sdalloc_ort_planned_run", [&] {
    require(allocator != nullptr, "allocator is NULL");
    require(ort_status != nullptr, "ort_status is NULL");
    *ort_status = nullptr;
    sdalloc::onnxruntime::PlannedSession planned(session, allocator->allocator);
    *ort_status = planned.run(run_options, input_names, inputs, input_count, output_names,
                              output_count, outputs);
  });
}

void sdalloc_ort_allocator_destroy(sdalloc_ort_allocator_t* allocator) noexcept {
  delete allocator;  // NOLINT(cppcoreguidelines-owning-memory)
}

}  // extern "C"
