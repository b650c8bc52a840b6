// sdalloc/transfer/simulated_device.hpp - a GPU on the host: a launch-bound compute queue,
// one copy engine of a given bandwidth, a cost for every call.
//
// What it models, and why (the figures an offload on a GPU depends on):
//  - The host pays for every call: launch(host_seconds, ...) costs the host its
//    host_seconds (a kernel launch, the framework's dispatch around it), every other call
//    (record, wait, copy, synchronize) costs seconds_per_call; real work between calls
//    (Python hooks, the offloader's own code) costs what it takes: the calling thread's
//    CPU time. A host that waits (synchronize, wait_host, a pageable copy) moves on when
//    the device has done what it waits for.
//  - The compute queue runs kernels one after another for their device seconds; a kernel
//    starts no earlier than its launch was paid. Where kernels are shorter than their
//    launches (launch-bound) the queue idles waiting for the host, and catches up after a
//    wait.
//  - One copy engine runs the copy calls in order, each taking seconds_per_copy + bytes /
//    copy_bytes_per_second (0: the memcpy's own time), after any event it waits for. The
//    copy really happens, so what a kernel reads is what the offloader put there.
//  - Time is simulated, not slept: each host thread and each queue keeps a clock (an op
//    starts at the latest of its queue's clock, its call's host time and the events it
//    waits for), while the work itself (copies, kernel bodies) runs on the queues' threads
//    as soon as what it depends on has run. So a step's time (host_seconds() before and
//    after it) is the same on an idle or a loaded machine, and other processes' load
//    never counts; what the host's own code costs does.
//  - register_host is mlock (the operating system's page-locking, with its RLIMIT_MEMLOCK
//    and cgroup limits); a copy from memory not locked is counted (pageable_copies) and
//    blocks the host until done, as cudaMemcpyAsync from pageable memory does.
//  - Device memory is host memory (mmap); allocations are counted.
//
// With host_compute, the calling thread is the compute queue instead: launch() runs its
// body at once, a wait on the compute queue blocks the host until the event is done - the
// mode in which host code (torch on the CPU) computes on "device" memory.
//
// A kernel's `body` runs on the compute queue's thread when the kernel runs (after every
// wait queued before it), so a check there (the weights it reads are the right ones) sees
// what a kernel would. log_calls(true) keeps every call's description (op, queue, event,
// addresses, bytes), to compare two steps (a captured graph needs them equal).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/transfer/stream_device.hpp"

namespace sdalloc {

struct SimulatedDeviceOptions {
  double copy_bytes_per_second = 0;  // the copy engine; 0: memcpy speed
  double seconds_per_copy = 0;       // the engine's fixed cost per copy call
  double seconds_per_call = 0;       // the host's cost per call (record, wait, copy)
  bool host_compute = false;         // the calling thread is the compute queue
};

struct SimulatedDeviceCounters {
  std::uint64_t kernels = 0;
  std::uint64_t copy_calls = 0;
  std::uint64_t copied_bytes = 0;
  std::uint64_t pageable_copies = 0;  // copies from memory not page-locked (must stay 0)
  std::uint64_t calls = 0;            // every call: launches, records, waits, copies
  std::uint64_t host_waits = 0;       // synchronize, wait_host, compute waits in host_compute
  std::uint64_t device_allocations = 0;
  std::uint64_t device_frees = 0;
  std::size_t device_bytes = 0;  // held now
  std::size_t locked_bytes = 0;  // mlock'ed now
  double compute_busy_seconds = 0;
  double copy_busy_seconds = 0;
};

class SimulatedDevice final : public StreamDevice {
 public:
  explicit SimulatedDevice(SimulatedDeviceOptions options = {});
  ~SimulatedDevice() override;  // waits for both queues

  std::string name() const override;  // "simulated"
  MemoryResource& device_memory() override;
  Stream compute_stream() const override { return Stream(1); }

  Event create_event(bool timing) override;
  void record(Event event, DeviceQueue queue) override;
  void wait(DeviceQueue queue, Event event) override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override;
  void synchronize(DeviceQueue queue) override;
  void wait_host(Event event) override;
  double elapsed_seconds(Event from, Event to) override;
  Hold hold(DeviceQueue queue) override;
  void open(Hold hold) override;

  void register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr, std::size_t bytes) override;
  void* allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* ptr, std::size_t bytes) override;

  // A kernel of `device_seconds` on the compute queue, after costing the host host_seconds.
  void launch(double host_seconds, double device_seconds, std::function<void()> body = {});
  SimulatedDeviceCounters counters() const;
  // The calling thread's clock, in simulated seconds (its CPU time since its last call
  // counted first).
  double host_seconds() override;
  void log_calls(bool on);
  std::vector<std::string> take_log();
  const SimulatedDeviceOptions& options() const { return options_; }

 private:
  struct Op;
  struct Queue;
  struct EventState;
  struct HostClock {
    double now = 0;       // simulated seconds
    double cpu_mark = 0;  // the thread's CPU time at the end of its last call
  };
  class Memory;
  // The calling thread's clock after its CPU time since its last call (up to `cpu`, read
  // before the mutex was taken) and `cost` (mutex_ held); done() marks the end of a call:
  // the call's own CPU time is what `cost` models.
  double pay(double cost, double cpu);
  void done();
  void push(Queue& queue, Op op);
  void run(Queue& queue);
  bool locked(const void* ptr, std::size_t bytes) const;  // mutex_ held
  void note(const std::string& call);                     // mutex_ held

  SimulatedDeviceOptions options_;
  std::unique_ptr<Memory> memory_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<Queue> compute_;
  std::unique_ptr<Queue> copy_;
  std::deque<EventState> events_;                 // stable: workers hold references while waiting
  std::vector<double> holds_;                     // when each hold was opened; < 0 while closed
  std::map<std::uintptr_t, std::size_t> locked_;  // mlock'ed ranges: start -> bytes
  SimulatedDeviceCounters counters_;
  std::map<std::thread::id, HostClock> hosts_;
  bool logging_ = false;
  std::vector<std::string> log_;
  bool stopping_ = false;
};

}  // namespace sdalloc
