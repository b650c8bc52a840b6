// unit_offloader.cpp - record one step, plan it, then only events: the steady state.
#include "sdalloc/transfer/unit_offloader.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "transfer/staged_copier.hpp"

namespace sdalloc {

namespace {

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

std::string stream_text(Stream s) {
  char text[32];
  std::snprintf(text, sizeof text, "%#zx", static_cast<std::size_t>(s.handle));
  return text;
}

}  // namespace

UnitOffloader::UnitOffloader(StreamDevice& device, UnitOffloadOptions options)
    : device_(device), options_(options) {
  if (options_.budget == 0) throw InvalidArgument("UnitOffloader: the budget is 0 bytes");
}

UnitOffloader::~UnitOffloader() {
  try {
    sync_all();
  } catch (const std::exception&) {  // nothing to report to from a destructor
  }
  stager_.reset();
  if (region_ != nullptr) device_.device_memory().deallocate(region_, region_bytes_);
  arena_.reset();
}

void UnitOffloader::check_unit(std::size_t unit) const {
  if (unit >= bytes_.size()) {
    throw InvalidArgument("UnitOffloader: unknown unit " + std::to_string(unit) + " (" +
                          std::to_string(bytes_.size()) + " added)");
  }
}

std::size_t UnitOffloader::add_unit(std::size_t bytes, bool keep_resident) {
  if (sealed_) throw InvalidArgument("UnitOffloader::add_unit after seal()");
  if (bytes == 0) throw InvalidArgument("UnitOffloader::add_unit: an empty unit");
  if (align256(bytes) > options_.budget) {
    throw InvalidArgument("UnitOffloader: the budget " + format_bytes(options_.budget) +
                          " is below unit " + std::to_string(bytes_.size()) + "'s " +
                          format_bytes(bytes) + ": the budget must hold the largest unit");
  }
  bytes_.push_back(bytes);
  keep_resident_.push_back(keep_resident);
  unit_compute_.push_back(0);
  unit_host_.push_back(0);
  return bytes_.size() - 1;
}

void UnitOffloader::seal() {
  if (sealed_) throw InvalidArgument("UnitOffloader::seal: already sealed");
  if (bytes_.empty()) throw InvalidArgument("UnitOffloader::seal: no units");
  std::size_t total = 0;
  for (const std::size_t b : bytes_) total += align256(b);
  // While a step is recorded, the kept units live at the region's start and every other
  // unit is loaded after them, in the scratch.
  recording_offset_.assign(bytes_.size(), 0);
  std::size_t kept = 0, largest = 0;
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (keep_resident_[u]) {
      recording_offset_[u] = kept;
      kept += align256(bytes_[u]);
    } else {
      largest = std::max(largest, align256(bytes_[u]));
    }
  }
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (!keep_resident_[u]) recording_offset_[u] = kept;
  }
  if (kept + largest > options_.budget) {
    throw InvalidArgument("UnitOffloader: the budget " + format_bytes(options_.budget) +
                          " cannot hold the units kept resident (" + format_bytes(kept) +
                          ") and the largest other unit (" + format_bytes(largest) + ")");
  }
  arena_ =
      std::make_unique<HostArena>(device_, bytes_, options_.register_chunk_bytes, options_.pin);
  region_bytes_ = std::min(options_.budget, total);
  region_ = static_cast<std::byte*>(device_.device_memory().allocate(region_bytes_));
  ++stats_.device_allocations;
  sealed_ = true;
}

std::byte* UnitOffloader::host_image(std::size_t unit) const {
  check_unit(unit);
  if (!sealed_) throw InvalidArgument("UnitOffloader::host_image before seal()");
  return arena_->image(unit);
}

void* UnitOffloader::device_image(std::size_t unit) const {
  check_unit(unit);
  if (!sealed_) throw InvalidArgument("UnitOffloader::device_image before seal()");
  return region_ +
         (mode_ == Mode::kRecording ? recording_offset_[unit] : plan_.device_offset[unit]);
}

