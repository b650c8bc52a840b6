// c_api.cpp - the C API (include/sdalloc/sdalloc.h) over a pool handle (c_pool.hpp).
//
// The one rule of this file: no exception crosses the C ABI. Every entry point runs its
// body inside guarded(), which catches everything, maps sdalloc's typed errors (and
// std::bad_alloc) to a status, and stores the message in a per-thread buffer for
// sdalloc_last_error(). That buffer is a fixed char array, so recording an error can never
// itself fail or allocate. Argument checks throw InvalidArgument like the C++ API does, so
// every failure takes the same path and reads the same way: "<function>: <problem>".
//
// A pool handle (c_pool.hpp) owns its whole resource stack and the recorder of its event
// trace. sdalloc_pool_create builds host stacks; the PyTorch shim builds device stacks of the
// same type. Allocations and frees report to the recorder (a relaxed load while it is off).
#include "sdalloc/sdalloc.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/c_config.hpp"
#include "c_api/c_pool.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/core/pool_layout.hpp"
#include "sdalloc/core/pool_stats.hpp"
#include "sdalloc/core/tensor.hpp"
#include "sdalloc/policies/planned_arena.hpp"
#include "sdalloc/version.hpp"

struct sdalloc_layout {
  sdalloc::PoolLayout layout;
};

using namespace sdalloc::c_api_detail;  // NOLINT(google-build-using-namespace)

namespace {

// The smallest struct_size each versioned struct accepts: the end of the last field of its
// first version. Callers built against a newer header than this library send a larger size
// than sizeof() here and are refused (they may have set fields this library would ignore).
constexpr std::size_t kConfigFirstSize =
    offsetof(sdalloc_pool_config_t, consolidate_when_empty) + sizeof(bool);
constexpr std::size_t kStatsFirstSize =
    offsetof(sdalloc_stats_t, peak_overhead_ratio) + sizeof(double);
constexpr std::size_t kSegmentInfoFirstSize =
    offsetof(sdalloc_segment_info_t, pinned) + sizeof(bool);
constexpr std::size_t kStepStatsFirstSize =
    offsetof(sdalloc_step_stats_t, arena_failures) + sizeof(std::uint64_t);
constexpr std::size_t kBlockInfoFirstSize =
    offsetof(sdalloc_block_info_t, state) + sizeof(sdalloc_block_state_t);

static_assert(SDALLOC_BLOCK_FREE == static_cast<int>(sdalloc::BlockState::kFree));
static_assert(SDALLOC_BLOCK_LIVE == static_cast<int>(sdalloc::BlockState::kLive));
static_assert(SDALLOC_BLOCK_PENDING_FREE == static_cast<int>(sdalloc::BlockState::kPendingFree));

// A retired field's warning, once per process and field: a program that creates many pools
// is told once.
void warn_once(const std::string& line) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard lock(mutex);
  if (said.insert(line).second) std::fprintf(stderr, "sdalloc_pool_create: %s\n", line.c_str());
}

const sdalloc::SegmentLayout& segment_of(const sdalloc_layout_t* layout, std::size_t segment) {
  require(layout != nullptr, "layout is NULL");
  if (segment >= layout->layout.segments.size()) {
    throw sdalloc::InvalidArgument("segment index " + std::to_string(segment) +
                                   " is past the last segment (the layout has " +
                                   std::to_string(layout->layout.segments.size()) + ")");
  }
  return layout->layout.segments[segment];
}

// The keys of to_memory_stats, in its (sorted) order, built once.
const std::vector<std::string>& memory_stat_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> names;
    for (const auto& [key, value] : sdalloc::to_memory_stats(sdalloc::PoolStats{})) {
      names.push_back(key);
    }
    return names;
  }();
  return keys;
}

void check_struct_size(const char* name, std::size_t size, std::size_t first, std::size_t current,
                       const char* how_to_fill) {
  if (size == 0) {
    throw sdalloc::InvalidArgument(std::string(name) + "->struct_size is 0: " + how_to_fill);
  }
  if (size < first || size > current) {
    throw sdalloc::InvalidArgument(std::string(name) + "->struct_size is " + std::to_string(size) +
                                   ", which this library (" SDALLOC_VERSION_STRING
                                   ") does not know: it accepts " +
                                   std::to_string(first) + " to " + std::to_string(current) +
                                   " (a larger value means a header newer than the library)");
  }
}

