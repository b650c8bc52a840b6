// simulated_device.cpp - two queue workers on virtual clocks, a paced host, mlock.
#include "sdalloc/transfer/simulated_device.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

namespace sdalloc {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

const char* queue_name(DeviceQueue q) { return q == DeviceQueue::kCompute ? "compute" : "copy"; }

std::string memlock_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return format_size(static_cast<std::size_t>(limit.rlim_cur));
}

}  // namespace

// Device memory: anonymous mappings, counted.
class SimulatedDevice::Memory final : public MemoryResource {
 public:
  explicit Memory(SimulatedDevice& device) : device_(device) {}
  std::string name() const override { return "simulated device memory"; }

 private:
  void* do_allocate(std::size_t bytes, Stream /*stream*/) override {
    if (bytes == 0) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw OutOfMemory::describe("simulated device memory", OutOfMemoryInfo{bytes},
                                  std::strerror(errno));
    }
    const std::lock_guard lock(device_.mutex_);
    ++device_.counters_.device_allocations;
    device_.counters_.device_bytes += bytes;
    return p;
  }
  void do_deallocate(void* ptr, std::size_t bytes, Stream /*stream*/) override {
    if (ptr == nullptr) return;
    munmap(ptr, bytes);
    const std::lock_guard lock(device_.mutex_);
    ++device_.counters_.device_frees;
    device_.counters_.device_bytes -= bytes;
  }
  SimulatedDevice& device_;
};

struct SimulatedDevice::EventState {
  static constexpr std::size_t kKept = 16;  // completion times of the latest records
  bool timing = false;
  std::uint64_t recorded = 0;  // records queued
  std::uint64_t completed = 0;
  std::array<double, kKept> at{};
  double time_of(std::uint64_t gen) const {
    // A record overwritten since: the latest known time (later, so a wait never ends early).
    return completed - gen < kKept ? at[gen % kKept] : at[completed % kKept];
  }
};

struct SimulatedDevice::Op {
  enum class Kind : std::uint8_t { kKernel, kCopy, kRecord, kWait, kHold } kind = Kind::kKernel;
  double queued = 0;   // the calling host's clock: no op starts before it
  double seconds = 0;  // a kernel's device time
  std::function<void()> body;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  Event event = 0;
  std::uint64_t gen = 0;
};

struct SimulatedDevice::Queue {
  DeviceQueue which;
  std::deque<Op> ops;
  std::thread worker;
  double clock = 0;  // virtual end of the last op run
  std::uint64_t pushed = 0;
  std::uint64_t done = 0;
};

SimulatedDevice::SimulatedDevice(SimulatedDeviceOptions options)
    : options_(options), memory_(std::make_unique<Memory>(*this)) {
  if (options_.copy_bytes_per_second < 0 || options_.seconds_per_copy < 0 ||
      options_.seconds_per_call < 0) {
    throw InvalidArgument("SimulatedDevice: a negative speed or cost");
  }
  compute_ = std::make_unique<Queue>();
  compute_->which = DeviceQueue::kCompute;
  copy_ = std::make_unique<Queue>();
  copy_->which = DeviceQueue::kCopy;
  if (!options_.host_compute) compute_->worker = std::thread([this] { run(*compute_); });
  copy_->worker = std::thread([this] { run(*copy_); });
}

SimulatedDevice::~SimulatedDevice() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (compute_->worker.joinable()) compute_->worker.join();
  copy_->worker.join();
  for (const auto& [start, bytes] : locked_) munlock(reinterpret_cast<void*>(start), bytes);
}

std::string SimulatedDevice::name() const { return "simulated"; }
MemoryResource& SimulatedDevice::device_memory() { return *memory_; }
double SimulatedDevice::pay(double cost, double cpu) {
  const auto [it, first] = hosts_.try_emplace(std::this_thread::get_id());
  HostClock& h = it->second;
  if (first) {
    // A new host thread starts where the device and the other threads are.
    h.now = std::max(compute_->clock, copy_->clock);
    for (const auto& [id, other] : hosts_) h.now = std::max(h.now, other.now);
    h.cpu_mark = cpu;
  }
  h.now += (cpu - h.cpu_mark) + cost;
  h.cpu_mark = cpu;
  return h.now;
}

