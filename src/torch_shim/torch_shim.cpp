// torch_shim.cpp - the C entry points of libsdalloc_torch.so (sdalloc/torch_shim.h).
//
// State: the configuration (parsed from SDALLOC_CONF on first use unless configure() came
// first) and one pool per device index in a fixed table. The allocation fast path is one
// acquire load of the device's slot and the C API call; pools are created under a mutex on
// a device's first allocation and never destroyed (see the header: PyTorch may free tensors
// after this library's static destructors would have run).
//
// No exception leaves this file but one: sdalloc_torch_malloc_raising throws AllocationError
// (a std::bad_alloc) for a failed allocation, because PyTorch's CUDAPluggableAllocator wraps
// whatever its allocation function returns in a DataPtr without a null check. Every other
// entry point either goes through the C API (which turns exceptions into statuses) or runs
// its own body in shim_guarded(). Messages go to a
// per-thread buffer for sdalloc_torch_last_error(); the pointer-returning and void hooks
// that PyTorch calls also print their first failures to stderr, since PyTorch shows nothing.
#include "sdalloc/torch_shim.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "device_stack.hpp"
#include "sdalloc/core/errors.hpp"
#include "shim_config.hpp"

namespace {

using sdalloc::torch_shim::ShimConfig;

constexpr int kMinDevice = -1;
constexpr int kMaxDevices = 64;  // CUDA devices 0..63; slot 0 of the table is device -1
constexpr std::size_t kMessageCapacity = 1024;
constexpr int kMaxReports = 16;  // stderr lines per process, so a loop cannot flood it

thread_local char t_last_error[kMessageCapacity] = "";

struct ShimState {
  std::mutex mutex;  // configuration and pool creation
  std::optional<ShimConfig> config;
  std::string config_error;  // why the configuration is unusable, "" when it is fine
  std::string config_text;
  bool configured = false;  // config or config_error is set
  bool any_pool = false;
  std::array<double, kMaxDevices + 1> fractions{};  // set_memory_fraction before creation
  std::array<std::atomic<sdalloc_pool*>, kMaxDevices + 1> pools{};
  std::atomic<int> reports{0};
  std::atomic<bool> cuda_backend{false};  // the configuration's backend is cuda
  std::atomic<sdalloc_torch_capture_query_fn> capture_query{nullptr};  // a test's stand-in
  std::atomic<std::size_t> quarantined_bytes{0};  // freed during a capture, never reused
};

// Never destroyed: pools must outlive every free PyTorch may make during its own teardown.
ShimState& state() {
  static auto* s = new ShimState();
  return *s;
}

void set_error(const char* function, const std::string& message) noexcept {
  std::snprintf(t_last_error, kMessageCapacity, "%s: %s", function, message.c_str());
}

sdalloc_status_t status_from_error(const char* function, const char* c_api_message,
                                   sdalloc_status_t status) noexcept {
  std::snprintf(t_last_error, kMessageCapacity, "%s: %s", function, c_api_message);
  return status;
}

void report(const char* what) noexcept {
  if (state().reports.fetch_add(1, std::memory_order_relaxed) < kMaxReports) {
    std::fprintf(stderr, "sdalloc_torch: %s: %s\n", what, t_last_error);
  }
}

template <typename Body>
sdalloc_status_t shim_guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const sdalloc::OutOfMemory& e) {
    set_error(function, e.what());
    return SDALLOC_ERROR_OUT_OF_MEMORY;
  } catch (const sdalloc::InvalidArgument& e) {
    set_error(function, e.what());
    return SDALLOC_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    set_error(function, "out of host memory (std::bad_alloc)");
    return SDALLOC_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_error(function, e.what());
    return SDALLOC_ERROR_INTERNAL;
  } catch (...) {
    set_error(function, "unknown exception");
    return SDALLOC_ERROR_INTERNAL;
  }
}

int slot_of(int device) { return device - kMinDevice; }

void check_device(int device) {
  if (device < kMinDevice || device >= kMaxDevices) {
    throw sdalloc::InvalidArgument("device " + std::to_string(device) + " is out of range [" +
                                   std::to_string(kMinDevice) + ", " + std::to_string(kMaxDevices) +
                                   ")");
  }
}

