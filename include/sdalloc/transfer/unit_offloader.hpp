// sdalloc/transfer/unit_offloader.hpp - a model's weights streamed to the device in units,
// at the physical floor: one host arena, one device region, streams and events only.
//
// Set-up: add_unit(bytes) for each unit (a block of weights moved in one copy), then
// seal(): the host arena (host_arena.hpp: every unit's image back to back, the one copy of
// the model in RAM, page-locked in place in the background) and the device region (one
// allocation of at most the budget: the only allocation the offloader makes) exist; the
// caller writes the images into host_image(unit) and points each unit's tensors at
// device_image(unit), again whenever layout_version() changes.
//
// A step is begin_step(stream), one enter(unit) before each unit's first kernel - the one
// call per unit - and end_step(). Kernels of a unit are queued on the device's compute
// queue after its enter.
//  1. The first step is recorded: each unit is loaded on demand into the region's start,
//     after the units kept resident (the host waits); the compute queue is held while the host
//     launches the unit's kernels (timed by the host's clock) and opened at the next unit's call,
//     so events time the device alone; its copy is timed by events too (the copy engine's speed and
//     cost per call, fitted).
//  2. Its end plans the order (unit_plan.hpp: the resident units, the ring, each copy's
//     slot and what it waits for; plan().describe() gives the predicted step time and the
//     floor), waits for the arena's registration, loads the resident units once, and
//     issues the first copies. layout_version() changes: resident units live at their
//     offsets for good, streamed ones at their fixed slot in the ring.
//     The first planned step's host time (the host never waits there) calibrates the
//     recorded host times; where they were more than 10 % off, the step is planned again
//     and a different plan is taken at its end (once).
//  3. Every later step follows the plan with no host wait: enter(u) of a streamed unit
//     records the previous streamed unit's release on the compute queue, issues every copy
//     whose slot that frees (the copy queue waits for the release, copies, records the
//     unit's copy event) - across the step's end into the next step - and makes the compute
//     queue wait for u's copy event. enter() of a resident unit does nothing. end_step()
//     releases the step's last streamed unit. A steady step makes the same calls with the
//     same addresses every time (a CUDA graph could capture it; not done here).
// A step whose streamed units come in another order (or not all) goes on on demand from
// the first difference (a host wait per unit) and is planned again at its end, from its
// order and the times already measured (divergent_steps counts them).
//
// Fallback: units whose bytes the operating system refused to lock (HostArena::refusal())
// are copied through page-locked staging chunks by a copy thread, which then issues every
// copy in the plan's order (registration_refused, staged_copies); never a pageable copy.
//
// Errors: InvalidArgument for a unit larger than the budget (at add_unit: both sizes in the
// message), calls out of order (add_unit after seal, enter outside a step), an unknown
// unit, a forward on another stream than the device's compute stream (begin_step: both
// named), and from the plan (units kept resident that the budget cannot hold);
// RegistrationRefused when even the staging chunks cannot be locked. Not thread-safe: one
// step at a time, from one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sdalloc/core/stream.hpp"
#include "sdalloc/transfer/host_arena.hpp"
#include "sdalloc/transfer/stream_device.hpp"
#include "sdalloc/transfer/unit_plan.hpp"

namespace sdalloc {

namespace transfer_detail {
class StagedCopier;
}

struct UnitOffloadOptions {
  std::size_t budget = 0;                                    // device bytes: resident + ring
  bool pin = true;                                           // page-lock the arena
  std::size_t register_chunk_bytes = std::size_t{64} << 20;  // the arena's locking step
  std::size_t staging_chunk_bytes = std::size_t{8} << 20;    // the fallback's chunks
};

struct UnitOffloadStats {
  std::uint64_t steps = 0, recorded_steps = 0, planned_steps = 0, divergent_steps = 0;
  std::uint64_t plans = 0;
  std::uint64_t copies = 0;  // copy calls for units (staged chunks count once)
  std::uint64_t copied_bytes = 0;
  std::uint64_t staged_copies = 0;  // copies through staging (the fallback)
  std::uint64_t host_waits = 0;     // the offloader's waits for the device or its thread
  std::uint64_t device_allocations = 0;
  std::size_t units = 0, streamed_units = 0;
  std::size_t model_bytes = 0, resident_bytes = 0, ring_bytes = 0, region_bytes = 0;
  std::size_t streamed_bytes = 0;  // per planned step
  std::size_t registered_bytes = 0;
  bool registration_refused = false;
  double compute_seconds = 0;  // T, from the recorded step
  double predicted_step_seconds = 0, floor_seconds = 0, ideal_floor_seconds = 0;
  double copy_bytes_per_second = 0, seconds_per_copy = 0;  // measured
  std::uint64_t layout_version = 0;
};

class UnitOffloader {
 public:
  UnitOffloader(StreamDevice& device, UnitOffloadOptions options);
  UnitOffloader(const UnitOffloader&) = delete;
  UnitOffloader& operator=(const UnitOffloader&) = delete;
  ~UnitOffloader();  // waits for the device, frees the region, the arena