bool UnitOffloader::streamed(std::size_t unit) const {
  check_unit(unit);
  return mode_ != Mode::kRecording && plan_.streamed[unit];
}

const HostArena& UnitOffloader::arena() const {
  if (!arena_) throw InvalidArgument("UnitOffloader::arena before seal()");
  return *arena_;
}

std::string UnitOffloader::registration_refusal() const {
  return arena_ ? arena_->refusal() : std::string();
}

StreamDevice::Event UnitOffloader::timing_event(std::size_t index) {
  while (timing_.size() <= index) timing_.push_back(device_.create_event(true));
  return timing_[index];
}

void UnitOffloader::sync_all() {
  release_hold();
  if (stager_) stager_->drain();
  device_.synchronize(DeviceQueue::kCompute);
  device_.synchronize(DeviceQueue::kCopy);
  stats_.host_waits += 2;
}

// The fallback's staging; where the operating system's limit leaves no room for it, the
// arena's last locked chunks are unlocked until there is (their units are staged too).
void UnitOffloader::make_stager() {
  std::size_t largest = 0;
  for (const std::size_t b : bytes_) largest = std::max(largest, b);
  const std::size_t chunk =  // no bigger than a unit needs
      std::min(options_.staging_chunk_bytes, (largest + 4095) / 4096 * 4096);
  while (!stager_) {
    try {
      stager_ = std::make_unique<transfer_detail::StagedCopier>(device_, chunk);
    } catch (const RegistrationRefused&) {
      sync_all();  // no copy from a chunk may be in flight when it is unlocked
      if (!arena_->unlock_last_chunk()) throw;
    }
  }
}

void UnitOffloader::load_now(std::size_t unit, std::size_t device_offset) {
  std::byte* dst = region_ + device_offset;
  if (arena_->pinned(unit)) {
    device_.copy_to_device(dst, arena_->image(unit), bytes_[unit]);
  } else {
    make_stager();
    stager_->drain();
    stager_->copy_now(dst, arena_->image(unit), bytes_[unit]);
    ++stats_.staged_copies;
  }
  ++stats_.copies;
  stats_.copied_bytes += bytes_[unit];
}

// ---------------------------------------------------------------------------- steps

void UnitOffloader::begin_step(Stream stream) {
  if (!sealed_) throw InvalidArgument("UnitOffloader::begin_step before seal()");
  if (stream != device_.compute_stream()) {
    throw InvalidArgument("UnitOffloader: the forward runs on stream " + stream_text(stream) +
                          ", but the copies are ordered before stream " +
                          stream_text(device_.compute_stream()) +
                          " (the compute stream the offload was made for): run it there");
  }
  if (in_step_) end_step();  // the last forward raised: its step ends here
  in_step_ = true;
  step_diverged_ = false;
  step_started_ = device_.host_seconds();
  ++stats_.steps;
  pos_ = 0;
  if (mode_ == Mode::kRecording) {
    order_.clear();
    host_started_.clear();
    use_host_.clear();
    use_loaded_.clear();
    if (!kept_loaded_) {  // the images are written by now; these never move while recording
      for (std::size_t u = 0; u < bytes_.size(); ++u) {
        if (keep_resident_[u]) load_now(u, recording_offset_[u]);
      }
      device_.synchronize(DeviceQueue::kCopy);
      ++stats_.host_waits;
      kept_loaded_ = true;
    }
  }
}

void UnitOffloader::enter(std::size_t unit) {
  if (!in_step_) throw InvalidArgument("UnitOffloader::enter outside begin_step/end_step");
  check_unit(unit);
  switch (mode_) {
    case Mode::kRecording:
      enter_recording(unit);
      return;
    case Mode::kPlanned:
      enter_planned(unit);
      return;
    case Mode::kOnDemand:
      serve_on_demand(unit);
      return;
  }
}

