// preload_runtime.cpp - building the drop-in's pool, serving its share, reporting at exit.
#include "preload/preload_runtime.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>

#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/planned_arena.hpp"

namespace sdalloc::preload {
namespace {

// =======================================================================================
// Where the runtime lives, and the figures the entry points read without it

enum State : int { kUnbuilt, kBuilding, kReady, kOff };

constinit std::atomic<int> g_state{kUnbuilt};
alignas(Runtime) unsigned char g_storage[sizeof(Runtime)];
constinit Runtime* g_runtime = nullptr;

// glibc serves the requests below the threshold. By default it mmaps each block above a
// threshold that starts at 128 KiB (and rises only as such blocks are freed) and trims its
// heaps' free tops above 128 KiB: either way those pages go back to the kernel and fault in
// again on the next iteration. Keep them, as tcmalloc does (the faults it saves:
// docs/preload.md).
void keep_system_heap(std::size_t threshold) {
  // glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
  constexpr std::size_t kMaxMmapThreshold = std::size_t{32} << 20;
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(std::min(threshold, kMaxMmapThreshold)));
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

// One line on stderr, written with write(2): no stdio buffer, no malloc.
void say(const std::string& line) {
  const std::string text = "sdalloc preload: " + line + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

constinit std::atomic<std::size_t> g_threshold{kSmallestThreshold};
constinit std::atomic<std::uintptr_t> g_range_base{0};
constinit std::atomic<std::size_t> g_range_size{0};

// =======================================================================================
// Building

Runtime* Runtime::built() {
  return g_state.load(std::memory_order_acquire) == kReady ? g_runtime : nullptr;
}

Runtime* Runtime::get() {
  int state = g_state.load(std::memory_order_acquire);
  if (state == kReady) return g_runtime;
  if (state == kOff) return nullptr;
  if (state == kUnbuilt && g_state.compare_exchange_strong(state, kBuilding)) {
    auto* runtime = new (g_storage) Runtime();
    const bool ok = runtime->build();
    if (ok) {
      g_runtime = runtime;
      g_threshold.store(runtime->config_.threshold, std::memory_order_relaxed);
    } else {
      g_threshold.store(SIZE_MAX, std::memory_order_relaxed);  // everything to glibc
    }
    g_state.store(ok ? kReady : kOff, std::memory_order_release);
    return ok ? runtime : nullptr;
  }
  // Another thread builds it; its own nested calls never get here (they go to glibc).
  while ((state = g_state.load(std::memory_order_acquire)) == kBuilding) sched_yield();
  return state == kReady ? g_runtime : nullptr;
}

bool Runtime::build() {
  // SDALLOC_PRELOAD_CONF first: SDALLOC_CONF is also the PyTorch shim's, which rejects the
  // drop-in's own keys, so a process that uses both gives the drop-in its own variable.
  const char* text = std::getenv("SDALLOC_PRELOAD_CONF");
  if (text == nullptr) text = std::getenv("SDALLOC_CONF");
  try {
    config_ = parse_preload_config(text == nullptr ? "" : text);
  } catch (const std::exception& e) {
    say(std::string(e.what()) + "; running on the system allocator");
    return false;
  }
  ReservedRange::use_huge_pages(config_.huge_pages);
  if (!range_.reserve(config_.address_space)) {
    say("cannot reserve " + config::size_text(config_.address_space) +
        " (or even 1GiB) of address space: " + std::strerror(errno) +
        "; running on the system allocator");
    return false;
  }
  try {
    MemoryBackend backend;
    backend.name = "the drop-in's reserved range";
    backend.segments = std::make_unique<RangeResource>(range_, config_.capacity);
    backend.virtual_memory =
        std::make_unique<RangeVirtualMemory>(range_, config_.capacity, config_.vmm_moves);
    backend.host_pages = true;  // a planned step pays no page faults
    // Ranges come out of the one reservation: a few per pool, each well inside it. Requests
    // are at least the threshold: pages of 2 MiB (huge-page sized), one mmap each.
    backend.vm_range_size = std::min<std::size_t>(std::size_t{64} << 30, range_.size() / 8);
    backend.vm_page_size = std::size_t{2} << 20;
    stack_ = make_pool(config_, std::move(backend));
    if (stack_->mode == PoolMode::kPlanned) {
      steps_ = std::make_unique<StepDetector>();
      detecting_.store(true, std::memory_order_relaxed);
    }
  } catch (const std::exception& e) {
    say(std::string("SDALLOC_CONF: ") + e.what() + "; running on the system allocator");
    return false;
  }
  g_range_base.store(range_.base(), std::memory_order_relaxed);
  g_range_size.store(range_.size(), std::memory_order_relaxed);
  pid_ = static_cast<int>(::getpid());
  if (!config_.record.empty()) {
    try {
      trace_start(trace_, path_for_process(config_.record, pid_));
      tracing_.store(true, std::memory_order_relaxed);
    } catch (const std::exception& e) {
      say(std::string("record: ") + e.what() + "; running without a trace");
    }
  }
  // Only once the pool serves: a drop-in that is off leaves glibc as it is.
  if (config_.keep_system_heap) keep_system_heap(config_.threshold);
  pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child);
  return true;
}

// =======================================================================================
// Serving

void* Runtime::allocate(std::size_t bytes, std::size_t alignment) {
  SharedForkGuard guard(fork_guard_);
  if (detecting_.load(std::memory_order_relaxed)) detect_step(bytes);
  void* ptr = nullptr;
  try {
    ptr = stack_->pool->allocate(bytes, alignment, kDefaultStream);
  } catch (const OutOfMemory& e) {
    if (detecting_.load(std::memory_order_relaxed)) {
      std::lock_guard lock(steps_mutex_);
      steps_->allocation_failed();
    }
    counters_.system_fallbacks.fetch_add(1, std::memory_order_relaxed);
    if (!warned_full_.exchange(true)) {
      say(std::string(e.what()) + "; serving this and later requests the pool cannot hold " +
          "from the system allocator");
    }
    return nullptr;
  }
  if (tracing_.load(std::memory_order_relaxed)) trace_allocation(trace_, ptr, bytes);
  return ptr;
}

void Runtime::free(void* ptr) {
  SharedForkGuard guard(fork_guard_);
  if (tracing_.load(std::memory_order_relaxed)) trace_free(trace_, ptr);
  if (detecting_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(steps_mutex_);
    steps_->on_free();
  }
  try {
    stack_->pool->free(ptr, kDefaultStream);
  } catch (const InvalidPointer& e) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "free(): invalid pointer %p: inside sdalloc's range but not a live allocation "
                  "(double free or interior pointer); aborting",
                  ptr);
    say(line);
    std::abort();
  } catch (const std::exception& e) {
    // Not the pointer's fault (the pool could not allocate its own bookkeeping): keep the
    // block (leaked) rather than let an exception out of free().
    say(std::string("free(): ") + e.what() + "; the block is leaked");
  }
}

