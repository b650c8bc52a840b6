// deep_stack_test.cpp - run_on_deep_stack (planner/deep_stack.hpp): the planner's search
// recurses once per buffer, thousands deep on a diffusion step, which overflowed the 8 MiB
// default stack under AddressSanitizer (SDXL-sized steps would in release too).
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>

#include "planner/deep_stack.hpp"

namespace sdalloc::planner_detail {
namespace {

// Recursion with 4 KiB of live locals a level, read after the call so that the compiler can
// neither drop the frame nor turn the recursion into a loop (this overflows an 8 MiB stack).
std::size_t recurse(std::size_t depth) {
  volatile char frame[4096];
  frame[depth % sizeof frame] = 1;
  if (depth == 0) return 0;
  const std::size_t below = recurse(depth - 1);
  return below + static_cast<std::size_t>(frame[depth % sizeof frame]);
}

TEST(DeepStack, RunsRecursionFarDeeperThanADefaultStack) {
  // 16,384 levels of >= 4 KiB: at least 64 MiB, eight times a default thread stack.
  std::size_t result = 0;
  run_on_deep_stack([&] { result = recurse(16384); });
  EXPECT_EQ(result, 16384u);
}

TEST(DeepStack, RethrowsWhatTheWorkThrows) {
  EXPECT_THROW(run_on_deep_stack([] { throw std::runtime_error("from the deep stack"); }),
               std::runtime_error);
}

}  // namespace
}  // namespace sdalloc::planner_detail