void UnitOffloader::enter_recording(std::size_t unit) {
  const double now = device_.host_seconds();
  const std::size_t i = order_.size();
  if (i > 0) {
    device_.record(timing_event(4 * (i - 1) + 3), DeviceQueue::kCompute);
    release_hold();  // the last unit's kernels run now, back to back
    use_host_.push_back(now - host_started_.back());
  }
  order_.push_back(unit);
  use_loaded_.push_back(!keep_resident_[unit]);
  device_.synchronize(DeviceQueue::kCompute);  // the last unit's kernels left the scratch
  device_.record(timing_event(4 * i), DeviceQueue::kCopy);
  if (!keep_resident_[unit]) load_now(unit, recording_offset_[unit]);
  device_.record(timing_event(4 * i + 1), DeviceQueue::kCopy);
  device_.synchronize(DeviceQueue::kCopy);
  stats_.host_waits += 2;
  hold_ = device_.hold(DeviceQueue::kCompute);
  holding_ = true;
  device_.record(timing_event(4 * i + 2), DeviceQueue::kCompute);
  host_started_.push_back(device_.host_seconds());
}

void UnitOffloader::release_hold() {
  if (!holding_) return;
  holding_ = false;
  device_.open(hold_);
}

void UnitOffloader::enter_planned(std::size_t unit) {
  if (!plan_.streamed[unit]) return;  // resident: nothing to do
  const std::size_t n = plan_.stream_order.size();
  if (pos_ >= n || plan_.stream_order[pos_] != unit) {
    // Another order than the plan's: on demand from here, recorded again next step.
    order_.assign(plan_.stream_order.begin(),
                  plan_.stream_order.begin() + static_cast<std::ptrdiff_t>(pos_));
    step_diverged_ = true;
    mode_ = Mode::kOnDemand;
    sync_all();
    serve_on_demand(unit);
    return;
  }
  if (released_ < entered_) {  // the previous streamed unit's kernels are all queued
    device_.record(release_[(entered_ - 1) % n], DeviceQueue::kCompute);
    released_ = entered_;
    issue_due();
  }
  if (fallback_) {
    stager_->wait_posted(tickets_[pos_]);  // queued on the copy queue, not necessarily done
    ++stats_.host_waits;
  }
  device_.wait(DeviceQueue::kCompute, copy_done_[pos_]);
  ++pos_;
  ++entered_;
}

void UnitOffloader::serve_on_demand(std::size_t unit) {
  order_.push_back(unit);
  if (!plan_.streamed[unit]) return;
  device_.synchronize(DeviceQueue::kCompute);
  load_now(unit, plan_.device_offset[unit]);
  device_.synchronize(DeviceQueue::kCopy);
  stats_.host_waits += 2;
}

// Issues, in the plan's order, every copy whose slot has been released (or never used).
void UnitOffloader::issue_due() {
  const std::size_t n = plan_.stream_order.size();
  if (n == 0) return;
  for (;;) {
    const std::size_t j = issued_ % n;
    const std::size_t back = plan_.wait_back[j];
    const bool fresh = issued_ < back;  // its bytes not used since the plan started
    if (!fresh && issued_ - back >= released_) return;
    const std::size_t unit = plan_.stream_order[j];
    std::byte* dst = region_ + plan_.device_offset[unit];
    const std::byte* src = arena_->image(unit);
    if (fallback_) {
      transfer_detail::StagedJob job;
      job.dst = dst;
      job.src = src;
      job.bytes = bytes_[unit];
      job.pinned = arena_->pinned(unit);
      if (!fresh) job.after = release_[(issued_ - back) % n];
      job.done = copy_done_[j];
      tickets_[j] = stager_->post(job);
      stats_.staged_copies += job.pinned ? 0 : 1;
    } else {
      if (!fresh) device_.wait(DeviceQueue::kCopy, release_[(issued_ - back) % n]);
      device_.copy_to_device(dst, src, bytes_[unit]);
      device_.record(copy_done_[j], DeviceQueue::kCopy);
    }
    ++stats_.copies;
    stats_.copied_bytes += bytes_[unit];
    ++issued_;
  }
}

