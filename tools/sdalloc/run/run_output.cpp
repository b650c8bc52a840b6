#include "run/run_output.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "json_file.hpp"
#include "sdalloc/core/errors.hpp"
#include "text_table.hpp"

namespace sdalloc::run {
namespace {

constexpr std::size_t kNoteTail = 160;  // characters of stderr a failed row shows

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string how_it_failed(const RunSample& run) {
  const ChildOutcome& o = run.outcome;
  std::string text = "FAILED in round " + std::to_string(run.round) + ": ";
  if (!o.preload_failed.empty()) return text + "LD_PRELOAD refused: " + o.preload_failed;
  text += o.signal != 0
              ? "killed by signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")"
              : "exit status " + std::to_string(o.exit_status);
  const std::string tail = last_lines(o.stderr_tail, kNoteTail);
  return tail.empty() ? text : text + ": " + tail;
}

std::string sdalloc_note(const RunSample& run) {
  if (!run.report_problem.empty()) return run.report_problem;
  if (!run.report) return "the drop-in wrote no report";
  const SdallocReport& r = *run.report;
  std::string text = "sdalloc " + r.mode + ": peak live " + format_size(r.peak_live_bytes) +
                     ", peak reserved " + format_size(r.peak_reserved_bytes);
  if (r.peak_live_bytes != 0) {
    text += " (" + fixed(double(r.peak_reserved_bytes) / double(r.peak_live_bytes), 2) + "x)";
  }
  return text + ", " + std::to_string(r.pool_allocations) + " pool / " +
         std::to_string(r.system_allocations) + " system allocations";
}

std::string notes(const AllocatorRuns& result) {
  if (!result.problem.empty()) return result.problem;
  std::vector<std::string> parts;
  std::vector<double> walls;
  const RunSample* last_ok = nullptr;
  for (const RunSample& r : result.runs) {
    if (!r.outcome.succeeded()) continue;
    walls.push_back(r.outcome.wall_seconds);
    last_ok = &r;
  }
  if (walls.size() > 1) {
    const auto [low, high] = std::minmax_element(walls.begin(), walls.end());
    parts.push_back(std::to_string(walls.size()) + " runs, wall " + fixed(*low, 2) + "-" +
                    fixed(*high, 2) + " s");
  }
  const RunSample* reported = last_ok != nullptr ? last_ok : result.failure();
  if (reported != nullptr && (reported->report || !reported->report_problem.empty() ||
                              result.allocator.rfind("sdalloc-", 0) == 0)) {
    parts.push_back(sdalloc_note(*reported));
  }
  if (const RunSample* failed = result.failure()) parts.push_back(how_it_failed(*failed));
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : "; ") + p;
  return text;
}

// An argument as a shell would need it: quoted when it holds anything but plain characters.
std::string shell_quoted(const std::string& arg) {
  const bool plain = !arg.empty() && arg.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_./=:,+-@%") == std::string::npos;
  if (plain) return arg;
  std::string quoted = "'";
  for (const char c : arg) {
    if (c == '\'') {
      quoted.append("'\\''");  // close, an escaped quote, reopen
    } else {
      quoted.push_back(c);
    }
  }
  quoted.push_back('\'');
  return quoted;
}

nlohmann::json outcome_json(const RunSample& r) {
  const ChildOutcome& o = r.outcome;
  return {{"round", r.round},
          {"exit_status", o.exit_status},
          {"signal", o.signal},
          {"wall_seconds", o.wall_seconds},
          {"user_seconds", o.user_seconds},
          {"system_seconds", o.system_seconds},
          {"peak_rss_bytes", o.peak_rss_bytes},
          {"minor_faults", o.minor_faults},
          {"major_faults", o.major_faults},
          {"stdout_tail", o.stdout_tail}};
}

}  // namespace

std::string reference_allocator(const RunReport& report) {
  std::string fastest;
  double best = 0;
  for (const AllocatorRuns& r : report.results) {
    const std::optional<Medians> m = r.medians();
    if (!m) continue;
    if (r.allocator == "tcmalloc") return r.allocator;
    if (fastest.empty() || m->wall_seconds < best) {
      fastest = r.allocator;
      best = m->wall_seconds;
    }
  }
  return fastest;
}