  std::size_t add_unit(std::size_t bytes, bool keep_resident = false);
  void seal();
  std::byte* host_image(std::size_t unit) const;
  void* device_image(std::size_t unit) const;
  std::uint64_t layout_version() const { return layout_version_; }

  void begin_step(Stream stream);
  void enter(std::size_t unit);
  void end_step();
  // The next step is recorded and planned again (the work per unit changed: another input
  // shape). Outside a step; waits for the device.
  void record_next_step();

  bool planned() const { return mode_ != Mode::kRecording; }
  bool streamed(std::size_t unit) const;  // in the ring under the current plan
  const UnitPlan& plan() const { return plan_; }
  UnitOffloadStats stats() const;
  const HostArena& arena() const;
  std::string registration_refusal() const;

 private:
  enum class Mode : std::uint8_t { kRecording, kPlanned, kOnDemand };
  void check_unit(std::size_t unit) const;
  void make_stager();
  void load_now(std::size_t unit, std::size_t device_offset);  // queues it; caller syncs
  void enter_recording(std::size_t unit);
  void enter_planned(std::size_t unit);
  void finish_recording();
  void start_plan();
  UnitPlanInput plan_input() const;
  void calibrate(double step_host_seconds);
  void issue_due();
  void serve_on_demand(std::size_t unit);
  void end_step_diverged();
  StreamDevice::Event timing_event(std::size_t index);
  void sync_all();
  void release_hold();

  StreamDevice& device_;
  UnitOffloadOptions options_;
  std::vector<std::size_t> bytes_;
  std::vector<bool> keep_resident_;
  std::unique_ptr<HostArena> arena_;
  std::byte* region_ = nullptr;
  std::size_t region_bytes_ = 0;
  std::unique_ptr<transfer_detail::StagedCopier> stager_;
  Mode mode_ = Mode::kRecording;
  bool sealed_ = false;
  bool in_step_ = false;
  bool step_diverged_ = false;
  bool calibrated_ = false;  // the first planned step's host time was compared
  double step_started_ = 0;  // the host's clock at begin_step
  std::uint64_t layout_version_ = 0;
  UnitPlan plan_;

  // The recording step (and the times kept for later plans).
  std::vector<std::size_t> order_;             // this step's units, in order of entry
  std::vector<StreamDevice::Event> timing_;    // made on demand, reused
  std::vector<double> host_started_;           // per use: host clock after its load
  std::vector<bool> use_loaded_;               // per use: a copy was made (not a kept unit)
  std::vector<std::size_t> recording_offset_;  // per unit: its place while recording
  bool kept_loaded_ = false;
  std::vector<double> use_host_;  // per use: host seconds to the next enter
  StreamDevice::Hold hold_ = 0;   // the compute queue, held while a recorded unit launches
  bool holding_ = false;
  std::vector<double> unit_compute_, unit_host_;  // per unit: measured (mean of uses)
  double bytes_per_second_ = 0, seconds_per_copy_ = 0;

  // The planned steps: absolute indices count streamed uses since the plan started.
  std::vector<StreamDevice::Event> copy_done_;  // per stream position
  std::vector<StreamDevice::Event> release_;    // per stream position
  std::vector<std::uint64_t> tickets_;          // per stream position (fallback)
  bool fallback_ = false;                       // copies go through the stager's thread
  std::size_t pos_ = 0;                         // next stream position this step
  std::uint64_t entered_ = 0, released_ = 0, issued_ = 0;

  UnitOffloadStats stats_;
};

}  // namespace sdalloc