void UnitOffloader::end_step() {
  if (!in_step_) throw InvalidArgument("UnitOffloader::end_step without begin_step");
  in_step_ = false;
  switch (mode_) {
    case Mode::kRecording:
      if (!order_.empty()) finish_recording();
      return;
    case Mode::kPlanned: {
      const std::size_t n = plan_.stream_order.size();
      if (pos_ != n) {  // units missing: the step diverged
        order_.assign(plan_.stream_order.begin(),
                      plan_.stream_order.begin() + static_cast<std::ptrdiff_t>(pos_));
        mode_ = Mode::kOnDemand;
        end_step_diverged();
        return;
      }
      if (n > 0) {
        device_.record(release_[(entered_ - 1) % n], DeviceQueue::kCompute);
        released_ = entered_;
        issue_due();
      }
      ++stats_.planned_steps;
      if (!calibrated_) calibrate(device_.host_seconds() - step_started_);
      return;
    }
    case Mode::kOnDemand:
      end_step_diverged();
      return;
  }
}

void UnitOffloader::record_next_step() {
  if (in_step_) throw InvalidArgument("UnitOffloader::record_next_step inside a step");
  if (!sealed_) throw InvalidArgument("UnitOffloader::record_next_step before seal()");
  if (mode_ == Mode::kRecording) return;
  sync_all();
  mode_ = Mode::kRecording;
  kept_loaded_ = false;
  ++layout_version_;
}

void UnitOffloader::end_step_diverged() {
  sync_all();
  ++stats_.divergent_steps;
  mode_ = Mode::kRecording;  // the next step is recorded and planned again
  kept_loaded_ = false;
  ++layout_version_;
}

void UnitOffloader::finish_recording() {
  const std::size_t uses = order_.size();
  device_.record(timing_event(4 * (uses - 1) + 3), DeviceQueue::kCompute);
  release_hold();
  use_host_.push_back(device_.host_seconds() - host_started_.back());
  sync_all();
  std::vector<double> compute(bytes_.size(), 0), host(bytes_.size(), 0);
  std::vector<std::size_t> count(bytes_.size(), 0);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  std::size_t loads = 0;
  for (std::size_t i = 0; i < uses; ++i) {
    const std::size_t u = order_[i];
    compute[u] += std::max(0.0, device_.elapsed_seconds(timing_[4 * i + 2], timing_[4 * i + 3]));
    host[u] += use_host_[i];
    ++count[u];
    if (!use_loaded_[i]) continue;  // a kept unit: nothing was copied
    ++loads;
    const double x = static_cast<double>(bytes_[u]);
    const double y = std::max(0.0, device_.elapsed_seconds(timing_[4 * i], timing_[4 * i + 1]));
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (count[u] == 0) continue;  // not used this step: the times measured before stay
    unit_compute_[u] = compute[u] / static_cast<double>(count[u]);
    unit_host_[u] = host[u] / static_cast<double>(count[u]);
  }
  // The copy engine: time = seconds_per_copy + bytes / speed, least squares over the loads.
  const auto n = static_cast<double>(loads);
  const double denominator = n * sxx - sx * sx;
  const double slope = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0;
  if (slope > 0) {
    bytes_per_second_ = 1 / slope;
    seconds_per_copy_ = std::max(0.0, (sy - slope * sx) / n);
  } else {
    bytes_per_second_ = sy > 0 ? sx / sy : 1e12;
    seconds_per_copy_ = 0;
  }
  ++stats_.recorded_steps;
  plan_ = plan_units(plan_input());
  ++stats_.plans;
  calibrated_ = false;
  start_plan();
}