// Answers a caller's versioned out-struct: `fill` sets the fields of a zeroed struct of this
// library's version, and as much of it as the caller's struct_size covers is copied out (a
// caller built against an older header has a shorter struct). NULL and an unknown size are
// refused before `fill` runs; `type` names the struct in the message ("sdalloc_stats_t").
template <typename Struct, typename Fill>
void fill_versioned(Struct* out, const char* name, const char* type, std::size_t first_size,
                    Fill&& fill) {
  if (out == nullptr) throw sdalloc::InvalidArgument(std::string(name) + " is NULL");
  const std::size_t size = out->struct_size;
  check_struct_size(name, size, first_size, sizeof(Struct),
                    ("set it to sizeof(" + std::string(type) + ") before the call").c_str());
  Struct filled{};
  fill(filled);
  filled.struct_size = size;
  std::memcpy(out, &filled, size);
}

}  // namespace

// ==================================================================== errors, version

const char* sdalloc_last_error(void) noexcept { return t_last_error; }

const char* sdalloc_status_string(sdalloc_status_t status) noexcept {
  switch (raw_value(status)) {
    case SDALLOC_SUCCESS:
      return "SDALLOC_SUCCESS";
    case SDALLOC_ERROR_OUT_OF_MEMORY:
      return "SDALLOC_ERROR_OUT_OF_MEMORY";
    case SDALLOC_ERROR_INVALID_ARGUMENT:
      return "SDALLOC_ERROR_INVALID_ARGUMENT";
    case SDALLOC_ERROR_INVALID_POINTER:
      return "SDALLOC_ERROR_INVALID_POINTER";
    case SDALLOC_ERROR_INTERNAL:
      return "SDALLOC_ERROR_INTERNAL";
  }
  return "unknown status";
}

const char* sdalloc_version(void) noexcept { return SDALLOC_VERSION_STRING; }

// ==================================================================== pools

// The name in parentheses: the function, not the header's macro of the same name.
void(sdalloc_pool_config_init)(sdalloc_pool_config_t* config) noexcept {
  sdalloc_pool_config_init_sized(config, sizeof *config);
}

void sdalloc_pool_config_init_sized(sdalloc_pool_config_t* out, std::size_t struct_size) noexcept {
  copy_defaults(sdalloc::c_api_detail::config_defaults(), out, struct_size);
}

sdalloc_status_t sdalloc_pool_create(const sdalloc_pool_config_t* config,
                                     sdalloc_pool_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    require(out != nullptr, "out is NULL");
    // Start from the defaults and copy what the caller's struct holds: a caller built
    // against an older, shorter struct gets the defaults for the fields it does not know.
    sdalloc_pool_config_t effective = sdalloc::c_api_detail::config_defaults();
    std::size_t given = sizeof effective;
    if (config != nullptr) {
      check_struct_size("config", config->struct_size, kConfigFirstSize, sizeof effective,
                        "initialise the config with sdalloc_pool_config_init");
      given = config->struct_size;
      std::memcpy(&effective, config, given);
    }
    std::vector<std::string> warnings;
    const sdalloc::PoolConf conf = sdalloc::c_api_detail::pool_conf_of(effective, given, warnings);
    sdalloc::MemoryBackend backend = sdalloc::c_api_detail::backend_of(effective);
    for (const std::string& line : warnings) warn_once(line);
    *out = std::make_unique<sdalloc_pool>(sdalloc::make_pool(conf, std::move(backend))).release();
  });
}

void sdalloc_pool_destroy(sdalloc_pool_t* pool) noexcept { delete pool; }

sdalloc_status_t sdalloc_malloc(sdalloc_pool_t* pool, std::size_t size, sdalloc_stream_t stream,
                                void** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(out != nullptr, "out is NULL");
    *out = handle_pool.allocate(size, sdalloc::kPoolRounding, stream_of(stream));
    pool->recorder.on_allocate(*out, size, stream_of(stream));
  });
}

sdalloc_status_t sdalloc_malloc_aligned(sdalloc_pool_t* pool, std::size_t size,
                                        std::size_t alignment, sdalloc_stream_t stream,
                                        void** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(out != nullptr, "out is NULL");
    *out = handle_pool.allocate(size, alignment, stream_of(stream));
    pool->recorder.on_allocate(*out, size, stream_of(stream));
  });
}

sdalloc_status_t sdalloc_free(sdalloc_pool_t* pool, void* ptr, sdalloc_stream_t stream) noexcept {
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    pool->recorder.on_free(ptr, stream_of(stream));  // before the address can be reused
    handle_pool.free(ptr, stream_of(stream));
  });
}