std::size_t Runtime::usable_size(const void* ptr) {
  SharedForkGuard guard(fork_guard_);
  try {
    return stack_->pool->allocation_size(ptr);
  } catch (const std::exception&) {
    return 0;  // not a live allocation: glibc answers 0 for a freed chunk too
  }
}

// =======================================================================================
// Steps

void Runtime::detect_step(std::size_t bytes) {
  std::lock_guard lock(steps_mutex_);
  if (!detecting_.load(std::memory_order_relaxed)) return;
  try {
    apply(steps_->on_allocate(bytes));
  } catch (const std::exception& e) {
    // The arena refused a step (it should not): serve on from the fallback pool, unplanned.
    detecting_.store(false, std::memory_order_relaxed);
    say(std::string("step detection stopped: ") + e.what());
  }
}

void Runtime::apply(StepDetector::Action action) {
  PlannedArena& arena = *stack_->pool->planned();
  switch (action) {
    case StepDetector::Action::kNone:
      return;
    case StepDetector::Action::kEndAndBegin:
    case StepDetector::Action::kEnd:
      if (arena.in_step()) arena.end_step();
      if (steps_->step_ended(arena.counters().divergent_steps > divergent_at_begin_) ==
              StepDetector::Action::kEnd ||
          action == StepDetector::Action::kEnd) {
        return;  // the detector gave up: learn again, no step open
      }
      [[fallthrough]];
    case StepDetector::Action::kBegin:
      divergent_at_begin_ = arena.counters().divergent_steps;
      if (!arena.in_step()) arena.begin_step();
      return;
  }
}

void Runtime::stop_detection() {
  std::lock_guard lock(steps_mutex_);
  if (!detecting_.exchange(false)) return;
  if (PlannedArena* arena = stack_->pool->planned(); arena != nullptr && arena->in_step()) {
    arena->end_step();
  }
}

bool Runtime::begin_step() {
  SharedForkGuard guard(fork_guard_);
  stop_detection();
  PlannedArena* arena = stack_->pool->planned();
  if (arena == nullptr || arena->in_step()) return false;
  arena->begin_step();
  return true;
}