void SimulatedDevice::done() {
  const auto it = hosts_.find(std::this_thread::get_id());
  if (it != hosts_.end()) it->second.cpu_mark = thread_cpu_seconds();
}

double SimulatedDevice::host_seconds() {
  const double cpu = thread_cpu_seconds();
  const std::lock_guard lock(mutex_);
  const double now = pay(0, cpu);
  done();
  return now;
}

void SimulatedDevice::note(const std::string& call) {
  ++counters_.calls;
  if (logging_) log_.push_back(call);
}

void SimulatedDevice::push(Queue& queue, Op op) {
  queue.ops.push_back(std::move(op));
  ++queue.pushed;
  changed_.notify_all();
}

void SimulatedDevice::run(Queue& queue) {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue.ops.empty(); });
    if (queue.ops.empty()) return;  // stopping, and everything queued has run
    Op op = std::move(queue.ops.front());
    queue.ops.pop_front();
    double start = std::max(queue.clock, op.queued);
    switch (op.kind) {
      case Op::Kind::kWait: {
        EventState& e = events_[op.event];
        changed_.wait(lock, [&] { return e.completed >= op.gen; });
        start = std::max(start, e.time_of(op.gen));
        queue.clock = start;
        break;
      }
      case Op::Kind::kHold: {
        changed_.wait(lock, [&] { return holds_[op.event] >= 0; });
        start = std::max(start, holds_[op.event]);
        queue.clock = start;
        break;
      }
      case Op::Kind::kRecord: {
        EventState& e = events_[op.event];
        e.completed = std::max(e.completed, op.gen);
        e.at[op.gen % EventState::kKept] = start;
        queue.clock = start;
        break;
      }
      case Op::Kind::kKernel: {
        lock.unlock();
        if (op.body) op.body();
        lock.lock();
        counters_.compute_busy_seconds += op.seconds;
        queue.clock = start + op.seconds;
        break;
      }
      case Op::Kind::kCopy: {
        lock.unlock();
        const double began = wall_seconds();
        std::memcpy(op.dst, op.src, op.bytes);
        const double speed = options_.copy_bytes_per_second;
        const double lasts =
            options_.seconds_per_copy +
            (speed > 0 ? static_cast<double>(op.bytes) / speed : wall_seconds() - began);
        lock.lock();
        counters_.copy_busy_seconds += lasts;
        queue.clock = start + lasts;
        break;
      }
    }
    ++queue.done;
    changed_.notify_all();
  }
}

StreamDevice::Event SimulatedDevice::create_event(bool timing) {
  const std::lock_guard lock(mutex_);
  events_.emplace_back();
  events_.back().timing = timing;
  return events_.size() - 1;
}

void SimulatedDevice::record(Event event, DeviceQueue queue) {
  const double cpu = thread_cpu_seconds();
  const std::lock_guard lock(mutex_);
  const double at = pay(options_.seconds_per_call, cpu);
  if (event >= events_.size()) throw InvalidArgument("SimulatedDevice: no such event");
  EventState& e = events_[event];
  const std::uint64_t gen = ++e.recorded;
  note("record e" + std::to_string(event) + " " + queue_name(queue));
  if (queue == DeviceQueue::kCompute && options_.host_compute) {
    e.completed = gen;
    e.at[gen % EventState::kKept] = at;
    changed_.notify_all();
    done();
    return;
  }
  Op op;
  op.kind = Op::Kind::kRecord;
  op.queued = at;
  op.event = event;
  op.gen = gen;
  push(queue == DeviceQueue::kCompute ? *compute_ : *copy_, std::move(op));
  done();
}