// Under state().mutex: parses `text` into the state, or records why it cannot be used.
void apply_config(ShimState& s, const char* text) {
  s.configured = true;
  try {
    s.config = sdalloc::torch_shim::parse_shim_config(text == nullptr ? "" : text);
    s.config_error.clear();
    s.config_text = sdalloc::torch_shim::format_shim_config(*s.config);
    s.cuda_backend.store(s.config->backend == sdalloc::torch_shim::Backend::kCuda);
  } catch (const sdalloc::InvalidArgument& e) {
    s.config.reset();
    s.config_error = e.what();
    s.config_text.clear();
    throw;
  }
}

// Under state().mutex: the configuration, read from SDALLOC_CONF the first time.
const ShimConfig& config_locked(ShimState& s) {
  if (!s.configured) {
    try {
      apply_config(s, std::getenv("SDALLOC_CONF"));  // NOLINT(concurrency-mt-unsafe)
    } catch (const sdalloc::InvalidArgument&) {
      std::fprintf(stderr, "sdalloc_torch: %s\n", s.config_error.c_str());
    }
  }
  if (!s.config) throw sdalloc::InvalidArgument(s.config_error);
  return *s.config;
}

// The device's pool, created on first use. Throws on failure.
sdalloc_pool* pool_for(int device) {
  check_device(device);
  ShimState& s = state();
  std::atomic<sdalloc_pool*>& slot = s.pools[std::size_t(slot_of(device))];
  if (sdalloc_pool* pool = slot.load(std::memory_order_acquire)) return pool;
  std::lock_guard lock(s.mutex);
  if (sdalloc_pool* pool = slot.load(std::memory_order_acquire)) return pool;
  ShimConfig config = config_locked(s);
  // A fraction set for this device before its pool existed replaces the configured one.
  const double fraction = s.fractions[std::size_t(slot_of(device))];
  if (fraction > 0.0) config.memory_fraction = fraction;
  std::unique_ptr<sdalloc_pool> pool = sdalloc::torch_shim::make_device_pool(config, device);
  s.any_pool = true;
  slot.store(pool.get(), std::memory_order_release);
  return pool.release();
}

// ==================================================================== graph capture
// While a stream captures a CUDA graph the shim must not call cudaMalloc, query events or
// synchronise (each invalidates the capture), and memory a graph uses must not be handed
// out again while the graph may replay. Allocations on a capturing stream are refused;
// a block freed on a capturing stream is quarantined: never freed, so never reused.

bool capturing(cudaStream_t stream) {
  ShimState& s = state();
  if (sdalloc_torch_capture_query_fn query = s.capture_query.load(std::memory_order_acquire)) {
    return query(stream) != 0;
  }
  return s.cuda_backend.load(std::memory_order_relaxed) &&
         sdalloc::torch_shim::cuda_stream_capturing(stream);
}

std::string capture_refusal(cudaStream_t stream) {
  char address[32];
  std::snprintf(address, sizeof address, "%p", static_cast<void*>(stream));
  return std::string("stream ") + address +
         " is capturing a CUDA graph, and sdalloc.torch.install() does not serve "
         "allocations during a capture (a graph's memory would be reused after it, so "
         "replays would corrupt live tensors). For torch.cuda.graph or torch.compile("
         "mode=\"reduce-overhead\"), keep PyTorch's allocator and give sdalloc its segments "
         "through sdalloc.torch.mempool() instead";
}

}  // namespace

// ==================================================================== allocator

