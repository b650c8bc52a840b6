// cached_alloc_bench.cpp - the cache-hit path: allocate and free one size, again and again.
//
// After the first iteration the block is cached, so every later allocate is a hit: this is
// the cost a caller pays per tensor in steady state. glibc malloc/free does the same work in
// the same run as the yardstick (bench/main.cpp prints the ratio). Sizes: 4 KiB (a small
// tensor, under malloc's mmap threshold) and 1 MiB (a typical activation slice).
//
// The _Threads variants run the same loop on 1 and 2 threads sharing one pool, each thread
// on its own stream (Stream{thread_index + 1}), as inference streams would: streams map to
// separate shards, so the per-thread rate should barely drop. Google Benchmark reports their
// real time per iteration over all threads' iterations; main.cpp turns it into a per-thread
// rate.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace {

void CachedSizes(benchmark::internal::Benchmark* b) {
  b->Arg(4096)->Arg(std::int64_t{1} << 20)->Unit(benchmark::kNanosecond);
}

// --- single thread ------------------------------------------------------------------------

void BM_CachedAllocFree_Pool(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  sdalloc::HostResource host;
  sdalloc::CachingPool pool(host);
  pool.deallocate(pool.allocate(bytes), bytes);  // warm: the first call takes a segment
  for (auto _ : state) {
    void* p = pool.allocate(bytes);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CachedAllocFree_Pool)->Apply(CachedSizes);

void BM_CachedAllocFree_Malloc(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::free(std::malloc(bytes));  // warm, as for the pool (also raises the mmap threshold)
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CachedAllocFree_Malloc)->Apply(CachedSizes);

// --- one pool, one stream per thread -----------------------------------------------------

// Made by thread 0 before the timed loop and destroyed by it after; the loop's start and
// end are barriers for all threads, so the others never see it missing.
std::unique_ptr<sdalloc::HostResource> shared_host;
std::unique_ptr<sdalloc::CachingPool> shared_pool;

void BM_CachedAllocFree_Pool_Threads(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) {
    shared_host = std::make_unique<sdalloc::HostResource>();
    shared_pool = std::make_unique<sdalloc::CachingPool>(*shared_host);
  }
  const sdalloc::Stream stream{static_cast<std::uintptr_t>(state.thread_index()) + 1};
  for (auto _ : state) {
    void* p = shared_pool->allocate(bytes, stream);
    benchmark::DoNotOptimize(p);
    shared_pool->deallocate(p, bytes, stream);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    shared_pool.reset();
    shared_host.reset();
  }
}
BENCHMARK(BM_CachedAllocFree_Pool_Threads)
    ->Apply(CachedSizes)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

void BM_CachedAllocFree_Malloc_Threads(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CachedAllocFree_Malloc_Threads)
    ->Apply(CachedSizes)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

}  // namespace
