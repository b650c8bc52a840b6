// virtual_memory_bench.cpp - what map operations and page faults cost, for
// VirtualMemoryPool's policy (docs/notebook/virtual_memory_pool.md quotes these figures).
//
//   BM_Vm_MapUnmap/<page>          map + unmap of one chunk, pages not touched: the
//                                  system-call cost of moving a page.
//   BM_Vm_RemapTouch/<page>        map, write one byte per 4 KiB, unmap, of one chunk at
//                                  alternating places: the cost of moving a page by unmap and
//                                  map where the memory cannot move (an unmap frees the
//                                  pages, so each round faults fresh zero pages in).
//   BM_Vm_RemapPopulateTouch/<page>  the same with MAP_POPULATE (HostVirtualMemoryOptions::
//                                  populate): one call instead of one fault per 4 KiB.
//   BM_Vm_MovePages/<n>            n 64 KiB pages (one run of chunks) moved by one
//                                  HostVirtualMemory::move and written: a VirtualMemoryPool
//                                  page move since 2026-12-03.
//   BM_Vm_UnmapMapPages/<n>        the same by unmap + map per page (the pool's moves before,
//                                  and where the memory cannot move).
//   BM_Vm_FreshChunkTouch/<page>   create, map, touch, unmap, destroy: a chunk's first use.
//   BM_Anon_FreshTouch/<page>      mmap anonymous, touch, munmap: what a plain pool's new
//                                  segment pays (HostResource).
//   BM_CachedAllocFree_Vmm/<size>  VirtualMemoryPool's warm alloc+free path, beside
//                                  BM_CachedAllocFree_Pool (cached_alloc_bench.cpp).
// Run: build/.../bench/sdalloc_bench --benchmark_filter='Vm|Anon|CachedAllocFree_(Vmm|Pool)/4096'
// (the moves alone: --benchmark_filter='Vm_(Move|UnmapMap)Pages')
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"

namespace {

using sdalloc::HostVirtualMemory;
using sdalloc::HostVirtualMemoryOptions;
using sdalloc::PhysicalChunk;
using sdalloc::Stream;

constexpr std::size_t kPage = 4096;

void touch(void* base, std::size_t bytes) {
  auto* p = static_cast<volatile unsigned char*>(base);
  for (std::size_t i = 0; i < bytes; i += kPage) p[i] = 1;
}

void PageSizes(benchmark::internal::Benchmark* b) { b->Arg(64 << 10)->Arg(2 << 20); }

void BM_Vm_MapUnmap(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  HostVirtualMemory memory;
  void* base = memory.reserve(bytes);
  const PhysicalChunk chunk = memory.create(bytes);
  for (auto _ : state) {
    memory.map(base, chunk);
    memory.unmap(base, bytes, Stream{});
  }
  memory.destroy(chunk);
  memory.release(base, bytes);
}
BENCHMARK(BM_Vm_MapUnmap)->Apply(PageSizes);

void remap_touch(benchmark::State& state, bool populate) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  HostVirtualMemory memory(HostVirtualMemoryOptions{.populate = populate});
  void* base = memory.reserve(2 * bytes);
  const PhysicalChunk chunk = memory.create(bytes);
  memory.map(base, chunk);
  touch(base, bytes);
  memory.unmap(base, bytes, Stream{});
  std::size_t flip = 0;
  for (auto _ : state) {
    void* at = static_cast<char*>(base) + flip * bytes;  // a new place each time
    memory.map(at, chunk);
    touch(at, bytes);
    memory.unmap(at, bytes, Stream{});
    flip ^= 1;
  }
  memory.destroy(chunk);
  memory.release(base, 2 * bytes);
}

void BM_Vm_RemapTouch(benchmark::State& state) { remap_touch(state, false); }
BENCHMARK(BM_Vm_RemapTouch)->Apply(PageSizes);

void BM_Vm_RemapPopulateTouch(benchmark::State& state) { remap_touch(state, true); }
BENCHMARK(BM_Vm_RemapPopulateTouch)->Apply(PageSizes);

// `count` 64 KiB chunks, created and mapped in order (one kernel mapping), written, then
// moved between two places of one range, and written again at each: the VirtualMemoryPool's
// page moves, by HostVirtualMemory::move (one call for the run) or by an unmap and a
// populating map per page (what the pool did before, and does where the memory cannot move).
void move_pages(benchmark::State& state, bool by_move) {
  constexpr std::size_t kChunk = 64 << 10;
  const auto count = static_cast<std::size_t>(state.range(0));
  HostVirtualMemory memory(HostVirtualMemoryOptions{.move_mappings = by_move});
  if (by_move && !memory.can_move()) {
    state.SkipWithError("this kernel cannot move shared mappings (Linux 5.13)");
    return;
  }
  const std::size_t bytes = count * kChunk;
  auto* base = static_cast<char*>(memory.reserve(2 * bytes));
  std::vector<PhysicalChunk> chunks;
  for (std::size_t i = 0; i < count; ++i) {
    chunks.push_back(memory.create(kChunk));
    memory.map(base + i * kChunk, chunks.back());
  }
  touch(base, bytes);
  std::size_t at = 0;
  for (auto _ : state) {
    char* from = base + at * bytes;
    char* to = base + (at ^ 1) * bytes;
    if (by_move) {
      memory.move(from, to, chunks.data(), count, Stream{});
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        memory.unmap(from + i * kChunk, kChunk, Stream{});
        memory.map(to + i * kChunk, chunks[i]);
      }
    }
    touch(to, bytes);
    at ^= 1;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * count));
  for (std::size_t i = 0; i < count; ++i)
    memory.unmap(base + at * bytes + i * kChunk, kChunk, Stream{});
  for (const PhysicalChunk& chunk : chunks) memory.destroy(chunk);
  memory.release(base, 2 * bytes);
}

void BM_Vm_MovePages(benchmark::State& state) { move_pages(state, true); }
BENCHMARK(BM_Vm_MovePages)->Arg(1)->Arg(16);

void BM_Vm_UnmapMapPages(benchmark::State& state) { move_pages(state, false); }
BENCHMARK(BM_Vm_UnmapMapPages)->Arg(1)->Arg(16);

void BM_Vm_FreshChunkTouch(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  HostVirtualMemory memory;
  void* base = memory.reserve(bytes);
  for (auto _ : state) {
    const PhysicalChunk chunk = memory.create(bytes);
    memory.map(base, chunk);
    touch(base, bytes);
    memory.unmap(base, bytes, Stream{});
    memory.destroy(chunk);
  }
  memory.release(base, bytes);
}
BENCHMARK(BM_Vm_FreshChunkTouch)->Apply(PageSizes);

void BM_Anon_FreshTouch(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      break;
    }
    touch(base, bytes);
    ::munmap(base, bytes);
  }
}
BENCHMARK(BM_Anon_FreshTouch)->Apply(PageSizes);

void BM_CachedAllocFree_Vmm(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  HostVirtualMemory memory;
  sdalloc::VirtualMemoryPool pool(memory);
  pool.deallocate(pool.allocate(bytes), bytes);  // warm: range reserved, pages mapped
  for (auto _ : state) {
    void* ptr = pool.allocate(bytes);
    benchmark::DoNotOptimize(ptr);
    pool.deallocate(ptr, bytes);
  }
}
BENCHMARK(BM_CachedAllocFree_Vmm)->Arg(4096)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace
