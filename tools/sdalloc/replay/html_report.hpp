// tools/sdalloc/replay/html_report.hpp - `sdalloc replay --report`: one run as a self-contained
// HTML page.
//
// The page holds, in this order: a title with the trace and the run's settings (events,
// passes, --touch); the results table (one row per allocator; an allocator that did not run
// shows its problem instead of figures); one plot per allocator that ran, of live and
// reserved bytes over the events, with the pass boundaries and the trace's peak live bytes
// (the lower bound) marked; and the histogram of the trace's allocation sizes in powers of
// two. The plots are inline SVG drawn here: the page loads nothing (its Content-Security-Policy
// forbids every fetch) and runs no script, so it opens the same anywhere, offline.
//
// Every text taken from the input (trace path, allocator names and descriptions, problems,
// counters) is escaped for HTML. An allocator with more than kMaxPlotPoints samples is
// plotted from groups of consecutive samples, each drawn as its maximum live and reserved
// bytes, so peaks survive and the file stays small (tens of kilobytes per allocator).
//
// Thread-safety: the functions only read their arguments; concurrent calls are fine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/replay_result.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::replay {

// Most points one allocator's plot draws; more samples are grouped (see above).
inline constexpr std::size_t kMaxPlotPoints = 2000;

// One bucket of the size histogram: allocations with lower <= size <= upper. Buckets are
// powers of two, [2^k, 2^(k+1) - 1]; a size of 0 has the bucket [0, 0].
struct SizeBucket {
  std::uint64_t lower = 0;
  std::uint64_t upper = 0;
  std::uint64_t count = 0;  // allocations in the bucket (one pass of the trace)
  std::uint64_t bytes = 0;  // their sizes summed
};

// The trace's allocations by size, smallest bucket first, from the smallest to the largest
// bucket that holds an allocation (empty buckets in between are kept, with count 0, so the
// histogram reads as a continuous axis). Empty when the trace allocates nothing.
std::vector<SizeBucket> size_histogram(const EventTrace& trace);

// Samples to plot: `samples` itself when it has at most max_points entries, otherwise at
// most max_points groups of consecutive samples, each as one Sample at the group's last
// event with the group's highest live and highest reserved bytes. max_points 0 is taken as 1.
std::vector<Sample> downsample(const std::vector<Sample>& samples, std::size_t max_points);

// The report page as one HTML5 document. `trace` is the trace the run replayed (one pass);
// only its allocation sizes are read, for the histogram.
std::string render_html_report(const ReplayRun& run, const EventTrace& trace);

// Renders the report and writes it to `path`, replacing the file. Throws sdalloc::Error
// "cannot write HTML report <path>: <strerror>" when the file cannot be created or written
// completely (a partial file may then be left behind).
void write_html_report(const ReplayRun& run, const EventTrace& trace, const std::string& path);

// Text made safe to place in HTML text and attribute values: & < > " ' escaped.
std::string escape_html(const std::string& text);

}  // namespace sdalloc::replay
