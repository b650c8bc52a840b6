// weight_offloader.cpp - record a step's uses, plan them, follow the plan; on demand else.
#include "sdalloc/transfer/weight_offloader.hpp"

#include <algorithm>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

WeightOffloader::WeightOffloader(TransferEngine& engine, MemoryResource& device,
                                 OffloadOptions options)
    : engine_(engine), device_(device), options_(options) {
  if (options_.budget == 0) throw InvalidArgument("WeightOffloader: the budget is 0 bytes");
}

WeightOffloader::~WeightOffloader() {
  for (Weight& w : weights_) {
    if (w.device != nullptr) {
      try {
        w.load.wait();
      } catch (const std::exception&) {  // the memory is freed either way
      }
      device_.deallocate(w.device, w.bytes);
    }
    if (options_.pin) {
      try {
        engine_.unregister_host(const_cast<void*>(w.host));
      } catch (const std::exception&) {  // nothing to report to from a destructor
      }
    }
  }
}

void WeightOffloader::check_id(std::size_t id) const {
  if (id >= weights_.size()) {
    throw InvalidArgument("WeightOffloader: unknown weight " + std::to_string(id) + " (" +
                          std::to_string(weights_.size()) + " added)");
  }
}

std::size_t WeightOffloader::add_weight(const void* host, std::size_t bytes) {
  if (host == nullptr || bytes == 0) {
    throw InvalidArgument("WeightOffloader::add_weight: a null pointer or zero bytes");
  }
  if (bytes > options_.budget) {
    throw InvalidArgument("WeightOffloader: the budget " + format_bytes(options_.budget) +
                          " is below this weight's " + format_bytes(bytes) +
                          ": the budget must hold the largest single weight");
  }
  // Pinning runs at ~1-2 GB/s: in the background; until it is done, loads go through
  // staging.
  if (options_.pin) (void)engine_.register_host_async(const_cast<void*>(host), bytes);
  weights_.push_back(Weight{host, bytes, nullptr, {}, 0});
  stats_.largest_weight = std::max(stats_.largest_weight, bytes);
  has_plan_ = false;  // a new weight: the recorded order no longer covers the model
  return weights_.size() - 1;
}

bool WeightOffloader::resident(std::size_t weight) const {
  check_id(weight);
  return weights_[weight].device != nullptr;
}

void WeightOffloader::load(std::size_t id) {
  Weight& w = weights_[id];
  if (w.device != nullptr) return;
  // The bar: the budget is checked at every load, loads in flight included.
  if (stats_.resident_bytes + w.bytes > options_.budget) {
    throw Error("WeightOffloader: internal error: loading weight " + std::to_string(id) +
                " would hold " + format_bytes(stats_.resident_bytes + w.bytes) +
                ", over the budget " + format_bytes(options_.budget));
  }
  // Stream-ordered: the memory is taken on the copy stream, so a stream-ordered device pool
  // hands out memory an eviction freed on the compute stream only once that work is done.
  const Stream on = options_.stream_ordered ? engine_.backend().stream_token(0) : kDefaultStream;
  void* device = device_.allocate(w.bytes, on);
  try {
    w.load = engine_.copy(CopyKind::kHostToDevice, device, w.host, w.bytes);
  } catch (...) {
    device_.deallocate(device, w.bytes, on);
    throw;
  }
  w.device = device;
  stats_.resident_bytes += w.bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  ++stats_.loads;
  stats_.loaded_bytes += w.bytes;
}

void WeightOffloader::evict(std::size_t id) {
  Weight& w = weights_[id];
  if (w.device == nullptr) return;
  try {
    w.load.wait();                   // the copy must not land in memory handed out again
  } catch (const std::exception&) {  // a failed load: the memory is freed all the same
  }
  // Stream-ordered: freed on the compute stream, behind the work that read the weight.
  device_.deallocate(w.device, w.bytes,
                     options_.stream_ordered ? options_.compute_stream : kDefaultStream);
  w.device = nullptr;
  w.load = TransferHandle();
  stats_.resident_bytes -= w.bytes;
  ++stats_.evictions;
}

std::vector<std::size_t> WeightOffloader::resident_ids() const {
  std::vector<std::size_t> ids;
  for (std::size_t id = 0; id < weights_.size(); ++id) {
    if (weights_[id].device != nullptr) ids.push_back(id);
  }
  return ids;
}

