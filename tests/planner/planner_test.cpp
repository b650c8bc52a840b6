// Tests of the static planner (sdalloc/planner/planner.hpp): the lower bound, the validator, the
// greedy orders, the search, and the interval readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/planner/planner.hpp"
#include "sdalloc/trace/event_trace.hpp"

namespace sdalloc {
namespace {

const std::string kDataDir = SDALLOC_DATA_DIR;

std::string error_of(const auto& call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

// Random buffers: lifetimes in [0, horizon), sizes up to max_size, some with alignment.
std::vector<Buffer> random_buffers(std::mt19937_64& rng, std::size_t count, std::int64_t horizon,
                                   std::uint64_t max_size) {
  std::uniform_int_distribution<std::int64_t> time(0, horizon - 1);
  std::uniform_int_distribution<std::uint64_t> size(1, max_size);
  std::uniform_int_distribution<int> align_log(0, 6);
  std::vector<Buffer> buffers;
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t a = time(rng);
    std::int64_t b = time(rng);
    if (a > b) std::swap(a, b);
    buffers.push_back(Buffer{.id = i * 7 + 3,
                             .lower = a,
                             .upper = b + 1,
                             .size = size(rng),
                             .alignment = std::uint64_t{1} << align_log(rng)});
  }
  return buffers;
}

// Cuts the rectangle [0, horizon) x [0, width) into pieces by random guillotine cuts; each
// piece is a buffer. The pieces tile the rectangle, so the lower bound is `width` and a plan
// of exactly that size exists.
void cut(std::mt19937_64& rng, std::int64_t t0, std::int64_t t1, std::uint64_t s0, std::uint64_t s1,
         int depth, std::vector<Buffer>& out) {
  const bool can_cut_time = t1 - t0 >= 2;
  const bool can_cut_space = s1 - s0 >= 2;
  if (depth == 0 || (!can_cut_time && !can_cut_space)) {
    out.push_back(Buffer{.id = out.size(), .lower = t0, .upper = t1, .size = s1 - s0});
    return;
  }
  const bool along_time = can_cut_time && (!can_cut_space || (rng() & 1) != 0);
  if (along_time) {
    const std::int64_t t = t0 + 1 + static_cast<std::int64_t>(rng() % (t1 - t0 - 1));
    cut(rng, t0, t, s0, s1, depth - 1, out);
    cut(rng, t, t1, s0, s1, depth - 1, out);
  } else {
    const std::uint64_t s = s0 + 1 + rng() % (s1 - s0 - 1);
    cut(rng, t0, t1, s0, s, depth - 1, out);
    cut(rng, t0, t1, s, s1, depth - 1, out);
  }
}

TEST(PlannerLowerBound, IsThePeakOfLiveBytes) {
  const std::vector<Buffer> buffers = {
      {.id = 1, .lower = 0, .upper = 4, .size = 10},
      {.id = 2, .lower = 2, .upper = 6, .size = 20},
      {.id = 3, .lower = 3, .upper = 5, .size = 5},   // 10 + 20 + 5 live at time 3
      {.id = 4, .lower = 5, .upper = 9, .size = 30},  // 20 + 30 live at time 5
  };
  EXPECT_EQ(lower_bound(buffers), 50u);
}

TEST(PlannerLowerBound, TouchingLifetimesAreNotLiveTogether) {
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 4, .size = 10},
                                       {.id = 2, .lower = 4, .upper = 8, .size = 10}};
  EXPECT_EQ(lower_bound(buffers), 10u);
}

TEST(PlannerValidate, RejectsBuffersOverlappingInTimeAndSpace) {
  const std::vector<Buffer> buffers = {{.id = 11, .lower = 0, .upper = 4, .size = 10},
                                       {.id = 22, .lower = 3, .upper = 8, .size = 10}};
  const Plan plan{.offsets = {0, 9}, .arena_size = 19};
  const std::string message = error_of([&] { validate(buffers, plan); });
  EXPECT_NE(message.find("11"), std::string::npos) << message;
  EXPECT_NE(message.find("22"), std::string::npos) << message;
}

TEST(PlannerValidate, RejectsABufferInsideAnother) {
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 10, .size = 100},
                                       {.id = 2, .lower = 5, .upper = 6, .size = 10},
                                       {.id = 3, .lower = 1, .upper = 2, .size = 10}};
  EXPECT_THROW(validate(buffers, Plan{.offsets = {0, 40, 100}, .arena_size = 110}),
               InvalidArgument);
}

TEST(PlannerValidate, AcceptsTouchingLifetimesThatShareMemory) {
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 4, .size = 10},
                                       {.id = 2, .lower = 4, .upper = 8, .size = 10}};
  EXPECT_NO_THROW(validate(buffers, Plan{.offsets = {0, 0}, .arena_size = 10}));
}

TEST(PlannerValidate, AcceptsAdjacentMemoryAtTheSameTime) {
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 4, .size = 10},
                                       {.id = 2, .lower = 0, .upper = 4, .size = 10}};
  EXPECT_NO_THROW(validate(buffers, Plan{.offsets = {10, 0}, .arena_size = 20}));
}

