// tools/sdalloc/run/run_output.hpp - the table and the JSON file of `sdalloc run`.
//
// Table (stdout): the command and the rounds, then one aligned row per allocator:
//   allocator  wall s  x REF  peak RSS  minor faults  user s  sys s  notes
// Figures are medians over the allocator's successful runs. REF is tcmalloc when it ran
// (the usual allocator to beat), else the fastest allocator. Notes: the spread of wall times
// (with several rounds), sdalloc's own report (peak live, peak reserved and their ratio,
// pool and system allocations), why it did not run, or how the command failed (exit status
// or signal, round, the last lines of its stderr).
// JSON (--json FILE):
//   {"command": [S..], "repeat": N, "warmup": N, "reference": S or null, "order": [S..],
//    "results": [{"allocator": S, "description": S, "ran": bool, "problem": S or null,
//                 "failed": bool, "failure": {"round", "exit_status", "signal",
//                 "stderr_tail", "preload_failed"} or null,
//                 "median": {"wall_seconds", "user_seconds", "system_seconds",
//                            "peak_rss_bytes", "minor_faults", "major_faults"} or null,
//                 "relative": R or null, "sdalloc_report": {...} or null,
//                 "runs": [{"round", "exit_status", "signal", "wall_seconds",
//                           "user_seconds", "system_seconds", "peak_rss_bytes",
//                           "minor_faults", "major_faults", "stdout_tail"}, ...]}, ...]}
// (stdout_tail: the last 2000 bytes the command wrote on stdout, e.g. its own timings).
// "ran" is false when the allocator could not run at all (then "problem" says why).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "run/run_driver.hpp"

namespace sdalloc::run {

// The allocator the "x" column divides by: tcmalloc when it has medians, else the fastest;
// "" when no allocator has a successful run.
std::string reference_allocator(const RunReport& report);

std::string format_run_table(const RunReport& report);
nlohmann::json run_to_json(const RunReport& report);
// Writes run_to_json(report) to path; throws sdalloc::Error naming the path when it cannot.
void write_run_json(const RunReport& report, const std::string& path);

}  // namespace sdalloc::run
