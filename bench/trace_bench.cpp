// trace_bench.cpp - replays the bundled Stable Diffusion trace's allocations and frees.
//
// data/traces/sd15_unet_b2_64x64_cpu_2pass.csv is two UNet passes of SD 1.5 (6428 events,
// 4 B to 1 GiB, 2.2 GB live at peak). One benchmark iteration replays the whole trace, in
// order, against a CachingPool over HostResource, or against glibc malloc/free. The memory
// is never touched: this measures the allocator's bookkeeping, not page faults (the pool's
// segments and malloc's large chunks are mmap'ed and stay virtual). The pool lives across
// iterations, as in a real pipeline that runs step after step.
//
// The trace is read once with sdalloc::read_event_trace and turned into slots (a dense index
// per id) so the timed loop does no hashing. Set SDALLOC_BENCH_TRACE to replay another file.
// Each run reports a counter "events" (events per replay), from which main.cpp derives ns
// per event.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace {

struct ReplayStep {
  bool allocate;
  std::uint32_t slot;
  std::size_t bytes;
  sdalloc::Stream stream;
};

struct Replay {
  std::vector<ReplayStep> steps;
  std::vector<ReplayStep> frees_at_end;  // for allocations the trace leaves live
  std::size_t slots = 0;
  std::string error;  // why the trace could not be loaded, empty when it was
};

Replay load_replay() {
  Replay replay;
  const char* from_env = std::getenv("SDALLOC_BENCH_TRACE");
  const std::string path = from_env != nullptr ? from_env : SDALLOC_BENCH_TRACE;
  try {
    const sdalloc::EventTrace trace = sdalloc::read_event_trace(path);
    std::unordered_map<std::uint64_t, std::uint32_t> slot_of_id;
    replay.steps.reserve(trace.events.size());
    for (const sdalloc::TraceEvent& event : trace.events) {
      const bool allocate = event.op == sdalloc::TraceEvent::Op::kAlloc;
      std::uint32_t slot = 0;
      if (allocate) {
        slot = static_cast<std::uint32_t>(slot_of_id.size());
        slot_of_id.emplace(event.id, slot);
      } else {
        slot = slot_of_id.at(event.id);
      }
      replay.steps.push_back({allocate, slot, static_cast<std::size_t>(event.size),
                              sdalloc::Stream{static_cast<std::uintptr_t>(event.stream)}});
    }
    replay.slots = slot_of_id.size();
    std::vector<const ReplayStep*> live(replay.slots, nullptr);
    for (const ReplayStep& step : replay.steps) live[step.slot] = step.allocate ? &step : nullptr;
    for (const ReplayStep* step : live) {
      if (step != nullptr) {
        replay.frees_at_end.push_back({false, step->slot, step->bytes, step->stream});
      }
    }
  } catch (const std::exception& e) {
    replay.error = path + ": " + e.what();
  }
  return replay;
}

const Replay& bundled_replay() {
  static const Replay replay = load_replay();
  return replay;
}

// Runs the trace once with allocate/deallocate, then frees what the trace left live, so every
// replay starts from the same state.
template <typename Allocate, typename Deallocate>
void replay_once(const Replay& replay, std::vector<void*>& live, Allocate&& allocate,
                 Deallocate&& deallocate) {
  for (const ReplayStep& step : replay.steps) {
    if (step.allocate) {
      live[step.slot] = allocate(step.bytes, step.stream);
      benchmark::DoNotOptimize(live[step.slot]);
    } else {
      deallocate(live[step.slot], step.bytes, step.stream);
      live[step.slot] = nullptr;
    }
  }
  for (const ReplayStep& step : replay.frees_at_end) {
    deallocate(live[step.slot], step.bytes, step.stream);
    live[step.slot] = nullptr;
  }
}

void report(benchmark::State& state, const Replay& replay) {
  state.counters["events"] = static_cast<double>(replay.steps.size());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(replay.steps.size()));
}

void BM_Trace_Pool(benchmark::State& state) {
  const Replay& replay = bundled_replay();
  if (!replay.error.empty()) {
    state.SkipWithError(replay.error.c_str());
    return;
  }
  sdalloc::HostResource host;
  sdalloc::CachingPool pool(host);
  std::vector<void*> live(replay.slots, nullptr);
  auto allocate = [&pool](std::size_t bytes, sdalloc::Stream stream) {
    return pool.allocate(bytes, stream);
  };
  auto deallocate = [&pool](void* p, std::size_t bytes, sdalloc::Stream stream) {
    pool.deallocate(p, bytes, stream);
  };
  for (auto _ : state) replay_once(replay, live, allocate, deallocate);
  report(state, replay);
}
BENCHMARK(BM_Trace_Pool)->Unit(benchmark::kMicrosecond);

void BM_Trace_Malloc(benchmark::State& state) {
  const Replay& replay = bundled_replay();
  if (!replay.error.empty()) {
    state.SkipWithError(replay.error.c_str());
    return;
  }
  std::vector<void*> live(replay.slots, nullptr);
  auto allocate = [](std::size_t bytes, sdalloc::Stream) { return std::malloc(bytes); };
  auto deallocate = [](void* p, std::size_t, sdalloc::Stream) { std::free(p); };
  for (auto _ : state) replay_once(replay, live, allocate, deallocate);
  report(state, replay);
}
BENCHMARK(BM_Trace_Malloc)->Unit(benchmark::kMicrosecond);

}  // namespace