void* sdalloc_torch_malloc(std::size_t size, int device, cudaStream_t stream) noexcept {
  if (size == 0) return nullptr;
  sdalloc_pool_t* pool = nullptr;
  if (shim_guarded(__func__, [&] {
        pool = pool_for(device);
        return SDALLOC_SUCCESS;
      }) != SDALLOC_SUCCESS) {
    report("allocation failed");
    return nullptr;
  }
  if (capturing(stream)) {  // refused: the raising variant's exception says why
    set_error(__func__, capture_refusal(stream));
    return nullptr;
  }
  void* ptr = nullptr;
  const sdalloc_status_t status = sdalloc_malloc(pool, size, stream, &ptr);
  if (status != SDALLOC_SUCCESS) {
    // Out of memory is the caller's to report, no stderr line: in a torch.cuda.MemPool,
    // PyTorch's caching allocator checks for nullptr and raises OutOfMemoryError; the full
    // replacement uses sdalloc_torch_malloc_raising, which throws.
    status_from_error(__func__, sdalloc_last_error(), status);
    return nullptr;
  }
  return ptr;
}

namespace {

// What sdalloc_torch_malloc_raising throws: derived from std::bad_alloc (as RMM's torch
// allocator does), so PyTorch's handlers (catch std::exception) turn it into a Python
// RuntimeError carrying what(). Its type_info is this library's own, but a catch of a base
// class goes through libstdc++'s std::bad_alloc, which every library shares.
class AllocationError final : public std::bad_alloc {
 public:
  explicit AllocationError(std::string message) : message_(std::move(message)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace

void* sdalloc_torch_malloc_raising(std::size_t size, int device, cudaStream_t stream) {
  void* ptr = sdalloc_torch_malloc(size, device, stream);
  if (ptr != nullptr || size == 0) return ptr;
  // "out of memory" leads for OOM, as in PyTorch's own message, so code that matches on it
  // (retry with a smaller batch) keeps working; the C API's message carries the figures.
  const bool oom = std::strstr(t_last_error, "out of memory") != nullptr;
  throw AllocationError(std::string(oom ? "CUDA out of memory (sdalloc): " : "sdalloc: ") +
                        "cannot allocate " + std::to_string(size) + " bytes on device " +
                        std::to_string(device) + ": " + t_last_error);
}

void sdalloc_torch_free(void* ptr, std::size_t /*size*/, int device, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  sdalloc_pool_t* pool = nullptr;
  if (device >= kMinDevice && device < kMaxDevices) {
    pool = state().pools[std::size_t(slot_of(device))].load(std::memory_order_acquire);
  }
  if (pool == nullptr) {
    set_error(__func__, "device " + std::to_string(device) +
                            " has no sdalloc pool, so the pointer cannot be one of its "
                            "allocations; ignored");
    report("free ignored");
    return;
  }
  if (capturing(stream)) {
    // A graph captured on this stream may still use the block in its replays: keep it.
    std::size_t bytes = 0;
    (void)sdalloc_allocation_size(pool, ptr, &bytes);
    state().quarantined_bytes.fetch_add(bytes, std::memory_order_relaxed);
    return;
  }
  const sdalloc_status_t status = sdalloc_free(pool, ptr, stream);
  if (status != SDALLOC_SUCCESS) {
    status_from_error(__func__, sdalloc_last_error(), status);
    report("free ignored");
  }
}

// ==================================================================== hooks

void sdalloc_torch_init(int /*device_count*/) noexcept {}

void sdalloc_torch_empty_cache(void) noexcept {
  if (sdalloc_torch_trim(nullptr) != SDALLOC_SUCCESS) report("empty_cache failed");
}

void sdalloc_torch_record_stream(void* ptr, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  for (auto& slot : state().pools) {
    sdalloc_pool* pool = slot.load(std::memory_order_acquire);
    if (pool == nullptr) continue;
    const sdalloc_status_t status = sdalloc_record_stream(pool, ptr, stream);
    if (status == SDALLOC_SUCCESS) return;
    if (status != SDALLOC_ERROR_INVALID_POINTER) {  // not "not mine": a real failure
      status_from_error(__func__, sdalloc_last_error(), status);
      report("record_stream ignored");
      return;
    }
  }
  set_error(__func__, "the pointer is not a live allocation of any sdalloc pool; ignored");
  report("record_stream ignored");
}

void sdalloc_torch_memory_fraction_hook(double fraction, int device) noexcept {
  if (sdalloc_torch_set_memory_fraction(fraction, device) != SDALLOC_SUCCESS) {
    report("set_memory_fraction failed");
  }
}

// ==================================================================== control

sdalloc_status_t sdalloc_torch_configure(const char* conf) noexcept {
  return shim_guarded(__func__, [&] {
    ShimState& s = state();
    std::lock_guard lock(s.mutex);
    if (s.any_pool) {
      throw sdalloc::InvalidArgument(
          "a pool already exists (the first allocation fixed the configuration to '" +
          s.config_text + "'): configure before the first allocation");
    }
    apply_config(s, conf);
    return SDALLOC_SUCCESS;
  });
}

const char* sdalloc_torch_config(void) noexcept {
  ShimState& s = state();
  std::lock_guard lock(s.mutex);
  try {
    config_locked(s);
  } catch (...) {
    return "";
  }
  return s.config_text.c_str();
}

int sdalloc_torch_has_cuda(void) noexcept { return sdalloc::torch_shim::built_with_cuda() ? 1 : 0; }

sdalloc_pool_t* sdalloc_torch_pool(int device) noexcept {
  if (device < kMinDevice || device >= kMaxDevices) return nullptr;
  return state().pools[std::size_t(slot_of(device))].load(std::memory_order_acquire);
}

sdalloc_status_t sdalloc_torch_get_pool(int device, sdalloc_pool_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return shim_guarded(__func__, [&] {
    if (out == nullptr) throw sdalloc::InvalidArgument("out is NULL");
    *out = pool_for(device);
    return SDALLOC_SUCCESS;
  });
}

sdalloc_status_t sdalloc_torch_set_memory_fraction(double fraction, int device) noexcept {
  return shim_guarded(__func__, [&] {
    check_device(device);
    if (!(fraction > 0.0) || fraction > 1.0) {
      throw sdalloc::InvalidArgument("fraction " + std::to_string(fraction) + " is outside (0, 1]");
    }
    ShimState& s = state();
    std::lock_guard lock(s.mutex);
    const ShimConfig& config = config_locked(s);
    if (config.backend == sdalloc::torch_shim::Backend::kHost && config.capacity == 0) {
      throw sdalloc::InvalidArgument(
          "a memory fraction with backend:host needs capacity in SDALLOC_CONF (the host has "
          "no device memory size to take a fraction of)");
    }
    sdalloc_pool* pool = s.pools[std::size_t(slot_of(device))].load();
    s.fractions[std::size_t(slot_of(device))] = fraction;
    if (pool != nullptr) {
      pool->stack->set_capacity(sdalloc::torch_shim::cap_for(
          config, fraction, sdalloc::torch_shim::fraction_base(config, *pool)));
    }
    return SDALLOC_SUCCESS;
  });
}

sdalloc_status_t sdalloc_torch_trim(std::size_t* released) noexcept {
  if (released != nullptr) *released = 0;
  std::size_t total = 0;
  for (auto& slot : state().pools) {
    sdalloc_pool* pool = slot.load(std::memory_order_acquire);
    if (pool == nullptr) continue;
    std::size_t bytes = 0;
    const sdalloc_status_t status = sdalloc_trim(pool, &bytes);
    if (status != SDALLOC_SUCCESS) return status_from_error(__func__, sdalloc_last_error(), status);
    total += bytes;
  }
  if (released != nullptr) *released = total;
  return SDALLOC_SUCCESS;
}

const char* sdalloc_torch_last_error(void) noexcept { return t_last_error; }

// ==================================================================== testing

void sdalloc_torch_set_capture_query_for_testing(sdalloc_torch_capture_query_fn query) noexcept {
  state().capture_query.store(query, std::memory_order_release);
}

size_t sdalloc_torch_quarantined_bytes(void) noexcept {
  return state().quarantined_bytes.load(std::memory_order_relaxed);
}

uint64_t sdalloc_torch_vmm_unmaps(int device) noexcept {
  if (device < kMinDevice || device >= kMaxDevices) return 0;
  const sdalloc_pool* pool = state().pools[std::size_t(slot_of(device))].load();
  return pool == nullptr ? 0 : sdalloc::torch_shim::vmm_unmaps(*pool);
}