TEST(PlannerValidate, RejectsWrongArenaSizeMisalignmentAndLength) {
  const std::vector<Buffer> buffers = {
      {.id = 1, .lower = 0, .upper = 4, .size = 10, .alignment = 8}};
  EXPECT_THROW(validate(buffers, Plan{.offsets = {0}, .arena_size = 9}), InvalidArgument);
  EXPECT_THROW(validate(buffers, Plan{.offsets = {4}, .arena_size = 14}), InvalidArgument);
  EXPECT_THROW(validate(buffers, Plan{.offsets = {}, .arena_size = 0}), InvalidArgument);
  EXPECT_NO_THROW(validate(buffers, Plan{.offsets = {8}, .arena_size = 18}));
}

TEST(PlannerInput, MalformedBuffersAreRejected) {
  const auto rejected = [](Buffer b) {
    const std::vector<Buffer> buffers = {b};
    return !error_of([&] { plan(buffers); }).empty();
  };
  EXPECT_TRUE(rejected({.id = 1, .lower = 4, .upper = 4, .size = 1}));
  EXPECT_TRUE(rejected({.id = 1, .lower = 5, .upper = 4, .size = 1}));
  EXPECT_TRUE(rejected({.id = 1, .lower = 0, .upper = 4, .size = 0}));
  EXPECT_TRUE(rejected({.id = 1, .lower = 0, .upper = 4, .size = 1, .alignment = 3}));
  EXPECT_TRUE(rejected({.id = 1, .lower = 0, .upper = 4, .size = 1, .alignment = 0}));
  const std::vector<Buffer> duplicate = {{.id = 7, .lower = 0, .upper = 1, .size = 1},
                                         {.id = 7, .lower = 2, .upper = 3, .size = 1}};
  EXPECT_NE(error_of([&] { plan(duplicate); }).find("duplicate buffer id 7"), std::string::npos);
}

TEST(PlannerGreedy, EveryOrderProducesAValidPlan) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 20; ++round) {
    const std::vector<Buffer> buffers = random_buffers(rng, 200, 100, 5000);
    for (const GreedyOrder order :
         {GreedyOrder::kSize, GreedyOrder::kLifetime, GreedyOrder::kArea, GreedyOrder::kBestFit}) {
      const Plan p = plan_greedy(buffers, order);
      EXPECT_NO_THROW(validate(buffers, p));
      EXPECT_GE(p.arena_size, lower_bound(buffers));
    }
  }
}

TEST(PlannerPlan, NeverExceedsTheCapacityItReportsFitting) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 10; ++round) {
    const std::vector<Buffer> buffers = random_buffers(rng, 60, 40, 1000);
    const std::uint64_t bound = lower_bound(buffers);
    for (const std::uint64_t capacity : {bound, bound + bound / 20, bound * 2}) {
      const PlanResult result =
          plan(buffers, PlannerOptions{.capacity = capacity, .time_limit_seconds = 0.05});
      EXPECT_NO_THROW(validate(buffers, result.plan));
      EXPECT_EQ(result.fits, result.plan.arena_size <= capacity);
      if (capacity == bound * 2) {
        EXPECT_TRUE(result.fits);  // greedy alone fits 2x here
      }
      EXPECT_EQ(result.lower_bound, bound);
    }
  }
}

TEST(PlannerPlan, SearchRecoversAPerfectPackingThatGreedyMisses) {
  std::mt19937_64 rng(2024);
  int greedy_missed = 0;
  for (int round = 0; round < 20; ++round) {
    std::vector<Buffer> buffers;
    cut(rng, 0, 64, 0, 4096, 5, buffers);
    std::shuffle(buffers.begin(), buffers.end(), rng);
    ASSERT_EQ(lower_bound(buffers), 4096u);
    if (plan_greedy(buffers, GreedyOrder::kSize).arena_size > 4096) ++greedy_missed;
    const PlanResult result =
        plan(buffers, PlannerOptions{.capacity = 4096, .time_limit_seconds = 5.0});
    EXPECT_TRUE(result.fits) << "round " << round << ": arena " << result.plan.arena_size;
    EXPECT_NO_THROW(validate(buffers, result.plan));
  }
  EXPECT_GT(greedy_missed, 0) << "the instances are too easy to show the search";
}

TEST(PlannerPlan, MinimisesToTheLowerBoundWithoutACapacity) {
  std::mt19937_64 rng(99);
  std::vector<Buffer> buffers;
  cut(rng, 0, 32, 0, 1000, 6, buffers);
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 5.0});
  EXPECT_EQ(result.plan.arena_size, 1000u);
  EXPECT_TRUE(result.optimal);
  EXPECT_TRUE(result.fits);
}