void SimulatedDevice::wait(DeviceQueue queue, Event event) {
  const double cpu = thread_cpu_seconds();
  std::unique_lock lock(mutex_);
  const double at = pay(options_.seconds_per_call, cpu);
  if (event >= events_.size()) throw InvalidArgument("SimulatedDevice: no such event");
  EventState& e = events_[event];
  note(std::string("wait ") + queue_name(queue) + " e" + std::to_string(event));
  const std::uint64_t gen = e.recorded;
  if (gen != 0 && queue == DeviceQueue::kCompute && options_.host_compute) {
    ++counters_.host_waits;
    changed_.wait(lock, [&] { return e.completed >= gen; });
    HostClock& h = hosts_[std::this_thread::get_id()];
    h.now = std::max(h.now, e.time_of(gen));
  } else if (gen != 0) {  // never recorded: nothing to wait for
    Op op;
    op.kind = Op::Kind::kWait;
    op.queued = at;
    op.event = event;
    op.gen = gen;
    push(queue == DeviceQueue::kCompute ? *compute_ : *copy_, std::move(op));
  }
  done();
}

bool SimulatedDevice::locked(const void* ptr, std::size_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = locked_.upper_bound(p);
  if (it == locked_.begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

void SimulatedDevice::copy_to_device(void* dst, const void* src, std::size_t bytes) {
  const double cpu = thread_cpu_seconds();
  std::unique_lock lock(mutex_);
  const double at = pay(options_.seconds_per_call, cpu);
  char text[96];
  std::snprintf(text, sizeof text, "copy %p <- %p %zu", dst, src, bytes);
  note(text);
  ++counters_.copy_calls;
  counters_.copied_bytes += bytes;
  const bool pageable = !locked(src, bytes);
  Op op;
  op.kind = Op::Kind::kCopy;
  op.queued = at;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  push(*copy_, std::move(op));
  if (pageable) {
    // As a device does: a pageable copy is staged by the driver and the host waits for it.
    ++counters_.pageable_copies;
    const std::uint64_t target = copy_->pushed;
    changed_.wait(lock, [&] { return copy_->done >= target; });
    HostClock& h = hosts_[std::this_thread::get_id()];
    h.now = std::max(h.now, copy_->clock);
  }
  done();
}

void SimulatedDevice::synchronize(DeviceQueue queue) {
  const double cpu = thread_cpu_seconds();
  std::unique_lock lock(mutex_);
  (void)pay(options_.seconds_per_call, cpu);
  ++counters_.host_waits;
  note(std::string("synchronize ") + queue_name(queue));
  if (!(queue == DeviceQueue::kCompute && options_.host_compute)) {
    Queue& q = queue == DeviceQueue::kCompute ? *compute_ : *copy_;
    const std::uint64_t target = q.pushed;
    changed_.wait(lock, [&] { return q.done >= target; });
    HostClock& h = hosts_[std::this_thread::get_id()];
    h.now = std::max(h.now, q.clock);
  }
  done();
}

void SimulatedDevice::wait_host(Event event) {
  const double cpu = thread_cpu_seconds();
  std::unique_lock lock(mutex_);
  (void)pay(options_.seconds_per_call, cpu);
  if (event >= events_.size()) throw InvalidArgument("SimulatedDevice: no such event");
  ++counters_.host_waits;
  note("wait_host e" + std::to_string(event));
  EventState& e = events_[event];
  const std::uint64_t gen = e.recorded;
  changed_.wait(lock, [&] { return e.completed >= gen; });
  if (gen != 0) {
    HostClock& h = hosts_[std::this_thread::get_id()];
    h.now = std::max(h.now, e.time_of(gen));
  }
  done();
}

StreamDevice::Hold SimulatedDevice::hold(DeviceQueue queue) {
  const double cpu = thread_cpu_seconds();
  const std::lock_guard lock(mutex_);
  const double at = pay(options_.seconds_per_call, cpu);
  note(std::string("hold ") + queue_name(queue));
  holds_.push_back(-1);
  const Hold id = holds_.size() - 1;
  if (queue == DeviceQueue::kCompute && options_.host_compute) {
    holds_[id] = at;  // the host is the compute queue: nothing to hold
  } else {
    Op op;
    op.kind = Op::Kind::kHold;
    op.queued = at;
    op.event = id;
    push(queue == DeviceQueue::kCompute ? *compute_ : *copy_, std::move(op));
  }
  done();
  return id;
}

void SimulatedDevice::open(Hold hold) {
  const double cpu = thread_cpu_seconds();
  const std::lock_guard lock(mutex_);
  const double at = pay(options_.seconds_per_call, cpu);
  if (hold >= holds_.size()) throw InvalidArgument("SimulatedDevice: no such hold");
  note("open");
  if (holds_[hold] < 0) holds_[hold] = at;
  changed_.notify_all();
  done();
}

double SimulatedDevice::elapsed_seconds(Event from, Event to) {
  const std::lock_guard lock(mutex_);
  if (from >= events_.size() || to >= events_.size()) {
    throw InvalidArgument("SimulatedDevice: no such event");
  }
  const EventState& a = events_[from];
  const EventState& b = events_[to];
  if (!a.timing || !b.timing || a.completed == 0 || b.completed == 0 || a.completed != a.recorded ||
      b.completed != b.recorded) {
    throw InvalidArgument("SimulatedDevice: elapsed time of events not both timing and done");
  }
  return b.time_of(b.completed) - a.time_of(a.completed);
}

void SimulatedDevice::register_host(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw InvalidArgument("SimulatedDevice: cannot register an empty range or a null pointer");
  }
  if (mlock(ptr, bytes) != 0) {
    const int error = errno;
    throw RegistrationRefused("mlock of " + format_bytes(bytes) +
                              " refused by the operating "
                              "system: " +
                              std::strerror(error) + " (RLIMIT_MEMLOCK " + memlock_limit() + ")");
  }
  const std::lock_guard lock(mutex_);
  locked_[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
  counters_.locked_bytes += bytes;
}

void SimulatedDevice::unregister_host(void* ptr, std::size_t bytes) {
  const std::lock_guard lock(mutex_);
  const auto it = locked_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == locked_.end() || it->second != bytes) {
    throw InvalidPointer("SimulatedDevice: unregister of a range that was not registered", ptr);
  }
  munlock(ptr, bytes);
  counters_.locked_bytes -= bytes;
  locked_.erase(it);
}

void* SimulatedDevice::allocate_pinned(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemory::describe("simulated pinned memory", OutOfMemoryInfo{bytes},
                                std::strerror(errno));
  }
  try {
    register_host(p, bytes);
  } catch (...) {
    munmap(p, bytes);
    throw;
  }
  return p;
}