UnitPlanInput UnitOffloader::plan_input() const {
  UnitPlanInput in;
  in.bytes = bytes_;
  in.compute_seconds = unit_compute_;
  in.host_seconds = unit_host_;
  in.keep_resident = keep_resident_;
  in.order = order_;
  in.budget = std::min(options_.budget, region_bytes_);
  in.bytes_per_second = bytes_per_second_;
  in.seconds_per_copy = seconds_per_copy_;
  return in;
}

// The recorded step's host times are taken between waits for the device (cold caches,
// the on-demand loads): the first planned step, where the host never waits, gives the
// host's real time for the whole step. Where the two differ by more than a tenth, the
// units' host times are scaled to it and the step planned again; a different plan is
// taken at once (a host wait, once).
void UnitOffloader::calibrate(double step_host_seconds) {
  calibrated_ = true;
  double recorded = 0;
  for (const std::size_t u : order_) recorded += unit_host_[u];
  if (recorded <= 0 || step_host_seconds <= 0) return;
  const double k = step_host_seconds / recorded;
  if (k > 0.9 && k < 1.1) return;
  for (double& h : unit_host_) h *= k;
  UnitPlan plan = plan_units(plan_input());
  if (plan.streamed == plan_.streamed && plan.device_offset == plan_.device_offset) {
    plan_.predicted_step_seconds = plan.predicted_step_seconds;
    plan_.compute_seconds = plan.compute_seconds;
    plan_.floor_seconds = plan.floor_seconds;
    plan_.ideal_floor_seconds = plan.ideal_floor_seconds;
    return;
  }
  plan_ = std::move(plan);
  ++stats_.plans;
  start_plan();
}

void UnitOffloader::start_plan() {
  arena_->finish_registration();  // once per plan: steady steps copy from locked memory only
  const std::size_t n = plan_.stream_order.size();
  fallback_ = false;
  for (const std::size_t u : plan_.stream_order) fallback_ = fallback_ || !arena_->pinned(u);
  if (fallback_) make_stager();
  sync_all();
  for (std::size_t u = 0; u < bytes_.size(); ++u) {
    if (!plan_.streamed[u]) load_now(u, plan_.device_offset[u]);
  }
  device_.synchronize(DeviceQueue::kCopy);
  ++stats_.host_waits;
  // Events for every unit at once: a later plan (calibrated, divergent) makes none.
  while (copy_done_.size() < std::max(n, bytes_.size())) {
    copy_done_.push_back(device_.create_event(false));
  }
  while (release_.size() < std::max(n, bytes_.size())) {
    release_.push_back(device_.create_event(false));
  }
  tickets_.assign(n, 0);
  pos_ = 0;
  entered_ = released_ = issued_ = 0;
  mode_ = Mode::kPlanned;
  issue_due();
  ++layout_version_;
}

UnitOffloadStats UnitOffloader::stats() const {
  UnitOffloadStats s = stats_;
  s.units = bytes_.size();
  s.model_bytes = std::accumulate(bytes_.begin(), bytes_.end(), std::size_t{0});
  s.region_bytes = region_bytes_;
  if (mode_ != Mode::kRecording || stats_.plans > 0) {
    s.streamed_units = plan_.stream_order.size();
    s.resident_bytes = plan_.resident_bytes;
    s.ring_bytes = plan_.ring_bytes;
    s.streamed_bytes = plan_.streamed_bytes;
    s.compute_seconds = plan_.compute_seconds;
    s.predicted_step_seconds = plan_.predicted_step_seconds;
    s.floor_seconds = plan_.floor_seconds;
    s.ideal_floor_seconds = plan_.ideal_floor_seconds;
  }
  s.copy_bytes_per_second = bytes_per_second_;
  s.seconds_per_copy = seconds_per_copy_;
  if (arena_) {
    s.registered_bytes = arena_->registered_bytes();
    s.registration_refused = !arena_->refusal().empty();
  }
  s.layout_version = layout_version_;
  return s;
}

}  // namespace sdalloc
