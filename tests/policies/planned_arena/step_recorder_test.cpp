// step_recorder_test.cpp - StepRecorder: a recorded step's events, and the plan made of them.
#include "policies/planned_arena/step_recorder.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace sdalloc::planned_arena_detail {
namespace {

// Distinct fake pointers: the recorder only uses them as keys.
void* ptr(std::uintptr_t i) { return reinterpret_cast<void*>(i * 4096); }

TEST(PlannedArenaStepRecorder, RecordsAllocationsAndFreesInOrder) {
  StepRecorder recorder;
  recorder.start();
  EXPECT_TRUE(recorder.recording());
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.record_allocation(ptr(2), 1024, 512);
  recorder.record_free(ptr(1));
  recorder.record_free(ptr(2));
  const auto plan = recorder.finish(1.0);
  EXPECT_FALSE(recorder.recording());
  ASSERT_NE(plan, nullptr);
  ASSERT_EQ(plan->events.size(), 4u);
  EXPECT_TRUE(plan->events[0].is_alloc);
  EXPECT_EQ(plan->events[0].slot, 0u);
  EXPECT_TRUE(plan->events[1].is_alloc);
  EXPECT_EQ(plan->events[1].slot, 1u);
  EXPECT_FALSE(plan->events[2].is_alloc);
  EXPECT_EQ(plan->events[2].slot, 0u);
  EXPECT_FALSE(plan->events[3].is_alloc);
  EXPECT_EQ(plan->events[3].slot, 1u);
  EXPECT_EQ(plan->slots[0].allocated_at, 0);
  EXPECT_EQ(plan->slots[0].freed_at, 2);
  EXPECT_EQ(plan->slots[1].freed_at, 3);
}

TEST(PlannedArenaStepRecorder, OverlappingLifetimesGetDisjointBytes) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.record_allocation(ptr(2), 1024, 512);
  recorder.record_free(ptr(1));
  recorder.record_free(ptr(2));
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  const Slot& a = plan->slots[0];
  const Slot& b = plan->slots[1];
  EXPECT_TRUE(a.offset + a.rounded <= b.offset || b.offset + b.rounded <= a.offset);
  EXPECT_EQ(plan->size, 1536u);
  EXPECT_EQ(plan->offsets.size(), 2u);
  EXPECT_EQ(plan->offsets[a.offset_index], a.offset);
  EXPECT_EQ(plan->offsets[b.offset_index], b.offset);
}

TEST(PlannedArenaStepRecorder, BuffersThatFollowEachOtherShareAnOffset) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 1024, 512);
  recorder.record_free(ptr(1));
  recorder.record_allocation(ptr(2), 1024, 512);
  recorder.record_free(ptr(2));
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->size, 1024u);
  EXPECT_EQ(plan->offsets.size(), 1u);
  EXPECT_EQ(plan->slots[0].offset, plan->slots[1].offset);
}

TEST(PlannedArenaStepRecorder, SlotLiveAtTheEndIsKeptAndNotPlanned) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.record_allocation(ptr(2), 4096, 512);  // the step's carried state
  recorder.record_free(ptr(1));
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  EXPECT_FALSE(plan->slots[0].kept);
  EXPECT_TRUE(plan->slots[1].kept);
  EXPECT_EQ(plan->size, 512u);  // the kept 4 KiB take no arena bytes
  EXPECT_EQ(plan->offsets.size(), 1u);
}

TEST(PlannedArenaStepRecorder, StepWithNothingForTheArenaHasNoPlan) {
  StepRecorder recorder;
  recorder.start();
  EXPECT_EQ(recorder.finish(1.0), nullptr);  // no allocation at all
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);  // kept: never freed in the step
  EXPECT_EQ(recorder.finish(1.0), nullptr);
}

TEST(PlannedArenaStepRecorder, FreeOfAPointerNotRecordedIsNoEvent) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.record_free(ptr(7));
  recorder.record_free(ptr(1));
  recorder.record_free(ptr(1));  // freed already: no longer a recorded pointer
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->events.size(), 2u);
}

TEST(PlannedArenaStepRecorder, PlanTakesTheStrictestAlignment) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.record_allocation(ptr(2), 4096, 4096);
  recorder.record_free(ptr(2));
  recorder.record_free(ptr(1));
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->alignment, 4096u);
  EXPECT_EQ(plan->slots[1].offset % 4096, 0u);
}

TEST(PlannedArenaStepRecorder, StartForgetsAnEarlierRecording) {
  StepRecorder recorder;
  recorder.start();
  recorder.record_allocation(ptr(1), 512, 512);
  recorder.start();
  recorder.record_allocation(ptr(2), 1024, 512);
  recorder.record_free(ptr(1));  // of the forgotten recording: no event
  recorder.record_free(ptr(2));
  const auto plan = recorder.finish(1.0);
  ASSERT_NE(plan, nullptr);
  ASSERT_EQ(plan->slots.size(), 1u);
  EXPECT_EQ(plan->slots[0].rounded, 1024u);
  EXPECT_EQ(plan->events.size(), 2u);
}

}  // namespace
}  // namespace sdalloc::planned_arena_detail