void WeightOffloader::make_plan() {
  OffloadPlanInput input;
  input.sizes.reserve(weights_.size());
  for (const Weight& w : weights_) input.sizes.push_back(w.bytes);
  input.uses = planned_uses_;
  input.budget = options_.budget;
  input.prefetch = options_.prefetch;
  input.resident = resident_ids();
  plan_ = plan_offload(input);
  ++stats_.plans;
}

void WeightOffloader::begin_step() {
  if (in_step_) throw InvalidArgument("WeightOffloader::begin_step: a step is already open");
  in_step_ = true;
  recorded_.clear();
  following_plan_ = has_plan_;
  // The plan starts from a resident set; a different one (after the recording step, or a
  // divergent step) is planned afresh, which is cheap: the order is the same.
  if (has_plan_ && plan_.resident_at_start != resident_ids()) make_plan();
}

void WeightOffloader::acquire_on_demand(std::span<const std::size_t> ids) {
  for (const std::size_t id : ids) {
    Weight& w = weights_[id];
    if (w.device != nullptr) continue;
    while (stats_.resident_bytes + w.bytes > options_.budget) {
      // Least recently used among the weights this use does not need.
      std::size_t victim = weights_.size();
      for (std::size_t v = 0; v < weights_.size(); ++v) {
        if (weights_[v].device == nullptr || std::find(ids.begin(), ids.end(), v) != ids.end()) {
          continue;
        }
        if (victim == weights_.size() || weights_[v].last_use < weights_[victim].last_use) {
          victim = v;
        }
      }
      if (victim == weights_.size()) {
        std::size_t need = 0;
        for (const std::size_t u : ids) need += weights_[u].bytes;
        throw InvalidArgument("WeightOffloader: the budget " + format_bytes(options_.budget) +
                              " is below the " + format_bytes(need) +
                              " this layer's weights need at once");
      }
      evict(victim);
    }
    load(id);
  }
}

std::vector<void*> WeightOffloader::acquire(std::span<const std::size_t> ids) {
  if (!in_step_) throw InvalidArgument("WeightOffloader::acquire outside begin_step/end_step");
  for (const std::size_t id : ids) check_id(id);
  const std::size_t position = recorded_.size();
  recorded_.emplace_back(ids.begin(), ids.end());
  try {
    return serve(position, ids);
  } catch (...) {
    recorded_.pop_back();  // a use that was not served is not part of the step's order
    following_plan_ = false;
    throw;
  }
}

std::vector<void*> WeightOffloader::serve(std::size_t position, std::span<const std::size_t> ids) {
  if (following_plan_ &&
      (position >= planned_uses_.size() || planned_uses_[position] != recorded_.back())) {
    following_plan_ = false;  // diverged: on demand from here, planned again at the end
  }
  if (following_plan_) {
    for (const std::size_t v : plan_.evict_before[position]) evict(v);
    for (const std::size_t w : plan_.load_before[position]) load(w);
    engine_.flush();  // the prefetches start now, not when the queue fills
  } else {
    acquire_on_demand(ids);
  }
  std::vector<void*> pointers;
  pointers.reserve(ids.size());
  for (const std::size_t id : ids) {
    Weight& w = weights_[id];
    if (w.device == nullptr) acquire_on_demand(std::span<const std::size_t>(&id, 1));
    if (!w.load.ready()) ++stats_.waits;
    try {
      if (options_.stream_ordered) {
        engine_.stream_wait(w.load, options_.compute_stream);  // the device waits, not us
      } else {
        w.load.wait();
      }
    } catch (...) {
      evict(id);  // not resident after a failed load: the next acquire loads it again
      throw;
    }
    w.last_use = ++clock_;
    pointers.push_back(w.device);
  }
  return pointers;
}

void WeightOffloader::end_step() {
  if (!in_step_) throw InvalidArgument("WeightOffloader::end_step without begin_step");
  in_step_ = false;
  const bool followed = following_plan_ && recorded_.size() == planned_uses_.size();
  if (followed) {
    ++stats_.planned_steps;
    return;
  }
  if (has_plan_) {
    ++stats_.divergent_steps;
  } else {
    ++stats_.recorded_steps;
  }
  planned_uses_ = recorded_;
  make_plan();
  has_plan_ = true;
}

}  // namespace sdalloc
