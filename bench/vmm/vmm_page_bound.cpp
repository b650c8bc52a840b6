// vmm_page_bound.cpp - sdalloc_vmm_page_bound: how few pages vmm could move on a trace.
//
// vmm (VirtualMemoryPool) lays a pass out by best fit in virtual addresses and keeps about
// 1.04 x live of physical pages under them; a page freed at one address and needed at
// another moves. This program asks whether a better choice of which page to move would
// make the repeated pass cheap, or whether the layout itself needs the moves:
//   1. replays the trace PASSES times through a VirtualMemoryPool over host memory (the
//      default options, as `sdalloc replay -a vmm`), recording where each block went, and
//      reads the pool's own pages moved per pass;
//   2. replays the same addresses through a page simulation in which a needed page comes
//      from the free mapped page whose next use is farthest away (Belady's choice, optimal
//      for plain demand paging), first with as many pages as vmm held at its peak, then
//      with 1.05 x the peak live bytes (issue 16's memory bar for vmm);
//   3. counts the distinct pages the last pass touches: with this layout, the pages a pass
//      needs for no page to move at all.
// Pages are 64 KiB, the pool's page on host memory for both its classes. Every figure is
// counted, not timed, so it does not depend on the machine.
//
// Usage: sdalloc_vmm_page_bound TRACE [PASSES]   (PASSES 2-100, default 3)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/trace/trace_input.hpp"

