// random_sequence.hpp - seeded random allocate/free sequences, checked by a ReferenceModel.
//
// A sequence interleaves allocations of log-uniform sizes with frees of randomly chosen
// live allocations (so frees come in random order, not LIFO), the way a network's tensors
// come and go. Every result goes through the model (alignment, no overlap, pattern) and every
// free first checks the allocation's pattern. The sequence keeps its live set within a byte
// budget and a count, so memory use stays bounded whatever the seed.
//
// run_random_sequence() only asserts through its result, never through gtest macros, so
// several threads may run sequences at once and report afterwards.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <random>
#include <vector>

#include "conformance/reference_model.hpp"
#include "sdalloc/core/resource.hpp"

namespace sdalloc::conformance {

struct SequenceShape {
  int operations = 2000;
  std::size_t max_size = std::size_t{64} << 20;      // sizes are log-uniform in [1, max_size)
  std::size_t live_budget = std::size_t{512} << 20;  // most bytes live at once
  std::size_t max_live = 256;                        // most allocations live at once
  std::vector<Stream> streams{kDefaultStream};       // allocations pick one at random
  bool free_on_any_stream = false;                   // else free on the allocation's stream
  bool free_everything_at_end = true;
  int checkpoint_every = 250;  // operations between checkpoint calls
};

// Runs the sequence on `resource`, recording in `model`. `checkpoint`, if given, is called
// every shape.checkpoint_every operations and at the end (when the resource is quiescent for
// a single-threaded caller).
inline ::testing::AssertionResult run_random_sequence(
    MemoryResource& resource, ReferenceModel& model, std::mt19937_64& rng,
    const SequenceShape& shape, const std::function<void()>& checkpoint = {}) {
  LogUniformSize size_of(shape.max_size);
  std::uniform_int_distribution<std::size_t> stream_index(0, shape.streams.size() - 1);
  std::bernoulli_distribution allocate_next(0.5);

  auto free_one = [&]() -> ::testing::AssertionResult {
    auto [ptr, entry] = model.pick(rng);
    auto intact = model.remove(ptr);
    if (!intact) return intact;
    const Stream stream =
        shape.free_on_any_stream ? shape.streams[stream_index(rng)] : entry.stream;
    try {
      resource.deallocate(ptr, entry.size, stream);
    } catch (const std::exception& e) {
      return ::testing::AssertionFailure()
             << "deallocate(" << ptr << ", " << entry.size << ") threw: " << e.what();
    }
    return ::testing::AssertionSuccess();
  };

  for (int op = 0; op < shape.operations; ++op) {
    const std::size_t size = size_of(rng);
    const bool fits =
        model.totals().bytes + size <= shape.live_budget && model.totals().count < shape.max_live;
    if (model.empty() || (fits && allocate_next(rng))) {
      const Stream stream = shape.streams[stream_index(rng)];
      void* ptr = nullptr;
      try {
        ptr = resource.allocate(size, stream);
      } catch (const std::exception& e) {
        return ::testing::AssertionFailure()
               << "operation " << op << ": allocate(" << size << ") threw: " << e.what() << " ("
               << model.totals().bytes << " bytes live in the model)";
      }
      auto added = model.add(ptr, size, stream);
      if (!added) return added << " (operation " << op << ")";
    } else {
      auto freed = free_one();
      if (!freed) return freed << " (operation " << op << ")";
    }
    if (checkpoint && (op + 1) % shape.checkpoint_every == 0) checkpoint();
  }
  if (shape.free_everything_at_end) {
    while (!model.empty()) {
      auto freed = free_one();
      if (!freed) return freed << " (final frees)";
    }
  }
  if (checkpoint) checkpoint();
  return ::testing::AssertionSuccess();
}

}  // namespace sdalloc::conformance
