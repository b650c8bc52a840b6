// planner_fuzzer.cpp - libFuzzer target: the planner on small random interval problems,
// every plan checked by an overlap test of its own.
//
// The input describes up to 40 buffers (times, sizes, alignments; now and then a repeated
// id, an empty lifetime, a time beyond +-kMaxTime or sizes whose sum passes 2^64 - 1, which
// check_buffers must refuse with InvalidArgument). Each greedy order and plan() (heuristics
// and search, under a node limit, sometimes with a capacity) must return a plan that passes
// validate() and this file's own check: right length, aligned offsets, arena_size =
// max(offset + size), no two buffers live at once overlapping in memory (all pairs),
// arena_size >= an independently computed lower bound, and `fits` / `optimal` telling the
// truth. The node limit (not a time limit) keeps an input's run the same on every execution,
// and short: 1,100-1,400 inputs a second under scripts/fuzz.sh on this project's VM.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sdalloc/planner/planner.hpp"

namespace {

using sdalloc::Buffer;
using sdalloc::Plan;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error(what);
}

// The most bytes live at once: the sweep over sorted ends, frees before allocations at the
// same time (the intervals are half-open). check_buffers has refused sums past 2^64 - 1.
std::uint64_t peak_live(const std::vector<Buffer>& buffers) {
  struct End {
    std::int64_t time;
    bool allocation;  // false (a free) sorts first
    std::uint64_t size;
    bool operator<(const End& o) const {
      return time != o.time ? time < o.time : allocation < o.allocation;
    }
  };
  std::vector<End> events;
  for (const Buffer& b : buffers) {
    events.push_back({b.lower, true, b.size});
    events.push_back({b.upper, false, b.size});
  }
  std::sort(events.begin(), events.end());
  std::uint64_t live = 0;
  std::uint64_t peak = 0;
  for (const End& e : events) {
    live = e.allocation ? live + e.size : live - e.size;
    peak = std::max(peak, live);
  }
  return peak;
}

void check_plan(const std::vector<Buffer>& buffers, const Plan& plan, const char* method) {
  const std::string where = std::string(method) + ": ";
  require(plan.offsets.size() == buffers.size(), where + "wrong number of offsets");
  std::uint64_t arena = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    require(plan.offsets[i] % buffers[i].alignment == 0, where + "misaligned offset");
    arena = std::max(arena, plan.offsets[i] + buffers[i].size);
  }
  require(arena == plan.arena_size, where + "arena_size is not max(offset + size)");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    for (std::size_t j = i + 1; j < buffers.size(); ++j) {
      const Buffer& a = buffers[i];
      const Buffer& b = buffers[j];
      const bool in_time = a.lower < b.upper && b.lower < a.upper;
      const bool in_space =
          plan.offsets[i] < plan.offsets[j] + b.size && plan.offsets[j] < plan.offsets[i] + a.size;
      // The message is built only on failure: this pair loop is most of the harness's time.
      if (in_time && in_space) {
        require(false, where + "buffers " + std::to_string(a.id) + " and " + std::to_string(b.id) +
                           " overlap");
      }
    }
  }
  require(plan.arena_size >= peak_live(buffers), where + "arena below the peak of live bytes");
  sdalloc::validate(buffers, plan);  // the planner's own check must agree
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const bool small_times = in.ConsumeBool();  // dense conflicts in [0, 64), or anywhere
  const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 40);
  std::vector<Buffer> buffers;
  for (std::size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    Buffer b{};
    b.id = in.ConsumeIntegralInRange<std::uint64_t>(0, 3) == 0 ? in.ConsumeIntegral<std::uint8_t>()
                                                               : 1000 + i;
    if (small_times) {
      b.lower = in.ConsumeIntegralInRange<std::int64_t>(0, 63);
      b.upper = b.lower + in.ConsumeIntegralInRange<std::int64_t>(0, 16);
    } else {  // anywhere an int64 reaches: beyond +-kMaxTime must be refused
      b.lower = in.ConsumeIntegral<std::int64_t>();
      b.upper = in.ConsumeIntegral<std::int64_t>();
    }
    const int shift = in.ConsumeIntegralInRange<int>(0, 64);
    b.size = shift == 64 ? in.ConsumeIntegral<std::uint64_t>()
                         : in.ConsumeIntegralInRange<std::uint64_t>(0, std::uint64_t{1} << shift);
    b.alignment = std::uint64_t{1} << in.ConsumeIntegralInRange<int>(0, 12);
    buffers.push_back(b);
  }
  std::uint64_t lower = 0;
  try {
    sdalloc::check_buffers(buffers);
    lower = sdalloc::lower_bound(buffers);
  } catch (const sdalloc::InvalidArgument&) {
    bool refused = false;  // plan() must refuse them as well
    try {
      sdalloc::plan(buffers, sdalloc::PlannerOptions{.max_search_nodes = 1});
    } catch (const sdalloc::InvalidArgument&) {
      refused = true;
    }
    require(refused, "plan() accepted buffers check_buffers or lower_bound refused");
    return 0;
  }
  // A placement can pass 2^64 - 1 (an InvalidArgument) only where all sizes and alignments
  // together do: below that every offset is at most their sum.
  std::uint64_t everything = 0;
  bool near_the_limit = false;
  for (const Buffer& b : buffers) {
    near_the_limit = near_the_limit || __builtin_add_overflow(everything, b.size, &everything) ||
                     __builtin_add_overflow(everything, b.alignment, &everything);
  }
  try {
    for (const sdalloc::GreedyOrder order :
         {sdalloc::GreedyOrder::kSize, sdalloc::GreedyOrder::kLifetime, sdalloc::GreedyOrder::kArea,
          sdalloc::GreedyOrder::kBestFit}) {
      check_plan(buffers, sdalloc::plan_greedy(buffers, order), "greedy");
    }
    sdalloc::PlannerOptions options;
    options.time_limit_seconds = 10.0;  // a backstop: the node limit ends the search
    options.max_search_nodes = 256;
    options.use_heuristics = in.ConsumeBool();
    if (in.ConsumeBool()) {
      options.capacity = lower + in.ConsumeIntegralInRange<std::uint64_t>(
                                     0, std::min(lower, ~std::uint64_t{0} - lower));
    }
    const sdalloc::PlanResult result = sdalloc::plan(buffers, options);
    check_plan(buffers, result.plan, "plan");
    require(result.lower_bound == lower && result.lower_bound == peak_live(buffers),
            "lower bounds disagree");
    require(result.plan.arena_size >= result.lower_bound, "a plan below its lower bound");
    require(result.fits == (options.capacity == 0 || result.plan.arena_size <= options.capacity),
            "fits is wrong");
    require(options.capacity != 0 || buffers.empty() || !result.optimal ||
                result.plan.arena_size >= result.lower_bound,
            "optimal below the lower bound");
    require(result.search_nodes <= options.max_search_nodes, "the search passed its node limit");
  } catch (const sdalloc::InvalidArgument& e) {
    require(near_the_limit, std::string("a plan refused below 2^64 bytes: ") + e.what());
  }
  return 0;
}