sdalloc_status_t sdalloc_record_stream(sdalloc_pool_t* pool, void* ptr,
                                       sdalloc_stream_t stream) noexcept {
  return guarded(__func__, [&] { pool_of(pool).record_stream(ptr, stream_of(stream)); });
}

sdalloc_status_t sdalloc_allocation_size(sdalloc_pool_t* pool, const void* ptr,
                                         std::size_t* size) noexcept {
  if (size != nullptr) *size = 0;
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(size != nullptr, "size is NULL");
    if (ptr != nullptr) *size = handle_pool.allocation_size(ptr);
  });
}

sdalloc_status_t sdalloc_trim(sdalloc_pool_t* pool, std::size_t* released) noexcept {
  if (released != nullptr) *released = 0;
  return guarded(__func__, [&] {
    const std::size_t bytes = pool_of(pool).trim();
    if (released != nullptr) *released = bytes;
  });
}

// ==================================================================== steps

sdalloc_status_t sdalloc_pool_begin_step(sdalloc_pool_t* pool, sdalloc_stream_t stream) noexcept {
  return guarded(__func__,
                 [&] { sdalloc::detail::planned_of(pool_of(pool)).begin_step(stream_of(stream)); });
}

sdalloc_status_t sdalloc_pool_end_step(sdalloc_pool_t* pool) noexcept {
  return guarded(__func__, [&] { sdalloc::detail::planned_of(pool_of(pool)).end_step(); });
}

sdalloc_status_t sdalloc_pool_step_stats(sdalloc_pool_t* pool,
                                         sdalloc_step_stats_t* stats) noexcept {
  return guarded(__func__, [&] {
    sdalloc::PlannedArena& arena = sdalloc::detail::planned_of(pool_of(pool));
    fill_versioned(stats, "stats", "sdalloc_step_stats_t", kStepStatsFirstSize,
                   [&](sdalloc_step_stats_t& c) {
                     const sdalloc::PlannedArenaCounters counters = arena.counters();
                     c.has_plan = arena.has_plan();
                     c.in_step = arena.in_step();
                     c.arena_bytes = arena.planned_arena_size();
                     c.planned_events = arena.planned_events();
                     c.planned_allocations = counters.planned_allocations;
                     c.kept_allocations = counters.kept_allocations;
                     c.fallback_allocations = counters.fallback_allocations;
                     c.recorded_allocations = counters.recorded_allocations;
                     c.recorded_steps = counters.recorded_steps;
                     c.planned_steps = counters.planned_steps;
                     c.divergent_steps = counters.divergent_steps;
                     c.replans = counters.replans;
                     c.arena_failures = counters.arena_failures;
                     c.plans = arena.plan_count();
                   });
  });
}

// ==================================================================== statistics

sdalloc_status_t sdalloc_pool_stats(sdalloc_pool_t* pool, sdalloc_stats_t* stats) noexcept {
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    fill_versioned(stats, "stats", "sdalloc_stats_t", kStatsFirstSize, [&](sdalloc_stats_t& c) {
      const sdalloc::PoolStats s = handle_pool.stats();
      c.live_bytes = s.live_bytes;
      c.peak_live_bytes = s.peak_live_bytes;
      c.allocated_bytes = s.allocated_bytes;
      c.peak_allocated_bytes = s.peak_allocated_bytes;
      c.reserved_bytes = s.reserved_bytes;
      c.peak_reserved_bytes = s.peak_reserved_bytes;
      c.live_allocations = s.live_allocations;
      c.peak_live_allocations = s.peak_live_allocations;
      c.allocations = s.allocations;
      c.frees = s.frees;
      c.segments = s.segments;
      c.peak_segments = s.peak_segments;
      c.segment_allocations = s.segment_allocations;
      c.segment_releases = s.segment_releases;
      c.free_bytes = s.free_bytes;
      c.largest_free_block = s.largest_free_block;
      c.pending_free_bytes = s.pending_free_bytes;
      c.oom_retries = s.oom_retries;
      c.ooms = s.ooms;
      c.consolidations = s.consolidations;
      c.streams = s.streams;
      c.fragmentation = s.fragmentation();
      c.peak_overhead_ratio = s.peak_overhead_ratio();
      c.spare_bytes = s.spare_bytes;
    });
  });
}

