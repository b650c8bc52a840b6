// sdalloc/transfer/offload_plan.hpp - when to load and evict each weight under a budget.
//
// Pure computation (no memory, no copies). Input: the weights' sizes, the order in which one
// step uses them (a sequence of *uses*, each the weights one layer reads together), the
// device budget B, the prefetch depth d, and the weights resident when the step starts.
// Output: before each use i, the weights to evict and the weights to start loading.
//
// How: the loads are issued in the order of use, each as early as the window allows - the
// load for use p is issued before use i once p <= i + d (the window wraps into the next
// step, which repeats the same order, so the first layers of the next step are fetched
// while the last ones of this step compute). Room for a load is made by evicting, among
// the weights not needed by uses i..p, the one whose next use is farthest in the future:
// Belady's optimal rule, exact here because the order is known. A load that finds no room
// waits for a later use; the load for use i itself always finds room once B holds the
// largest use.
//
// Invariants (checked by tests): resident bytes, counting loads in flight, never exceed B;
// every weight of use i is resident or loading when use i starts; nothing a use i..p needs
// is evicted for use p.
//
// Errors: InvalidArgument when a weight id is out of range, or B is below the largest use's
// bytes (the message names the use, its bytes and B).
#pragma once

#include <cstddef>
#include <vector>

namespace sdalloc {

struct OffloadPlanInput {
  std::vector<std::size_t> sizes;              // bytes of each weight, by id
  std::vector<std::vector<std::size_t>> uses;  // one step's uses, in order
  std::size_t budget = 0;
  std::size_t prefetch = 2;           // uses ahead a load may be issued
  std::vector<std::size_t> resident;  // loaded when the step starts
};

struct OffloadPlan {
  std::vector<std::vector<std::size_t>> evict_before;  // [use] weights freed first
  std::vector<std::vector<std::size_t>> load_before;   // [use] loads issued before use i
  std::vector<std::size_t> resident_at_start;          // sorted
  std::vector<std::size_t> resident_at_end;            // sorted; includes next-step loads
  std::size_t peak_resident_bytes = 0;
  std::size_t loaded_bytes = 0;  // per step
  std::size_t loads = 0;
};

OffloadPlan plan_offload(const OffloadPlanInput& input);

}  // namespace sdalloc