bool Runtime::end_step() {
  SharedForkGuard guard(fork_guard_);
  stop_detection();
  PlannedArena* arena = stack_->pool->planned();
  if (arena == nullptr || !arena->in_step()) return false;
  arena->end_step();
  return true;
}

// =======================================================================================
// fork

void Runtime::at_fork_prepare() {
  if (g_runtime != nullptr) g_runtime->fork_guard_.lock();
}
void Runtime::at_fork_parent() {
  if (g_runtime != nullptr) g_runtime->fork_guard_.unlock();
}
void Runtime::at_fork_child() {
  if (g_runtime == nullptr) return;
  g_runtime->fork_guard_.reset();
  // The trace file and the report belong to the parent; the child keeps the pool only.
  g_runtime->tracing_.store(false, std::memory_order_relaxed);
}

// =======================================================================================
// The report

std::string Runtime::report() const {
  const PoolStats s = stack_->pool->stats();
  std::string text = "sdalloc preload report (pid " + std::to_string(::getpid()) + ")\n";
  text += "  mode:" + to_string(stack_->mode) +
          " threshold:" + config::size_text(config_.threshold) + "\n";
  text += "  peak live      " + format_bytes(s.peak_live_bytes) + "\n";
  text += "  peak reserved  " + format_bytes(s.peak_reserved_bytes) + "\n";
  text += "  live at exit   " + format_bytes(s.live_bytes) + " in " +
          std::to_string(s.live_allocations) + " allocations\n";
  text += "  allocations    " + std::to_string(s.allocations) + "\n";
  text += "  frees          " + std::to_string(s.frees) + "\n";
  text += "  segments       " + std::to_string(s.segment_allocations) + " taken, " +
          std::to_string(s.segment_releases) + " given back\n";
  text += "  to the system  " +
          std::to_string(counters_.system_fallbacks.load(std::memory_order_relaxed)) +
          " requests the pool could not hold\n";
  text += "  calloc         " +
          format_bytes(counters_.fresh_bytes.load(std::memory_order_relaxed)) +
          " fresh (not written), " +
          format_bytes(counters_.zeroed_bytes.load(std::memory_order_relaxed)) + " zeroed\n";
  if (const PlannedArena* arena = stack_->pool->planned(); arena != nullptr) {
    const PlannedArenaCounters c = arena->counters();
    text += "  steps          " + std::to_string(c.recorded_steps) + " recorded, " +
            std::to_string(c.planned_steps) + " planned, " + std::to_string(c.divergent_steps) +
            " divergent; " + std::to_string(c.planned_allocations) + " allocations from the " +
            "arena (" + format_bytes(arena->planned_arena_size()) + ")\n";
    if (steps_ != nullptr) {
      text +=
          "  detection      " +
          std::string(detecting_.load(std::memory_order_relaxed) ? "on" : "off (steps marked)") +
          ", " + std::to_string(steps_->locks()) + " locks" +
          (steps_->locked()
               ? ", a step of " + std::to_string(steps_->step_allocations()) + " requests"
               : std::string()) +
          "\n";
    }
  }
  return text;
}

std::string Runtime::report_json() const {
  const PoolStats s = stack_->pool->stats();
  const auto field = [](const char* key, std::uint64_t value) {
    return std::string("\"").append(key).append("\": ").append(std::to_string(value));
  };
  std::string text = R"({"mode": ")" + to_string(stack_->mode) + R"(", )";
  text += field("threshold_bytes", config_.threshold) + ", ";
  text += field("peak_live_bytes", s.peak_live_bytes) + ", ";
  text += field("peak_reserved_bytes", s.peak_reserved_bytes) + ", ";
  text += field("pool_allocations", s.allocations) + ", ";
  text += field("system_allocations", counters_.system_fallbacks.load(std::memory_order_relaxed)) +
          ", ";
  text += field("live_bytes_at_exit", s.live_bytes) + "}\n";
  return text;
}

void Runtime::stop_trace() {
  if (!tracing_.exchange(false)) return;
  try {
    trace_stop(trace_);
  } catch (const std::exception& e) {
    say(std::string("record: ") + e.what());
  }
}

void Runtime::at_exit() {
  if (static_cast<int>(::getpid()) != pid_) return;
  stop_trace();
  write_report();
}

void Runtime::write_report() const {
  if (config_.report.empty()) return;
  const std::string path = path_for_process(config_.report, pid_);
  const bool json = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  const std::string text = json ? report_json() : report();
  if (path == "stderr") {
    write_all(STDERR_FILENO, text);
    return;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    say("report: cannot create '" + path + "': " + std::strerror(errno));
    return;
  }
  write_all(fd, text);
  ::close(fd);
}

}  // namespace sdalloc::preload
