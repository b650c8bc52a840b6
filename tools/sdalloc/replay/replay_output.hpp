// tools/sdalloc/replay/replay_output.hpp - the table and the JSON file of `sdalloc replay`.
//
// Table (stdout): a header with the trace's figures, then one aligned row per allocator:
//   allocator  peak reserved  x live  ns/op  s/pass  min capacity  notes
// where "x live" is peak reserved / the trace's peak live bytes, ns/op and s/pass are
// medians over the passes, "min capacity" (--min-capacity) is shown with its own ratio to
// peak live, and notes hold the allocator's own counts or why it did not run.
// JSON (--json FILE):
//   {"trace": S, "events": N, "allocations": N, "passes": N, "touch": bool, "peak_live": B,
//    "results": [{"allocator": S, "description": S, "ran": bool, "problem": S or null,
//                 "peak_reserved": B, "ratio": R, "ns_per_op": T, "pass_seconds": [..],
//                 "pass_memory_calls": [..] (in-process allocators; else []),
//                 "min_capacity": B or null, "counters": S}, ...]}
// An allocator that did not run has null peak_reserved, ratio and ns_per_op.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "replay/replay_result.hpp"

namespace sdalloc::replay {

std::string format_table(const ReplayRun& run);
nlohmann::json to_json(const ReplayRun& run);
// Writes to_json(run) to path; throws sdalloc::Error naming the path when it cannot.
void write_json(const ReplayRun& run, const std::string& path);

}  // namespace sdalloc::replay