void SimulatedDevice::free_pinned(void* ptr, std::size_t bytes) {
  unregister_host(ptr, bytes);
  munmap(ptr, bytes);
}

void SimulatedDevice::launch(double host_seconds, double device_seconds,
                             std::function<void()> body) {
  const double cpu = thread_cpu_seconds();
  std::unique_lock lock(mutex_);
  const double at = pay(host_seconds, cpu);
  ++counters_.kernels;
  note("launch");
  if (options_.host_compute) {
    lock.unlock();
    if (body) body();
    lock.lock();
    counters_.compute_busy_seconds += device_seconds;
    hosts_[std::this_thread::get_id()].now = at + device_seconds;
    done();  // the body's own time is the kernel's, modelled by device_seconds
    return;
  }
  Op op;
  op.kind = Op::Kind::kKernel;
  op.queued = at;
  op.seconds = device_seconds;
  op.body = std::move(body);
  push(*compute_, std::move(op));
  done();
}

SimulatedDeviceCounters SimulatedDevice::counters() const {
  const std::lock_guard lock(mutex_);
  return counters_;
}

void SimulatedDevice::log_calls(bool on) {
  const std::lock_guard lock(mutex_);
  logging_ = on;
}

std::vector<std::string> SimulatedDevice::take_log() {
  const std::lock_guard lock(mutex_);
  return std::exchange(log_, {});
}

}  // namespace sdalloc