sdalloc_status_t sdalloc_pool_mode(sdalloc_pool_t* pool, sdalloc_pool_mode_t* mode) noexcept {
  return guarded(__func__, [&] {
    require(mode != nullptr, "mode is NULL");
    pool_of(pool);  // checks the handle
    *mode = sdalloc::c_api_detail::c_mode_of(pool->stack->mode);
  });
}

sdalloc_status_t sdalloc_pool_reset_peak(sdalloc_pool_t* pool) noexcept {
  return guarded(__func__, [&] { pool_of(pool).reset_peak(); });
}

sdalloc_status_t sdalloc_memory_stat(sdalloc_pool_t* pool, const char* key,
                                     std::int64_t* value) noexcept {
  if (value != nullptr) *value = 0;
  return guarded(__func__, [&] {
    sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(key != nullptr, "key is NULL");
    require(value != nullptr, "value is NULL");
    const auto stats = sdalloc::to_memory_stats(handle_pool.stats());
    const auto found = stats.find(key);
    if (found == stats.end()) {
      throw sdalloc::InvalidArgument("unknown memory stat key '" + std::string(key) +
                                     "' (keys are those of torch.cuda.memory_stats(), e.g. "
                                     "'allocated_bytes.all.current')");
    }
    *value = found->second;
  });
}

const char* sdalloc_memory_stat_key(std::size_t index) noexcept {
  try {
    const std::vector<std::string>& keys = memory_stat_keys();
    return index < keys.size() ? keys[index].c_str() : nullptr;
  } catch (...) {
    return nullptr;  // no memory to build the list: the caller sees an empty one
  }
}

// ==================================================================== layout

sdalloc_status_t sdalloc_pool_layout(sdalloc_pool_t* pool, sdalloc_layout_t** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    const sdalloc::AnyPool& handle_pool = pool_of(pool);
    require(out != nullptr, "out is NULL");
    auto layout = std::make_unique<sdalloc_layout>();
    layout->layout = handle_pool.layout();
    *out = layout.release();
  });
}

std::size_t sdalloc_layout_segment_count(const sdalloc_layout_t* layout) noexcept {
  return layout == nullptr ? 0 : layout->layout.segments.size();
}

sdalloc_status_t sdalloc_layout_segment(const sdalloc_layout_t* layout, std::size_t segment,
                                        sdalloc_segment_info_t* out) noexcept {
  return guarded(__func__, [&] {
    const sdalloc::SegmentLayout& s = segment_of(layout, segment);
    fill_versioned(out, "out", "sdalloc_segment_info_t", kSegmentInfoFirstSize,
                   [&](sdalloc_segment_info_t& info) {
                     info.address = s.address;
                     info.size = s.size;
                     info.stream = s.stream.as_native<void>();
                     info.block_count = s.blocks.size();
                     info.huge = s.huge;
                     info.pinned = s.pinned;
                   });
  });
}

sdalloc_status_t sdalloc_layout_block(const sdalloc_layout_t* layout, std::size_t segment,
                                      std::size_t block, sdalloc_block_info_t* out) noexcept {
  return guarded(__func__, [&] {
    const sdalloc::SegmentLayout& s = segment_of(layout, segment);
    if (block >= s.blocks.size()) {
      throw sdalloc::InvalidArgument(
          "block index " + std::to_string(block) + " is past the last block of segment " +
          std::to_string(segment) + " (it has " + std::to_string(s.blocks.size()) + ")");
    }
    const sdalloc::BlockLayout& b = s.blocks[block];
    fill_versioned(out, "out", "sdalloc_block_info_t", kBlockInfoFirstSize,
                   [&](sdalloc_block_info_t& info) {
                     info.address = b.address;
                     info.size = b.size;
                     info.requested = b.requested;
                     info.state = static_cast<sdalloc_block_state_t>(b.state);
                   });
  });
}

void sdalloc_layout_destroy(sdalloc_layout_t* layout) noexcept { delete layout; }

// ==================================================================== event trace

sdalloc_status_t sdalloc_pool_trace_start(sdalloc_pool_t* pool, const char* path) noexcept {
  return guarded(__func__, [&] {
    pool_of(pool);
    require(path != nullptr, "path is NULL");
    pool->recorder.start(path);
  });
}

sdalloc_status_t sdalloc_pool_trace_stop(sdalloc_pool_t* pool, std::uint64_t* events) noexcept {
  if (events != nullptr) *events = 0;
  return guarded(__func__, [&] {
    pool_of(pool);
    const std::uint64_t written = pool->recorder.stop();
    if (events != nullptr) *events = written;
  });
}
