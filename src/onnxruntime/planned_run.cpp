// planned_run.cpp - PlannedSession: one Run() = one PlannedArena step
// (sdalloc/onnxruntime/planned_run.hpp). The step always ends, whatever Run() returns.
#include "sdalloc/onnxruntime/planned_run.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc::onnxruntime {

namespace {

PlannedArena& planned_of(OrtPoolAllocator& allocator) {
  PlannedArena* arena = allocator.pool().planned();
  if (arena == nullptr) {
    throw InvalidArgument("PlannedSession needs an OrtPoolAllocator over a PlannedArena, not a " +
                          allocator.pool().name());
  }
  return *arena;
}

}  // namespace

PoolConf planned_session_conf() {
  PoolConf conf;
  conf.mode = PoolMode::kPlanned;
  conf.pool.segment_granularity = std::size_t{4} << 10;
  conf.pool.min_segment_size = conf.pool.segment_granularity;
  return conf;
}

PlannedSession::PlannedSession(OrtSession* session, OrtPoolAllocator& allocator)
    : session_(session), arena_(planned_of(allocator)) {
  if (session == nullptr) throw InvalidArgument("PlannedSession needs a session");
}

OrtStatus* PlannedSession::run(const OrtRunOptions* run_options, const char* const* input_names,
                               const OrtValue* const* inputs, std::size_t input_count,
                               const char* const* output_names, std::size_t output_count,
                               OrtValue** outputs) {
  arena_.begin_step();
  OrtStatus* status = ort_api().Run(session_, run_options, input_names, inputs, input_count,
                                    output_names, output_count, outputs);
  arena_.end_step();
  return status;
}

}  // namespace sdalloc::onnxruntime
