// sdalloc/transfer/weight_offloader.hpp - a model's weights in host memory, a working set
// on the device under a budget, loads planned from the recorded order of use.
//
// The weights stay where the user has them (host memory, pinned in place in the background
// by the engine when `pin` is set: loads go through staging until then); the device holds
// at most `budget` bytes of them at any moment, taken from the device resource given (on
// the host backend: a second host pool). A step
// is begin_step(), then acquire() once per layer with the weights that layer reads, then
// end_step().
//  - The first step records the order of the uses and loads on demand (evicting the least
//    recently used weights to make room, copies synchronous).
//  - At its end the order is planned once (offload_plan.hpp: Belady-optimal eviction, loads
//    issued `prefetch` uses ahead); from the next step on every acquire() first applies the
//    plan's evictions and issues its loads for the uses ahead, then waits only for its own
//    weights, so the copies overlap the compute between acquires.
//  - A step whose uses differ from the plan's goes on on demand from the first difference,
//    and its order is planned at its end (divergent_steps counts them).
// Pointers from acquire() stay valid until the next acquire() or end_step() (on the host;
// with stream_ordered, for the compute queued on compute_stream before that call).
//
// The budget is checked at every load (OffloadStats::peak_resident_bytes <= budget, loads in
// flight included). Errors: InvalidArgument when a weight is larger than the budget (at
// add_weight: the message gives both sizes), when a use needs more than the budget at once,
// or for an unknown weight id; acquire() outside a step is InvalidArgument; a failed load
// throws the engine's TransferError from acquire() and leaves the offloader usable (the
// weight is not resident; the next acquire loads it again). Not thread-safe: one step at a
// time, from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sdalloc/core/resource.hpp"
#include "sdalloc/transfer/offload_plan.hpp"
#include "sdalloc/transfer/transfer_engine.hpp"

namespace sdalloc {

struct OffloadOptions {
  std::size_t budget = 0;    // device bytes for weights; must hold the largest use
  std::size_t prefetch = 2;  // uses ahead a load may be issued (0: load at the use)
  bool pin = true;           // register each weight in place, in the background
  // Stream-ordered use on a device: acquire() makes compute_stream wait for the loads (an
  // event) instead of blocking the host, loads take device memory on the engine's copy
  // stream and evictions free it on compute_stream, so the device resource must be a
  // stream-ordered pool (a CachingPool with CudaStreamEvents) for memory to be reused only
  // after the compute that read it.
  bool stream_ordered = false;
  Stream compute_stream{};
};

struct OffloadStats {
  std::uint64_t loads = 0;
  std::uint64_t loaded_bytes = 0;
  std::uint64_t evictions = 0;
  std::uint64_t waits = 0;  // acquires that found a load of theirs still running
  std::uint64_t recorded_steps = 0;
  std::uint64_t planned_steps = 0;
  std::uint64_t divergent_steps = 0;
  std::uint64_t plans = 0;
  std::size_t resident_bytes = 0;
  std::size_t peak_resident_bytes = 0;
  std::size_t largest_weight = 0;
};

class WeightOffloader {
 public:
  WeightOffloader(TransferEngine& engine, MemoryResource& device, OffloadOptions options);
  WeightOffloader(const WeightOffloader&) = delete;
  WeightOffloader& operator=(const WeightOffloader&) = delete;
  ~WeightOffloader();  // waits for loads, frees every resident weight, unregisters

  std::size_t add_weight(const void* host, std::size_t bytes);
  void begin_step();
  std::vector<void*> acquire(std::span<const std::size_t> weights);
  void end_step();

  bool has_plan() const { return has_plan_; }
  const OffloadPlan& plan() const { return plan_; }
  bool resident(std::size_t weight) const;
  OffloadStats stats() const { return stats_; }
  const OffloadOptions& options() const { return options_; }

 private:
  struct Weight {
    const void* host = nullptr;
    std::size_t bytes = 0;
    void* device = nullptr;  // non-null while resident (loaded or loading)
    TransferHandle load;
    std::uint64_t last_use = 0;
  };
  void check_id(std::size_t id) const;
  void load(std::size_t id);
  void evict(std::size_t id);
  std::vector<void*> serve(std::size_t position, std::span<const std::size_t> weights);
  void acquire_on_demand(std::span<const std::size_t> weights);
  std::vector<std::size_t> resident_ids() const;
  void make_plan();

  TransferEngine& engine_;
  MemoryResource& device_;
  OffloadOptions options_;
  std::vector<Weight> weights_;
  std::vector<std::vector<std::size_t>> recorded_;  // this step's uses so far
  OffloadPlan plan_;
  std::vector<std::vector<std::size_t>> planned_uses_;
  bool has_plan_ = false;
  bool in_step_ = false;
  bool following_plan_ = false;
  std::uint64_t clock_ = 0;
  OffloadStats stats_;
};

}  // namespace sdalloc
