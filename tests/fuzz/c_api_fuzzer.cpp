// c_api_fuzzer.cpp - libFuzzer target: sequences of C API calls on one pool, checked
// against a shadow map of what should be live.
//
// The input picks a pool (any mode: auto, pool, vmm or planned, over host memory; a small
// capacity and small segments so that growth, release, consolidation, page moves and
// out-of-memory all happen within a few operations; retired fields set at random, which
// must change nothing; now and then an invalid configuration, which must be refused with
// INVALID_ARGUMENT), checks that the pool built is the mode asked for, and then makes up to
// 64 calls: malloc, aligned malloc (bad alignments too), free (of live pointers, of freed
// ones, of pointers inside a block), record_stream, allocation_size, trim, begin/end step,
// step stats, pool stats, memory_stat, layout, tensors. The shadow map holds every live allocation
// with a tag written into its bytes:
//  - a call's status is the one the contract names (e.g. INVALID_POINTER for a double free,
//    OUT_OF_MEMORY only for a request the capacity cannot hold);
//  - live blocks never overlap, keep their tags and their sizes;
//  - the pool's live bytes and live allocation count equal the shadow's.
// A broken rule aborts (a finding). The pool is destroyed at the end of every input.
#include <fuzzer/FuzzedDataProvider.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "sdalloc/sdalloc.h"

namespace {

[[noreturn]] void broken(const char* what, sdalloc_status_t status = SDALLOC_SUCCESS) {
  std::fprintf(stderr, "c_api_fuzzer: %s (status %s, last error '%s')\n", what,
               sdalloc_status_string(status), sdalloc_last_error());
  std::abort();
}
void require(bool ok, const char* what, sdalloc_status_t status = SDALLOC_SUCCESS) {
  if (!ok) broken(what, status);
}

struct Block {
  std::size_t size;
  std::uint8_t tag;
  sdalloc_stream_t stream;
};

class Shadow {
 public:
  void add(void* p, std::size_t size, sdalloc_stream_t stream) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto next = blocks_.lower_bound(a);
    require(next == blocks_.end() || next->first >= a + size, "a new block overlaps a live one");
    if (next != blocks_.begin()) {
      const auto prev = std::prev(next);
      require(prev->first + prev->second.size <= a, "a new block overlaps a live one");
    }
    const auto tag = static_cast<std::uint8_t>(++tags_);
    std::memset(p, tag, size < 64 ? size : 64);
    blocks_.emplace(a, Block{size, tag, stream});
    live_bytes_ += size;
  }
  void check(std::uintptr_t a, const Block& b) const {
    const auto* p = reinterpret_cast<const std::uint8_t*>(a);
    for (std::size_t i = 0; i < (b.size < 64 ? b.size : 64); ++i) {
      require(p[i] == b.tag, "a live block's bytes changed");
    }
  }
  void remove(std::uintptr_t a) {
    check(a, blocks_.at(a));
    live_bytes_ -= blocks_.at(a).size;
    blocks_.erase(a);
  }
  // The index-th live block (modulo the count); blocks_.end() when none is live.
  std::map<std::uintptr_t, Block>::iterator pick(std::size_t index) {
    if (blocks_.empty()) return blocks_.end();
    return std::next(blocks_.begin(), static_cast<long>(index % blocks_.size()));
  }
  std::map<std::uintptr_t, Block>& blocks() { return blocks_; }
  std::size_t live_bytes() const { return live_bytes_; }

 private:
  std::map<std::uintptr_t, Block> blocks_;
  std::size_t live_bytes_ = 0;
  std::uint32_t tags_ = 0;
};

sdalloc_stream_t stream_of(std::uint8_t n) {
  return reinterpret_cast<sdalloc_stream_t>(static_cast<std::uintptr_t>(n % 3) * 0x100);
}

