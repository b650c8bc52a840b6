#include "replay/replay_output.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "json_file.hpp"
#include "sdalloc/core/errors.hpp"
#include "text_table.hpp"

namespace sdalloc::replay {
namespace {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

double median_seconds(std::vector<double> seconds) {
  if (seconds.empty()) return 0;
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  return n % 2 == 1 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
}

}  // namespace

std::string format_table(const ReplayRun& run) {
  std::string out;
  out += "trace:       " + run.trace + "\n";
  out += "events:      " + std::to_string(run.events) + " per pass (" +
         std::to_string(run.allocations) + " allocations), " + std::to_string(run.passes) +
         (run.passes == 1 ? " pass" : " passes") +
         (run.touch ? ", every 4 KiB page written" : ", pages not written (no --touch)") + "\n";
  out += "peak live:   " + format_size(run.peak_live) + " (" + std::to_string(run.peak_live) +
         " B), the least any allocator can hold\n";
  if (!run.touch) {
    out +=
        "note:        without --touch, pages nobody writes are never resident: the system "
        "allocators' RSS growth then counts only what they wrote themselves\n";
  }
  out += "\n";

  const std::vector<std::string> header = {"allocator", "peak reserved", "x live", "ns/op",
                                           "s/pass",    "min capacity",  "notes"};
  std::vector<std::vector<std::string>> rows;
  for (const AllocatorResult& r : run.results) {
    if (!r.ran) {
      rows.push_back({r.allocator, "-", "-", "-", "-", "-", r.problem});
      continue;
    }
    rows.push_back({r.allocator, format_size(r.peak_reserved), fixed(r.ratio, 3),
                    fixed(r.ns_per_op, 0), fixed(median_seconds(r.pass_seconds), 3),
                    r.min_capacity
                        ? format_size(*r.min_capacity) + " = " +
                              fixed(double(*r.min_capacity) / double(run.peak_live), 3) + "x"
                        : "-",
                    r.counters});
  }
  out += tools::text_table(header, rows);
  return out;
}

nlohmann::json to_json(const ReplayRun& run) {
  nlohmann::json j;
  j["trace"] = run.trace;
  j["events"] = run.events;
  j["allocations"] = run.allocations;
  j["passes"] = run.passes;
  j["touch"] = run.touch;
  j["peak_live"] = run.peak_live;
  nlohmann::json results = nlohmann::json::array();
  for (const AllocatorResult& r : run.results) {
    nlohmann::json e;
    e["allocator"] = r.allocator;
    e["description"] = r.description;
    e["ran"] = r.ran;
    e["problem"] = r.ran ? nlohmann::json(nullptr) : nlohmann::json(r.problem);
    e["peak_reserved"] = r.ran ? nlohmann::json(r.peak_reserved) : nlohmann::json(nullptr);
    e["ratio"] = r.ran ? nlohmann::json(r.ratio) : nlohmann::json(nullptr);
    e["ns_per_op"] = r.ran ? nlohmann::json(r.ns_per_op) : nlohmann::json(nullptr);
    e["pass_seconds"] = r.pass_seconds;
    e["pass_memory_calls"] = r.pass_memory_calls;
    e["min_capacity"] = r.min_capacity ? nlohmann::json(*r.min_capacity) : nlohmann::json(nullptr);
    e["counters"] = r.counters;
    results.push_back(std::move(e));
  }
  j["results"] = std::move(results);
  return j;
}

void write_json(const ReplayRun& run, const std::string& path) {
  tools::write_json_file(to_json(run), path);
}

}  // namespace sdalloc::replay
