#include "replay/replay_driver.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "replay/system_allocators.hpp"
#include "replay/trace_player.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::replay {
namespace {

// The trace as an event-trace file the child processes can read (the input may have been
// standard input or an RMM log); removed with the object.
class TraceFileForChildren {
 public:
  explicit TraceFileForChildren(const EventTrace& trace) {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path();
    std::string pattern = (tmp / "sdalloc-replay-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error("cannot create a temporary directory in " + tmp.string());
    }
    dir_ = pattern;
    path_ = (std::filesystem::path(dir_) / "trace.csv").string();
    std::ofstream out(path_);
    write_event_trace(trace, out);
    out.flush();
    if (!out) throw Error("cannot write " + path_);
  }
  ~TraceFileForChildren() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TraceFileForChildren(const TraceFileForChildren&) = delete;
  TraceFileForChildren& operator=(const TraceFileForChildren&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

struct InProcessRun {
  std::vector<double> seconds;
  std::vector<std::uint64_t> memory_calls;  // per pass
  std::uint64_t peak_reserved = 0;
  std::string counters;
};

// Replays `passes` times on a fresh target; OutOfMemory and other errors propagate after
// everything live is released.
InProcessRun replay_in_process(const InProcessAllocator& allocator, const PreparedTrace& trace,
                               int passes, bool touch, const TargetSettings& settings,
                               std::vector<Sample>* samples, ProgressLine* progress) {
  const std::unique_ptr<ReplayTarget> target = allocator.make(settings);
  MemoryResource& resource = target->resource();
  auto allocate = [&resource](std::uint64_t bytes, std::uint64_t stream) {
    return resource.allocate(bytes, Stream(static_cast<std::uintptr_t>(stream)));
  };
  auto free = [&resource](void* p, std::uint64_t bytes, std::uint64_t stream) {
    resource.deallocate(p, bytes, Stream(static_cast<std::uintptr_t>(stream)));
  };
  auto reserved = [&target] { return target->reserved_bytes(); };
  InProcessRun run;
  LiveSet live(trace);
  using Clock = std::chrono::steady_clock;
  for (int pass = 0; pass < passes; ++pass) {
    // The pass boundaries are part of the pass's time: PlannedArena plans in end_step().
    const std::uint64_t calls_before = target->memory_calls();
    const Clock::time_point begin = Clock::now();
    target->begin_pass();
    const std::chrono::duration<double> begin_seconds = Clock::now() - begin;
    double seconds = 0;
    try {
      seconds = play_pass(trace, live, PassSettings{pass, passes, touch, samples, progress},
                          allocate, free, reserved);
    } catch (...) {
      live.release_live(free);
      throw;
    }
    const Clock::time_point end = Clock::now();
    target->end_pass();
    const std::chrono::duration<double> end_seconds = Clock::now() - end;
    run.seconds.push_back(begin_seconds.count() + seconds + end_seconds.count());
    run.memory_calls.push_back(target->memory_calls() - calls_before);
  }
  run.peak_reserved = target->peak_reserved_bytes();
  run.counters = target->counters();
  return run;
}

bool fits_in(const InProcessAllocator& allocator, const PreparedTrace& trace, int passes,
             TargetSettings settings, std::uint64_t capacity) {
  settings.capacity = capacity;
  try {
    replay_in_process(allocator, trace, passes, /*touch=*/false, settings, nullptr, nullptr);
    return true;
  } catch (const OutOfMemory&) {
    return false;
  }
}

AllocatorResult run_in_process(const InProcessAllocator& allocator, const PreparedTrace& trace,
                               const ReplayOptions& options) {
  AllocatorResult result;
  result.allocator = allocator.name;
  result.description = allocator.description;
  TargetSettings settings = options.target;
  settings.capacity = options.capacity;
  std::optional<ProgressLine> progress;
  if (options.progress) progress.emplace(allocator.name);
  try {
    const InProcessRun run =
        replay_in_process(allocator, trace, options.passes, options.touch, settings,
                          &result.samples, progress ? &*progress : nullptr);
    result.pass_seconds = run.seconds;
    result.pass_memory_calls = run.memory_calls;
    result.peak_reserved = run.peak_reserved;
    result.counters = run.counters;
  } catch (const OutOfMemory& error) {
    result.problem = std::string("out of memory: ") + error.what();
    result.samples.clear();
    return result;
  } catch (const Error& error) {
    result.problem = error.what();
    result.failed = true;
    result.samples.clear();
    return result;
  }
  if (progress) progress->done();
  result.ns_per_op = median_ns_per_op(result.pass_seconds, trace.events.size());
  result.ratio = trace.peak_live == 0 ? 0 : double(result.peak_reserved) / double(trace.peak_live);
  result.ran = true;
  if (options.min_capacity) {
    result.min_capacity = find_min_capacity(allocator, trace, options.passes, options.target,
                                            result.peak_reserved, options.progress);
  }
  return result;
}

const InProcessAllocator* find_in_process(const std::string& name) {
  for (const InProcessAllocator& a : in_process_allocators()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

const SystemAllocator* find_system(const std::string& name) {
  for (const SystemAllocator& a : system_allocators()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> allocator_names() {
  std::vector<std::string> names;
  for (const InProcessAllocator& a : in_process_allocators()) names.push_back(a.name);
  for (const SystemAllocator& a : system_allocators()) names.push_back(a.name);
  return names;
}

std::optional<std::uint64_t> find_min_capacity(const InProcessAllocator& allocator,
                                               const PreparedTrace& trace, int passes,
                                               const TargetSettings& settings,
                                               std::uint64_t uncapped_peak, bool progress) {
  std::optional<ProgressLine> line;
  if (progress) line.emplace(allocator.name);
  // Below the peak live bytes nothing fits; the uncapped run's peak normally does.
  std::uint64_t low = trace.peak_live == 0 ? 0 : trace.peak_live - 1;
  std::uint64_t high = std::max(uncapped_peak, trace.peak_live);
  int grow = 0;
  while (!fits_in(allocator, trace, passes, settings, high)) {
    if (++grow > 4) return std::nullopt;
    low = high;
    high += high / 4;
  }
  // A 4 KiB page, or 1/4000 of the peak on big traces: ~12 probes either way.
  const std::uint64_t tolerance = std::max<std::uint64_t>(4096, trace.peak_live / 4000);
  int probe = 0;
  while (high - low > tolerance) {
    const std::uint64_t mid = low + (high - low) / 2;
    if (line) {
      line->report("--min-capacity probe " + std::to_string(++probe) + ", between " +
                   format_bytes(low) + " and " + format_bytes(high));
    }
    if (fits_in(allocator, trace, passes, settings, mid)) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return high;
}

ReplayRun run_replay(const EventTrace& trace, const ReplayOptions& options) {
  if (options.passes < 1) throw InvalidArgument("--passes must be at least 1");
  const std::vector<std::string> names =
      options.allocators.empty() ? allocator_names() : options.allocators;
  for (const std::string& name : names) {
    if (find_in_process(name) == nullptr && find_system(name) == nullptr) {
      std::string message = "unknown allocator '" + name + "' (known: ";
      const std::vector<std::string> known = allocator_names();
      for (std::size_t i = 0; i < known.size(); ++i) {
        if (i > 0) message += ", ";
        message += known[i];
      }
      message += ")";
      throw InvalidArgument(message);
    }
  }
  const PreparedTrace prepared = PreparedTrace::from(trace);
  ReplayRun run;
  run.trace = trace.source;
  run.events = prepared.events.size();
  run.allocations = prepared.slots;
  run.peak_live = prepared.peak_live;
  run.passes = options.passes;
  run.touch = options.touch;

  std::unique_ptr<TraceFileForChildren> child_trace;
  for (const std::string& name : names) {
    if (const InProcessAllocator* a = find_in_process(name)) {
      run.results.push_back(run_in_process(*a, prepared, options));
      continue;
    }
    if (!child_trace) child_trace = std::make_unique<TraceFileForChildren>(trace);
    const ChildReplaySettings settings{child_trace->path(), options.passes, options.touch,
                                       options.progress};
    AllocatorResult result = run_system_allocator(*find_system(name), settings, run.peak_live);
    if (result.ran && options.min_capacity) {
      result.counters += result.counters.empty() ? "" : "; ";
      result.counters += "no --min-capacity: a system allocator cannot be capped";
    }
    run.results.push_back(std::move(result));
  }
  return run;
}

}  // namespace sdalloc::replay
