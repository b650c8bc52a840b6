// sdalloc/onnxruntime/planned_run.hpp - each Run() of an ORT session as one PlannedArena step.
//
// A session's Run() makes the same allocations in the same order every call with the same
// input shapes (sequential execution), like a denoising step. PlannedSession brackets each
// Run() in begin_step() / end_step() of the PlannedArena behind an OrtPoolAllocator: the
// first Run() is recorded, planned at its end, and later ones are served from one arena of
// the plan's size. Outputs ORT hands back are live past the step: the arena keeps them in its
// fallback pool (planned_arena.hpp, "kept buffers"), so they stay valid after the next Run().
// A Run() with other shapes records a plan of its own (up to max_plans) or diverges to the
// fallback pool; nothing fails because of the plan.
//
// Compare ORT's own memory patterns (EnableMemPattern), which also plan one Run() and replay
// it: they need the session's own arena and are turned off in the session options the
// sdalloc configurations use (the allocator must see each tensor to plan it).
//
// Errors: the constructor throws InvalidArgument if the allocator's pool is not a planned
// pool. run() returns ORT's status (nullptr on success) and always ends the step; it throws
// only what begin_step() throws (a step already open: another thread's run() on the same
// arena - calls must not overlap, steps are one at a time).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>

#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc::onnxruntime {

// The configuration of a session's pool (for make_pool, sdalloc/config/make_pool.hpp):
// mode:planned. Besides the plan, the arena's fallback pool
// holds the session's initializers (allocated once, when the session is created, and never
// freed) and the outputs kept past each Run() (freed by the caller, then asked again in the
// same size): nothing there is reused in another size, so the fallback takes segments of the
// request rounded to 4 KiB (no 2 MiB granularity) and holds what they need
// (docs/onnxruntime.md). On host memory (host_backend(), as ORT's CPU allocator is) the arena
// is faulted in when it is reserved, so the runs pay no page faults.
PoolConf planned_session_conf();

class PlannedSession {
 public:
  PlannedSession(OrtSession* session, OrtPoolAllocator& allocator);

  // OrtApi::Run with the same arguments, as one step.
  OrtStatus* run(const OrtRunOptions* run_options, const char* const* input_names,
                 const OrtValue* const* inputs, std::size_t input_count,
                 const char* const* output_names, std::size_t output_count, OrtValue** outputs);

  PlannedArena& arena() { return arena_; }

 private:
  OrtSession* session_;
  PlannedArena& arena_;
};

}  // namespace sdalloc::onnxruntime