TEST(PlannerPlan, ProvesAnImpossibleCapacityInfeasible) {
  // Three buffers live together need 30 bytes; 25 cannot work, and the search says so
  // quickly instead of running out the clock.
  const std::vector<Buffer> buffers = {{.id = 1, .lower = 0, .upper = 3, .size = 10},
                                       {.id = 2, .lower = 1, .upper = 4, .size = 10},
                                       {.id = 3, .lower = 2, .upper = 5, .size = 10}};
  const PlanResult result =
      plan(buffers, PlannerOptions{.capacity = 25, .time_limit_seconds = 5.0});
  EXPECT_FALSE(result.fits);
  EXPECT_FALSE(result.timed_out);
  EXPECT_NO_THROW(validate(buffers, result.plan));
}

TEST(PlannerPlan, ZeroTimeLimitStillReturnsAValidPlan) {
  std::mt19937_64 rng(5);
  const std::vector<Buffer> buffers = random_buffers(rng, 300, 200, 100000);
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 0.0});
  EXPECT_NO_THROW(validate(buffers, result.plan));
  EXPECT_GE(result.plan.arena_size, result.lower_bound);
}

TEST(PlannerPlan, EmptyInputGivesAnEmptyArena) {
  const PlanResult result = plan(std::vector<Buffer>{});
  EXPECT_EQ(result.plan.arena_size, 0u);
  EXPECT_TRUE(result.fits);
}

TEST(PlannerMiniMalloc, QuickChallengingInstancesFitTheirCapacity) {
  // The instances this planner solves fastest; the rest are run by the tool (see
  // data/minimalloc/README.md), not here, to keep the suite short.
  for (const char* name : {"K"}) {
    const std::vector<Buffer> buffers =
        read_interval_csv(kDataDir + "/minimalloc/" + name + ".1048576.csv");
    const PlanResult result =
        plan(buffers, PlannerOptions{.capacity = 1048576, .time_limit_seconds = 15.0});
    EXPECT_TRUE(result.fits) << name << ": arena " << result.plan.arena_size;
    EXPECT_LE(result.plan.arena_size, 1048576u) << name;
  }
}

TEST(PlannerTrace, BundledSdTracePlansWithinHalfAPercentOfTheBound) {
  const EventTrace trace = read_event_trace(kDataDir + "/traces/sd15_unet_b2_64x64_cpu_2pass.csv");
  const std::vector<Buffer> buffers = buffers_from_trace(trace);
  ASSERT_EQ(lower_bound(buffers), trace.peak_live_bytes());
  const PlanResult result = plan(buffers, PlannerOptions{.time_limit_seconds = 1.0});
  EXPECT_LE(static_cast<double>(result.plan.arena_size),
            1.005 * static_cast<double>(result.lower_bound));
}

TEST(PlannerTrace, EventsBecomeIntervalsByEventIndex) {
  std::istringstream text("op,id,size\na,5,100\na,6,200\nf,5,100\na,7,50\n");
  const std::vector<Buffer> buffers = buffers_from_trace(parse_event_trace(text, "t"));
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].id, 5u);
  EXPECT_EQ(buffers[0].lower, 0);
  EXPECT_EQ(buffers[0].upper, 2);
  EXPECT_EQ(buffers[1].upper, 4);  // never freed: live to the end
  EXPECT_EQ(buffers[2].lower, 3);
  EXPECT_EQ(lower_bound(buffers), 300u);
}

TEST(PlannerCsv, ReadsMiniMallocFormatAndWritesOffsets) {
  std::istringstream text("id,lower,upper,size\n0,0,10,64\n1,5,15,32\r\n");
  const std::vector<Buffer> buffers = parse_interval_csv(text, "x.csv");
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[1].lower, 5);
  EXPECT_EQ(buffers[1].size, 32u);
  const PlanResult result = plan(buffers);
  std::ostringstream out;
  write_plan_csv(buffers, result.plan, out);
  std::istringstream again(out.str());
  EXPECT_EQ(out.str().rfind("id,lower,upper,size,offset\n", 0), 0u);
  EXPECT_EQ(parse_interval_csv(again, "out.csv").size(), 2u);  // the offset column is allowed
}

TEST(PlannerCsv, MalformedLinesAreNamed) {
  const auto error_for = [](const std::string& content) {
    std::istringstream text(content);
    return error_of([&] { parse_interval_csv(text, "in.csv"); });
  };
  EXPECT_NE(error_for("id,start,end,size\n").find("in.csv:1:"), std::string::npos);
  EXPECT_NE(error_for("id,lower,upper,size\n0,0,10,64\n1,5,x,32\n").find("in.csv:3:"),
            std::string::npos);
  EXPECT_NE(error_for("id,lower,upper,size\n0,0,10\n").find("in.csv:2:"), std::string::npos);
  EXPECT_NE(error_for("id,lower,upper,size\n0,10,10,8\n").find("in.csv:2:"), std::string::npos);
  EXPECT_NE(error_for("id,lower,upper,size\n0,0,10,0\n").find("in.csv:2:"), std::string::npos);
  const std::string duplicate = error_for("id,lower,upper,size\n3,0,1,8\n3,2,4,8\n");
  EXPECT_NE(duplicate.find("in.csv:3:"), std::string::npos) << duplicate;
  EXPECT_NE(duplicate.find("line 2"), std::string::npos) << duplicate;
}

}  // namespace
}  // namespace sdalloc
