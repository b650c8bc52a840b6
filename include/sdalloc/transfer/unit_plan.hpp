// sdalloc/transfer/unit_plan.hpp - which units of a model stay on the device, where the
// others land in a ring of device memory, and what each copy waits for: the plan one
// recorded step gives.
//
// Pure computation (no memory, no copies). Input: the units' bytes (a unit is a block of
// weights moved in one copy), the compute time of one use of each (measured with events
// in the recorded step), the order of use of one step, the device budget, and the copy
// engine's measured speed (bytes per second and a fixed cost per copy call).
//
// The device memory the plan lays out is budget bytes at most: the resident units back to
// back from offset 0, then the *ring*, where the streamed units take fixed offsets (placed
// in order of use, wrapping to the ring's start when the next one does not fit), the same
// every step. A streamed unit's copy may start once the last unit that used its bytes
// before it has been released; a unit is released when the next streamed unit starts (its
// one call), or at the end of the step for the step's last one. Copies run in order of
// use on one copy engine, as early as the ring allows: the depth of the prefetch is bytes,
// not layers, and it wraps into the next step, which repeats the order.
//
// How the plan is chosen: every use of a unit used more than once per step is served by a
// resident unit; for each bound on the size of a streamed unit and each ring size (a few
// multiples of that bound), the remaining budget is filled with the units that cost most
// to stream - the least compute per byte first, so the streamed ones are those whose own
// compute hides their neighbours' copies - and the plan is simulated (simulate_unit_plan:
// one copy engine, in-order compute) over a few steps; the steady step time decides, then
// the fewer streamed bytes. With the whole model inside the budget nothing is streamed.
//
// The figures beside it: compute_seconds (T, every unit resident), copy_seconds (the
// streamed bytes at the measured speed, calls included), floor_seconds = max(T, copy), and
// ideal_floor_seconds = max(T, (model - budget) / speed): the bound for any plan, since at
// most budget bytes can stay.
//
// Errors: InvalidArgument when the input is inconsistent (sizes, unknown unit ids, a speed
// that is not positive), when the budget is below the largest unit (the message gives both)
// or cannot hold the units used more than once plus a ring for the largest remaining one.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace sdalloc {

struct UnitPlanInput {
  std::vector<std::size_t> bytes;       // per unit id
  std::vector<double> compute_seconds;  // per unit id: one use's time on the device
  // Per unit id: the host's time to issue one use (launches); empty: none. Where it exceeds
  // the device's (a launch-bound step) the device waits for the host, and catches up after
  // a wait for a copy.
  std::vector<double> host_seconds;
  std::vector<bool> keep_resident;  // per unit id (empty: none): never streamed
  std::vector<std::size_t> order;   // one step: the unit ids in order of use
  std::size_t budget = 0;           // device bytes: resident units and the ring
  double bytes_per_second = 0;      // the copy engine's speed
  double seconds_per_copy = 0;      // fixed cost of one copy call
  std::size_t alignment = 256;      // of every unit's device offset
};

struct UnitPlan {
  static constexpr std::size_t kNoPredecessor = static_cast<std::size_t>(-1);

  std::vector<bool> streamed;              // per unit id
  std::vector<std::size_t> device_offset;  // per unit id, from the region's start
  std::vector<std::size_t> stream_order;   // the streamed units in order of use
  // Per position in stream_order: how many positions back (1..n, cyclic over steps) the
  // last unit sharing its bytes sits, whose release its copy waits for; kNoPredecessor
  // when no other unit uses them (the copy waits for nothing but the previous step's use).
  std::vector<std::size_t> wait_back;
  std::size_t resident_bytes = 0;  // [0, resident_bytes): the resident units
  std::size_t ring_offset = 0;     // the ring: [ring_offset, ring_offset + ring_bytes)
  std::size_t ring_bytes = 0;
  std::size_t region_bytes = 0;    // ring_offset + ring_bytes <= budget
  std::size_t streamed_bytes = 0;  // copied per step
  std::size_t model_bytes = 0;
  std::size_t budget = 0;
  double compute_seconds = 0;         // T: one step with every unit resident
  double copy_seconds = 0;            // the streamed bytes' copies, calls included
  double floor_seconds = 0;           // max(compute, copy)
  double ideal_floor_seconds = 0;     // max(compute, (model - budget) / speed)
  double predicted_step_seconds = 0;  // simulate_unit_plan's steady step
  std::size_t candidates = 0;         // plans simulated to choose this one

  std::size_t streamed_units() const { return stream_order.size(); }
  // One line: units, streamed (bytes a step), the ring's size, resident units (bytes), the
  // predicted step against its floor, max(all-on-device step, copy time), and the ideal.
  std::string describe() const;
};

UnitPlan plan_units(const UnitPlanInput& input);

// The steady step time of `plan` under the model: the host issues the uses in order, each
// taking its host_seconds, and never waits inside a step; at a streamed unit's use it
// records the previous streamed unit's release and issues every copy whose slot that
// frees. One copy engine runs the copies in order, each after its issue, its slot's
// release and the previous copy, taking seconds_per_copy + bytes / bytes_per_second. The
// device runs a use after the previous one, after the host issued it and (if streamed)
// after its copy, and ends it no earlier than the host's last launch of it. The host waits
// for the device at the end of each step (the caller's synchronisation). `steps` steps from
// an empty ring; the last one's time.
double simulate_unit_plan(const UnitPlanInput& input, const UnitPlan& plan, int steps = 4);

}  // namespace sdalloc
