// planner_bench.cpp - the static planner on long schedules of tiny alloc/free pairs (issue 15,
// F5): greedy placement used to scan every placed buffer for each new one (10^6 pairs: 82 s).
// BM_GreedyAllocFreePairs reports its complexity over 2^14..2^20 pairs (expected
// N log N); BM_PlanAllocFreePairs is the whole plan() (check, lower bound, greedy, validate)
// on 10^5 and 10^6 pairs, which should take a few seconds at most.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "sdalloc/planner/planner.hpp"

namespace {

std::vector<sdalloc::Buffer> alloc_free_pairs(std::int64_t n) {
  std::vector<sdalloc::Buffer> buffers;
  buffers.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    buffers.push_back(sdalloc::Buffer{.id = static_cast<std::uint64_t>(i),
                                      .lower = 2 * i,
                                      .upper = 2 * i + 1,
                                      .size = 64 + static_cast<std::uint64_t>(i % 7) * 64});
  }
  return buffers;
}

void BM_GreedyAllocFreePairs(benchmark::State& state) {
  const std::vector<sdalloc::Buffer> buffers = alloc_free_pairs(state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(sdalloc::plan_greedy(buffers, sdalloc::GreedyOrder::kSize));
  }
  state.SetComplexityN(state.range(0));
}
BENCHMARK(BM_GreedyAllocFreePairs)
    ->RangeMultiplier(4)
    ->Range(1 << 14, 1 << 20)
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(1)
    ->Complexity(benchmark::oNLogN);

void BM_PlanAllocFreePairs(benchmark::State& state) {
  const std::vector<sdalloc::Buffer> buffers = alloc_free_pairs(state.range(0));
  for (auto _ : state) {
    const sdalloc::PlanResult result = sdalloc::plan(buffers);
    if (result.cut_short) state.SkipWithError("plan() ran out of its time limit");
    benchmark::DoNotOptimize(result.plan.arena_size);
  }
}
BENCHMARK(BM_PlanAllocFreePairs)
    ->Arg(100000)
    ->Arg(1000000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(1);

}  // namespace