void check_stats(sdalloc_pool_t* pool, Shadow& shadow) {
  sdalloc_stats_t stats{};
  stats.struct_size = sizeof stats;
  const sdalloc_status_t s = sdalloc_pool_stats(pool, &stats);
  require(s == SDALLOC_SUCCESS, "pool_stats failed", s);
  require(stats.live_bytes == shadow.live_bytes(), "live bytes differ from the shadow's");
  require(stats.live_allocations == shadow.blocks().size(), "live count differs from the shadow's");
  require(stats.peak_live_bytes >= stats.live_bytes, "peak below current");
  require(stats.reserved_bytes >= stats.allocated_bytes, "allocated above reserved");
  for (auto& [a, b] : shadow.blocks()) shadow.check(a, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  const bool wild = in.ConsumeIntegralInRange<int>(0, 15) == 0;  // a raw, maybe bad config
  const std::size_t granule = std::size_t{4096} << in.ConsumeIntegralInRange<int>(0, 4);
  if (wild) {
    config.capacity = in.ConsumeIntegral<std::uint32_t>();
    config.segment_granularity = in.ConsumeIntegral<std::uint32_t>();
    config.min_segment_size = in.ConsumeIntegral<std::uint32_t>();
    config.huge_threshold = in.ConsumeIntegral<std::uint32_t>();
    config.initial_reservation = in.ConsumeIntegral<std::uint16_t>() * std::size_t{4096};
    config.max_plans = in.ConsumeIntegral<std::uint8_t>();
    config.replan_after_divergent_steps = in.ConsumeIntegral<std::uint8_t>();
    config.resource = static_cast<sdalloc_resource_kind_t>(in.ConsumeIntegralInRange<int>(0, 2));
    config.small_pool_limit = in.ConsumeIntegral<std::uint32_t>();
    config.small_granularity = in.ConsumeIntegral<std::uint32_t>();
  } else {
    config.capacity =
        in.ConsumeBool() ? 0 : granule * in.ConsumeIntegralInRange<std::size_t>(1, 64);
    config.segment_granularity = granule;
    config.min_segment_size = granule * in.ConsumeIntegralInRange<std::size_t>(1, 4);
    config.huge_threshold = granule * in.ConsumeIntegralInRange<std::size_t>(1, 32);
    config.initial_reservation = in.ConsumeBool() ? granule : 0;
    config.max_plans = in.ConsumeIntegralInRange<std::size_t>(1, 3);
    config.replan_after_divergent_steps = in.ConsumeIntegralInRange<std::size_t>(1, 3);
    // A small pool (segments of small_granularity while it holds less than the limit), or
    // none; the granularity a power of two from 4 KiB up to the segment granularity.
    config.small_pool_limit =
        in.ConsumeBool() ? 0 : granule * in.ConsumeIntegralInRange<std::size_t>(1, 64);
    config.small_granularity = std::size_t{4096} << in.ConsumeIntegralInRange<int>(
                                   0, std::countr_zero(granule / std::size_t{4096}));
  }
  config.release_cached_before_growth = in.ConsumeBool();
  config.consolidate_when_empty = in.ConsumeBool();
  // Retired in 0.2: accepted, warned about once, without effect.
  config.keep_spare_pages = in.ConsumeBool();
  config.grow_arena = in.ConsumeBool();
  config.cut_free_ends = in.ConsumeBool();
  config.planned = in.ConsumeBool();
  // Every mode the C API builds over host memory; in a wild configuration any value the
  // enum's bits can hold (ASYNC and the unnamed ones are refused).
  config.mode = static_cast<sdalloc_pool_mode_t>(in.ConsumeIntegralInRange<int>(0, wild ? 7 : 3));
  if (!wild && (config.mode == SDALLOC_MODE_POOL || config.mode == SDALLOC_MODE_VMM)) {
    config.planned = false;  // planned with another mode is refused
  }
  // A node limit ends each step's planning (the default 1 s clock would let one input take
  // a second): the same run on every execution. 64 nodes, not 512: the search itself is the
  // planner fuzzer's, and replaying a grown corpus (1,750 inputs) took 4.5 CPU s with 512,
  // 3.7 with 64 (medians of 3, interleaved).
  config.planner_max_search_nodes = 64;
  // Keep each input cheap: no more than 4 MiB of memory, whatever the configuration says.
  if (config.capacity == 0 || config.capacity > (std::size_t{4} << 20)) {
    config.capacity = std::size_t{4} << 20;
  }
  sdalloc_pool_t* pool = nullptr;
  sdalloc_status_t s = sdalloc_pool_create(&config, &pool);
  if (s != SDALLOC_SUCCESS) {
    require(s == SDALLOC_ERROR_INVALID_ARGUMENT || s == SDALLOC_ERROR_OUT_OF_MEMORY,
            "pool_create failed with an unexpected status", s);
    require(wild, "a valid configuration was refused", s);
    require(pool == nullptr, "a failed create returned a pool");
    return 0;
  }
  // The pool built is the mode asked for; auto is vmm where the memory maps pages.
  const bool planned = config.planned || config.mode == SDALLOC_MODE_PLANNED;
  sdalloc_pool_mode_t built = SDALLOC_MODE_AUTO;
  s = sdalloc_pool_mode(pool, &built);
  require(s == SDALLOC_SUCCESS, "pool_mode failed", s);
  if (planned) {
    require(built == SDALLOC_MODE_PLANNED, "a planned configuration built another pool");
  } else if (config.mode == SDALLOC_MODE_AUTO) {
    const bool pages = config.resource == SDALLOC_RESOURCE_HOST;
    require(built == (pages ? SDALLOC_MODE_VMM : SDALLOC_MODE_POOL), "auto built the wrong pool");
  } else {
    require(built == config.mode, "the pool built is not the mode asked for");
  }
  Shadow shadow;
  std::vector<sdalloc_tensor_t> tensors;
  bool in_step = false;
  for (int op = 0; op < 64 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
      case 1:
      case 2: {  // malloc
        const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(0, 3 * granule);
        const sdalloc_stream_t stream = stream_of(in.ConsumeIntegral<std::uint8_t>());
        void* p = nullptr;
        s = sdalloc_malloc(pool, bytes, stream, &p);
        if (s == SDALLOC_SUCCESS && bytes > 0) {
          require(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "bad pointer");
          shadow.add(p, bytes, stream);
        } else if (s == SDALLOC_SUCCESS) {
          require(p == nullptr, "malloc(0) returned a pointer");
        } else {
          require(s == SDALLOC_ERROR_OUT_OF_MEMORY, "malloc failed but not out of memory", s);
        }
        break;
      }
      case 3: {  // aligned malloc, alignments good and bad
        const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(1, granule);
        const std::size_t alignment = in.ConsumeBool()
                                          ? std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 16)
                                          : in.ConsumeIntegral<std::uint16_t>();
        const sdalloc_stream_t stream = stream_of(in.ConsumeIntegral<std::uint8_t>());
        void* p = nullptr;
        s = sdalloc_malloc_aligned(pool, bytes, alignment, stream, &p);
        const bool good = alignment != 0 && (alignment & (alignment - 1)) == 0;
        if (s == SDALLOC_SUCCESS) {
          require(good, "a bad alignment was accepted");
          require(reinterpret_cast<std::uintptr_t>(p) % alignment == 0, "misaligned pointer");
          shadow.add(p, bytes, stream);
        } else {
          require(good ? s == SDALLOC_ERROR_OUT_OF_MEMORY : s == SDALLOC_ERROR_INVALID_ARGUMENT,
                  "aligned malloc failed with the wrong status", s);
        }
        break;
      }
      case 4:
      case 5: {  // free a live block, on its stream or another
        const auto it = shadow.pick(in.ConsumeIntegral<std::uint16_t>());
        if (it == shadow.blocks().end()) break;
        void* p = reinterpret_cast<void*>(it->first);
        const sdalloc_stream_t stream =
            in.ConsumeBool() ? it->second.stream : stream_of(in.ConsumeIntegral<std::uint8_t>());
        shadow.remove(it->first);
        s = sdalloc_free(pool, p, stream);
        require(s == SDALLOC_SUCCESS, "free of a live block failed", s);
        for (sdalloc_tensor_t& t : tensors) {
          if (t.data == p) t.data = nullptr;  // freed as a plain block: its tensor_free is a no-op
        }
        break;
      }
      case 6: {  // free of a pointer that is not live: inside a block, or freed already
        const auto it = shadow.pick(in.ConsumeIntegral<std::uint16_t>());
        if (it == shadow.blocks().end()) {
          static int not_ours;
          s = sdalloc_free(pool, &not_ours, nullptr);
        } else {
          s = sdalloc_free(pool, reinterpret_cast<char*>(it->first) + 256, it->second.stream);
        }
        require(s == SDALLOC_ERROR_INVALID_POINTER, "free of a bad pointer not refused", s);
        break;
      }
      case 7: {  // record_stream and allocation_size
        const auto it = shadow.pick(in.ConsumeIntegral<std::uint16_t>());
        if (it == shadow.blocks().end()) break;
        void* p = reinterpret_cast<void*>(it->first);
        s = sdalloc_record_stream(pool, p, stream_of(in.ConsumeIntegral<std::uint8_t>()));
        require(s == SDALLOC_SUCCESS, "record_stream failed", s);
        std::size_t n = 0;
        s = sdalloc_allocation_size(pool, p, &n);
        require(s == SDALLOC_SUCCESS && n == it->second.size, "allocation_size is wrong", s);
        break;
      }
      case 8: {  // trim
        std::size_t released = 0;
        s = sdalloc_trim(pool, in.ConsumeBool() ? &released : nullptr);
        require(s == SDALLOC_SUCCESS, "trim failed", s);
        break;
      }
      case 9: {  // begin or end a step
        s = in_step
                ? sdalloc_pool_end_step(pool)
                : sdalloc_pool_begin_step(pool, stream_of(in.ConsumeIntegralInRange<int>(0, 1)));
        if (planned) {
          require(s == SDALLOC_SUCCESS, "a step call on a planned pool failed", s);
          in_step = !in_step;
        } else {
          require(s == SDALLOC_ERROR_INVALID_ARGUMENT, "a step call on a caching pool", s);
        }
        break;
      }
      case 10: {  // step stats
        sdalloc_step_stats_t stats{};
        stats.struct_size = sizeof stats;
        s = sdalloc_pool_step_stats(pool, &stats);
        if (planned) {
          require(s == SDALLOC_SUCCESS && stats.in_step == in_step, "step stats are wrong", s);
          require(stats.plans <= config.max_plans, "more plans than max_plans");
        } else {
          require(s == SDALLOC_ERROR_INVALID_ARGUMENT, "step stats of a caching pool", s);
        }
        break;
      }
      case 11: {  // statistics
        check_stats(pool, shadow);
        const char* key = sdalloc_memory_stat_key(in.ConsumeIntegralInRange<std::size_t>(0, 80));
        std::int64_t value = 0;
        s = sdalloc_memory_stat(pool, key != nullptr ? key : "no.such.key", &value);
        require((key != nullptr) == (s == SDALLOC_SUCCESS), "memory_stat status is wrong", s);
        if (in.ConsumeBool()) require(sdalloc_pool_reset_peak(pool) == SDALLOC_SUCCESS, "reset");
        break;
      }
      case 12: {  // layout: every segment and block readable
        sdalloc_layout_t* layout = nullptr;
        s = sdalloc_pool_layout(pool, &layout);
        require(s == SDALLOC_SUCCESS, "layout failed", s);
        sdalloc_layout_destroy(layout);
        break;
      }
      case 13: {  // a tensor
        const std::int32_t ndim = in.ConsumeIntegralInRange<std::int32_t>(0, 4);
        std::int64_t dims[4] = {};
        for (std::int32_t d = 0; d < ndim; ++d)
          dims[d] = in.ConsumeIntegralInRange<std::int64_t>(-1, 40);
        const auto dtype = static_cast<sdalloc_dtype_t>(in.ConsumeIntegralInRange<int>(0, 13));
        sdalloc_tensor_t t;
        s = sdalloc_tensor_alloc(pool, dtype, ndim, dims, stream_of(0), &t);
        if (s == SDALLOC_SUCCESS) {
          if (t.data != nullptr) shadow.add(t.data, t.nbytes, t.stream);
          tensors.push_back(t);
        } else {
          require(t.data == nullptr, "a failed tensor_alloc left data");
          require(s == SDALLOC_ERROR_INVALID_ARGUMENT || s == SDALLOC_ERROR_OUT_OF_MEMORY,
                  "tensor_alloc failed with an unexpected status", s);
        }
        break;
      }
      default: {  // free a tensor
        if (tensors.empty()) break;
        sdalloc_tensor_t& t = tensors.back();
        if (t.data != nullptr) shadow.remove(reinterpret_cast<std::uintptr_t>(t.data));
        s = sdalloc_tensor_free(pool, &t);
        require(s == SDALLOC_SUCCESS && t.data == nullptr, "tensor_free failed", s);
        tensors.pop_back();
        break;
      }
    }
  }
  check_stats(pool, shadow);
  if (in_step) require(sdalloc_pool_end_step(pool) == SDALLOC_SUCCESS, "last end_step failed");
  sdalloc_pool_destroy(pool);
  return 0;
}