namespace {

constexpr std::uint64_t kPage = std::uint64_t{64} << 10;
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

// One block as the pool placed it (its pages first..last), or the end of a pass.
struct PlacedEvent {
  enum class Kind : std::uint8_t { kAlloc, kFree, kPassEnd } kind;
  std::uint64_t first_page = 0;
  std::uint64_t last_page = 0;
};

struct VmmRun {
  std::vector<PlacedEvent> events;
  std::vector<std::uint64_t> pages_moved;  // per pass, the pool's own count
  std::uint64_t peak_physical_pages = 0;
};

VmmRun replay_through_vmm(const sdalloc::EventTrace& trace, int passes) {
  sdalloc::HostVirtualMemory memory;
  sdalloc::VirtualMemoryPool pool(memory);
  VmmRun run;
  std::uint64_t moved_before = 0;
  for (int pass = 0; pass < passes; ++pass) {
    struct Live {
      void* ptr;
      std::uint64_t size;
    };
    std::unordered_map<std::uint64_t, Live> live;
    auto place = [&](PlacedEvent::Kind kind, const Live& block) {
      const auto first = reinterpret_cast<std::uintptr_t>(block.ptr);
      run.events.push_back(
          {kind, first / kPage, (first + std::max<std::uint64_t>(block.size, 1) - 1) / kPage});
    };
    for (const sdalloc::TraceEvent& e : trace.events) {
      if (e.op == sdalloc::TraceEvent::Op::kAlloc) {
        Live block{pool.allocate(e.size, sdalloc::Stream{}), e.size};
        live[e.id] = block;
        place(PlacedEvent::Kind::kAlloc, block);
      } else if (auto it = live.find(e.id); it != live.end()) {
        place(PlacedEvent::Kind::kFree, it->second);
        pool.deallocate(it->second.ptr, it->second.size, sdalloc::Stream{});
        live.erase(it);
      }
    }
    for (const auto& [id, block] : live) {  // what the trace never frees ends with the pass
      place(PlacedEvent::Kind::kFree, block);
      pool.deallocate(block.ptr, block.size, sdalloc::Stream{});
    }
    run.events.push_back({PlacedEvent::Kind::kPassEnd});
    const std::uint64_t moved = pool.vm_stats().remapped_pages;
    run.pages_moved.push_back(moved - moved_before);
    moved_before = moved;
  }
  run.peak_physical_pages = pool.vm_stats().peak_physical_bytes / kPage;
  return run;
}

// Pages moved per pass when `capacity` pages serve the placed events and each needed page
// comes from the free mapped page used again last (none free: a new page, as vmm grows).
std::vector<std::uint64_t> farthest_next_use(const std::vector<PlacedEvent>& events,
                                             std::uint64_t capacity) {
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> uses;  // page -> event indices
  for (std::uint64_t i = 0; i < events.size(); ++i) {
    if (events[i].kind != PlacedEvent::Kind::kAlloc) continue;
    for (std::uint64_t p = events[i].first_page; p <= events[i].last_page; ++p)
      uses[p].push_back(i);
  }
  auto next_use = [&](std::uint64_t page, std::uint64_t after) {
    const std::vector<std::uint64_t>& u = uses[page];
    auto it = std::upper_bound(u.begin(), u.end(), after);
    return it == u.end() ? kNever : *it;
  };
  std::unordered_map<std::uint64_t, std::uint32_t> users;     // mapped page -> live blocks on it
  std::unordered_map<std::uint64_t, std::uint64_t> idle_key;  // free mapped page -> its next use
  std::set<std::pair<std::uint64_t, std::uint64_t>> idle;  // (next use, page) of free mapped pages
  std::uint64_t held = 0, moved = 0;
  std::vector<std::uint64_t> per_pass;
  for (std::uint64_t i = 0; i < events.size(); ++i) {
    const PlacedEvent& e = events[i];
    if (e.kind == PlacedEvent::Kind::kPassEnd) {
      per_pass.push_back(moved);
      moved = 0;
      continue;
    }
    if (e.kind == PlacedEvent::Kind::kFree) {
      for (std::uint64_t p = e.first_page; p <= e.last_page; ++p) {
        if (--users[p] > 0) continue;
        idle_key[p] = next_use(p, i);
        idle.insert({idle_key[p], p});
      }
      continue;
    }
    // Pages already mapped first, so that none of them is taken for another page of the block.
    for (std::uint64_t p = e.first_page; p <= e.last_page; ++p) {
      auto it = users.find(p);
      if (it == users.end()) continue;
      if (it->second++ == 0) idle.erase({idle_key[p], p});
    }
    for (std::uint64_t p = e.first_page; p <= e.last_page; ++p) {
      if (users.count(p) != 0) continue;
      if (held < capacity || idle.empty()) {
        ++held;
      } else {
        auto victim = std::prev(idle.end());
        users.erase(victim->second);
        idle_key.erase(victim->second);
        idle.erase(victim);
        ++moved;
      }
      users[p] = 1;
    }
  }
  return per_pass;
}

std::uint64_t distinct_pages_of_last_pass(const std::vector<PlacedEvent>& events) {
  std::unordered_set<std::uint64_t> pages;
  auto end = events.end() - 1;  // the last pass end
  auto begin = end;
  while (begin != events.begin() && std::prev(begin)->kind != PlacedEvent::Kind::kPassEnd) --begin;
  for (auto it = begin; it != end; ++it) {
    if (it->kind != PlacedEvent::Kind::kAlloc) continue;
    for (std::uint64_t p = it->first_page; p <= it->last_page; ++p) pages.insert(p);
  }
  return pages.size();
}

std::string per_pass_list(const std::vector<std::uint64_t>& v) {
  std::string s;
  for (std::uint64_t x : v) {
    if (!s.empty()) s += ' ';
    s += std::to_string(x);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s TRACE [PASSES]   (PASSES 2-100, default 3)\n", argv[0]);
    return 2;
  }
  const int passes = argc == 3 ? std::atoi(argv[2]) : 3;
  if (passes < 2 || passes > 100) {
    std::fprintf(stderr, "%s: PASSES must be 2-100, got '%s'\n", argv[0], argv[2]);
    return 2;
  }
  try {
    const sdalloc::EventTrace trace = sdalloc::read_any_trace(argv[1]);
    const std::uint64_t live_pages = (trace.peak_live_bytes() + kPage - 1) / kPage;
    const VmmRun run = replay_through_vmm(trace, passes);
    const auto at_vmm = farthest_next_use(run.events, run.peak_physical_pages);
    const std::uint64_t bar_pages = (live_pages * 105 + 99) / 100;
    const auto at_bar = farthest_next_use(run.events, bar_pages);
    const std::uint64_t needed = distinct_pages_of_last_pass(run.events);
    std::printf("%s: %d passes, peak live %llu pages of 64 KiB\n", argv[1], passes,
                static_cast<unsigned long long>(live_pages));
    std::printf("  vmm: %llu pages held (%.3f x live), pages moved per pass: %s\n",
                static_cast<unsigned long long>(run.peak_physical_pages),
                static_cast<double>(run.peak_physical_pages) / static_cast<double>(live_pages),
                per_pass_list(run.pages_moved).c_str());
    std::printf("  farthest next use, %llu pages (vmm's): %s\n",
                static_cast<unsigned long long>(run.peak_physical_pages),
                per_pass_list(at_vmm).c_str());
    std::printf("  farthest next use, %llu pages (1.05 x live): %s\n",
                static_cast<unsigned long long>(bar_pages), per_pass_list(at_bar).c_str());
    std::printf("  pages the last pass touches: %llu (%.3f x live): no page moves with that many\n",
                static_cast<unsigned long long>(needed),
                static_cast<double>(needed) / static_cast<double>(live_pages));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}