std::string format_run_table(const RunReport& report) {
  std::string command;
  for (const std::string& arg : report.command) {
    if (!command.empty()) command.push_back(' ');
    command.append(shell_quoted(arg));
  }
  std::string order;
  for (std::size_t i = 0; i < report.order.size() && i < 8; ++i) {
    if (i > 0) order.push_back(' ');
    order.append(report.order[i]);
  }
  if (report.order.size() > 8) order += " ...";
  std::string out = "command:  " + command + "\n";
  out += "rounds:   " + std::to_string(report.repeat) + ", allocators interleaved (" + order +
         "); figures are medians over each allocator's runs";
  if (report.warmup > 0) out += "; " + std::to_string(report.warmup) + " untimed warm-up run(s)";
  out += "\n\n";

  const std::string reference = reference_allocator(report);
  double reference_wall = 0;
  for (const AllocatorRuns& r : report.results) {
    if (r.allocator == reference) reference_wall = r.medians()->wall_seconds;
  }
  const std::vector<std::string> header = {
      "allocator", "wall s",       reference.empty() ? "x" : "x " + reference,
      "peak RSS",  "minor faults", "user s",
      "sys s",     "notes"};
  std::vector<std::vector<std::string>> rows;
  for (const AllocatorRuns& r : report.results) {
    const std::optional<Medians> m = r.medians();
    if (!m) {
      rows.push_back({r.allocator, "-", "-", "-", "-", "-", "-", notes(r)});
      continue;
    }
    rows.push_back({r.allocator, fixed(m->wall_seconds, 3),
                    reference_wall > 0 ? fixed(m->wall_seconds / reference_wall, 3) : "-",
                    format_size(m->peak_rss_bytes), std::to_string(m->minor_faults),
                    fixed(m->user_seconds, 2), fixed(m->system_seconds, 2), notes(r)});
  }
  out += tools::text_table(header, rows, /*trim=*/true);
  return out;
}

nlohmann::json run_to_json(const RunReport& report) {
  const std::string reference = reference_allocator(report);
  double reference_wall = 0;
  for (const AllocatorRuns& r : report.results) {
    if (r.allocator == reference) reference_wall = r.medians()->wall_seconds;
  }
  nlohmann::json j;
  j["command"] = report.command;
  j["repeat"] = report.repeat;
  j["warmup"] = report.warmup;
  j["reference"] = reference.empty() ? nlohmann::json(nullptr) : nlohmann::json(reference);
  j["order"] = report.order;
  nlohmann::json results = nlohmann::json::array();
  for (const AllocatorRuns& r : report.results) {
    nlohmann::json e;
    e["allocator"] = r.allocator;
    e["description"] = r.description;
    e["ran"] = r.problem.empty();
    e["problem"] = r.problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.problem);
    const RunSample* failed = r.failure();
    e["failed"] = failed != nullptr;
    e["failure"] = nullptr;
    if (failed != nullptr) {
      e["failure"] = {{"round", failed->round},
                      {"exit_status", failed->outcome.exit_status},
                      {"signal", failed->outcome.signal},
                      {"stderr_tail", failed->outcome.stderr_tail},
                      {"preload_failed", failed->outcome.preload_failed}};
    }
    const std::optional<Medians> m = r.medians();
    e["median"] = nullptr;
    e["relative"] = nullptr;
    if (m) {
      e["median"] = {{"wall_seconds", m->wall_seconds},     {"user_seconds", m->user_seconds},
                     {"system_seconds", m->system_seconds}, {"peak_rss_bytes", m->peak_rss_bytes},
                     {"minor_faults", m->minor_faults},     {"major_faults", m->major_faults}};
      if (reference_wall > 0) e["relative"] = m->wall_seconds / reference_wall;
    }
    e["sdalloc_report"] = nullptr;
    for (const RunSample& run : r.runs) {
      if (!run.report) continue;
      e["sdalloc_report"] = {{"mode", run.report->mode},
                             {"peak_live_bytes", run.report->peak_live_bytes},
                             {"peak_reserved_bytes", run.report->peak_reserved_bytes},
                             {"pool_allocations", run.report->pool_allocations},
                             {"system_allocations", run.report->system_allocations}};
    }
    nlohmann::json runs = nlohmann::json::array();
    for (const RunSample& run : r.runs) runs.push_back(outcome_json(run));
    e["runs"] = std::move(runs);
    results.push_back(std::move(e));
  }
  j["results"] = std::move(results);
  return j;
}

void write_run_json(const RunReport& report, const std::string& path) {
  tools::write_json_file(run_to_json(report), path);
}

}  // namespace sdalloc::run
