// trace_replay.hpp - replays a recorded allocation trace through a pool: the step the trace
// acceptance tests share (trace_replay_test.cpp for CachingPool,
// virtual_memory_trace_replay_test.cpp for VirtualMemoryPool,
// planned_arena_trace_replay_test.cpp for PlannedArena), written once for any sdalloc::Pool,
// and the bundled traces they run on.
//
// replay(trace, pool) checks, and reports as a gtest AssertionResult:
//  - the pool serves every allocation and takes back every free, in the trace's order and on
//    the trace's streams; the first sdalloc::Error it raises fails the replay, naming the
//    event (index, op, id, size) and the error's message;
//  - the trace frees only ids it has allocated (a free of an unknown id fails the replay);
//  - the pool's check_invariants() holds every 1024 events (when it does not, its exception
//    leaves replay() and gtest fails the test).
// It stops at the first failure, leaving what it had allocated in the pool; on success it
// frees what the trace left live, so the pool ends with no live bytes. The memory is never
// touched. The pool's statistics are the caller's to check afterwards.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool.hpp"
#include "sdalloc/core/stream.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc::conformance {

// Replays every event through `pool`, checking the invariants now and then, and calling
// `after_each()` after every event. Fails (and stops) at the first event the pool refuses.
template <sdalloc::Pool P, std::invocable AfterEach>
::testing::AssertionResult replay(const EventTrace& trace, P& pool, AfterEach&& after_each) {
  std::unordered_map<std::uint64_t, void*> live;  // trace id -> pointer
  std::size_t index = 0;
  for (const TraceEvent& event : trace.events) {
    const Stream stream{static_cast<std::uintptr_t>(event.stream)};
    try {
      if (event.op == TraceEvent::Op::kAlloc) {
        live[event.id] = pool.allocate(static_cast<std::size_t>(event.size), stream);
      } else {
        auto it = live.find(event.id);
        if (it == live.end()) {
          return ::testing::AssertionFailure() << "event " << index << " frees unknown id";
        }
        pool.deallocate(it->second, static_cast<std::size_t>(event.size), stream);
        live.erase(it);
      }
    } catch (const Error& e) {
      return ::testing::AssertionFailure()
             << "event " << index << " (" << (event.op == TraceEvent::Op::kAlloc ? "a" : "f") << ","
             << event.id << "," << event.size << "): " << e.what();
    }
    after_each();
    if (++index % 1024 == 0) pool.check_invariants();
  }
  for (const auto& [id, ptr] : live) pool.free(ptr);
  return ::testing::AssertionSuccess();
}

template <sdalloc::Pool P>
::testing::AssertionResult replay(const EventTrace& trace, P& pool) {
  return replay(trace, pool, [] {});
}

// Every bundled trace (data/traces/*.csv), sorted: the parameters of the trace suites.
inline std::vector<std::string> bundled_traces() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(SDALLOC_DATA_DIR "/traces")) {
    if (entry.path().extension() == ".csv") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A test name from a trace's path: its stem with every other character than [A-Za-z0-9]
// made '_'.
inline std::string trace_test_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = std::filesystem::path(param.param).stem().string();
  for (char& c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0) c = '_';
  }
  return name;
}

}  // namespace sdalloc::conformance
