// preload_fuzzer.cpp - libFuzzer target: the CPU drop-in's entry points, as the process's own
// malloc.
//
// The drop-in's sources are linked into this executable, so its malloc family is the
// process's: libFuzzer's, libstdc++'s and this harness's allocations go through it too, as
// in a preloaded program. That is why this target is built without ASan (which must own
// malloc itself; preset "fuzz-preload": UBSan, the library coverage-guided). The mode and the
// other settings come from SDALLOC_PRELOAD_CONF, read when the first large request of the
// process builds the runtime; scripts/fuzz.sh runs the target once per mode (preload_pool,
// preload_vmm, preload_planned) with a small threshold and capacity, so that inputs cross the
// threshold and fill the pool.
//
// An input is up to 64 calls - malloc, calloc (overflowing products too), realloc and
// reallocarray (to 0, across the threshold both ways, beyond any pool), memalign,
// aligned_alloc, posix_memalign (alignments of every kind: 0, odd, powers of two up to 2^63),
// valloc, pvalloc, free, malloc_usable_size and the step marks - on sizes around the
// threshold, and everything left is freed at the end. After every call:
//  - a failure is nullptr with errno ENOMEM or EINVAL (posix_memalign: the code, the pointer
//    untouched) and a refused realloc leaves the old block live and unchanged; free keeps
//    errno;
//  - a block is aligned as asked, malloc_usable_size covers its size, it overlaps no live
//    block, calloc's is zero, realloc's keeps the old contents, and a block below the
//    threshold is glibc's (sdalloc_preload_owns);
//  - the step marks answer 0 only in mode planned, and only in order (a step ends after 12
//    calls);
//  - every 8th call and at the end: the pool's check_invariants() holds and every live block
//    keeps its tag bytes (so damage done in between is still seen).
#include <fuzzer/FuzzedDataProvider.h>
#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>

#include "core/bits.hpp"
#include "preload/inside_sdalloc.hpp"
#include "preload/preload_runtime.hpp"
#include "sdalloc/preload.h"

namespace {

using sdalloc::preload::InsideScope;
using sdalloc::preload::Runtime;

[[noreturn]] void broken(const char* what, std::size_t a = 0, std::size_t b = 0) {
  std::fprintf(stderr, "preload_fuzzer: %s (%zu, %zu)\n", what, a, b);
  std::abort();
}
void require(bool ok, const char* what, std::size_t a = 0, std::size_t b = 0) {
  if (!ok) broken(what, a, b);
}

struct Block {
  std::size_t size;
  std::uint8_t tag;
};

// Tag bytes: the first byte of every 4 KiB of the first 64 KiB, of every 256 KiB after it,
// and the last byte, so that a check costs little and touches few pages even for a block
// of many MiB.
std::size_t next_mark(std::size_t i) {
  return i < (std::size_t{64} << 10) ? i + 4096 : i + (std::size_t{256} << 10);
}
std::uint8_t mark(std::uint8_t tag, std::size_t i) {
  return static_cast<std::uint8_t>(tag + i / 4096);
}

void fill(void* ptr, std::size_t size, std::uint8_t tag) {
  auto* bytes = static_cast<std::uint8_t*>(ptr);
  if (size == 0) return;
  for (std::size_t i = 0; i < size - 1; i = next_mark(i)) bytes[i] = mark(tag, i);
  bytes[size - 1] = static_cast<std::uint8_t>(tag ^ 0x5a);
}
// Whether [ptr, ptr + size) still holds the tags `fill(ptr, filled, tag)` wrote, up to size
// (a realloc's new block keeps the old contents up to the smaller size).
bool holds(const void* ptr, std::size_t size, std::size_t filled, std::uint8_t tag) {
  const auto* bytes = static_cast<const std::uint8_t*>(ptr);
  if (size == 0) return true;
  // The last byte filled holds the end tag, not a mark.
  const std::size_t marks_end = size == filled ? size - 1 : size;
  for (std::size_t i = 0; i < marks_end; i = next_mark(i)) {
    if (bytes[i] != mark(tag, i)) return false;
  }
  return size != filled || bytes[size - 1] == static_cast<std::uint8_t>(tag ^ 0x5a);
}
// Whether a live block still holds all of its tags.
bool intact(std::uintptr_t address, const Block& block) {
  return holds(reinterpret_cast<const void*>(address), block.size, block.size, block.tag);
}

// The calls a step may hold before the harness ends it.
constexpr int kStepRequests = 12;
// The largest block an input keeps live (64 of them at most).
constexpr std::size_t kKeptLimit = std::size_t{8} << 20;

// Whether [ptr, ptr + size) is zero: all of the first 256 KiB, then the first 256 bytes
// of every 64 KiB (memcmp, not a byte loop the coverage instrumentation would trace).
bool zero(const void* ptr, std::size_t size) {
  static const std::uint8_t kZeros[4096] = {};
  const auto* bytes = static_cast<const std::uint8_t*>(ptr);
  for (std::size_t i = 0; i < size;) {
    const bool whole = i < (std::size_t{256} << 10);
    const std::size_t n = std::min(size - i, whole ? sizeof kZeros : std::size_t{256});
    if (std::memcmp(bytes + i, kZeros, n) != 0) return false;
    i += whole ? n : std::size_t{64} << 10;
  }
  return size == 0 || bytes[size - 1] == 0;
}

class Harness {
 public:
  explicit Harness(const std::uint8_t* data, std::size_t size) : in_(data, size) {
    threshold_ = sdalloc_preload_threshold();
    require(threshold_ > 0, "the drop-in is off: SDALLOC_PRELOAD_CONF was refused");
    const auto& config = Runtime::built()->config();
    planned_ = config.mode == sdalloc::preload::Mode::kPlanned;
    scale_ = config.capacity == 0 ? std::size_t{1} << 20 : config.capacity / 16;
  }

  void run() {
    for (int op = 0; op < 64 && in_.remaining_bytes() > 0; ++op) {
      step();
      if (op % 8 == 7) check_all();
    }
    check_all();
    for (auto& [address, block] : live_) std::free(reinterpret_cast<void*>(address));
    live_.clear();
    if (in_step_) require(sdalloc_preload_end_step() == 0, "end_step at the end");
  }

 private:
  // Sizes around the threshold: zero, small (glibc's), just at it, a few times it, up to a
  // quarter of the pool's capacity (scale_ is a sixteenth of it: the pool fills within an
  // input, and a smaller pool means fewer pages touched per input), and beyond every pool
  // (2^48, SIZE_MAX).
  std::size_t size() {
    switch (in_.ConsumeIntegralInRange(0, 9)) {
      case 0:
        return 0;
      case 1:
        return in_.ConsumeIntegralInRange<std::size_t>(1, threshold_ - 1);
      case 2:
        return threshold_ + in_.ConsumeIntegralInRange<std::size_t>(0, 64);
      case 3:
        return threshold_ - in_.ConsumeIntegralInRange<std::size_t>(1, 64);
      case 4:
        return in_.ConsumeIntegralInRange<std::size_t>(threshold_, 4 * threshold_);
      case 5:
        return in_.ConsumeIntegralInRange<std::size_t>(threshold_, std::max(threshold_, scale_));
      case 6:
        return in_.ConsumeIntegralInRange<std::size_t>(scale_, 4 * scale_);
      case 7:
        return (std::size_t{1} << 48) + in_.ConsumeIntegral<std::uint16_t>();
      case 8:
        return SIZE_MAX - in_.ConsumeIntegral<std::uint16_t>();
      default:
        return in_.ConsumeIntegralInRange<std::size_t>(0, scale_);
    }
  }
  std::size_t alignment() {
    switch (in_.ConsumeIntegralInRange(0, 4)) {
      case 0:
        return std::size_t{1} << in_.ConsumeIntegralInRange(0, 24);
      case 1:
        return std::size_t{1} << in_.ConsumeIntegralInRange(25, 63);
      case 2:
        return 0;
      case 3:
        return in_.ConsumeIntegralInRange<std::size_t>(1, 1 << 20);  // often not 2^k
      default:
        return SIZE_MAX - in_.ConsumeIntegral<std::uint8_t>();
    }
  }
  // A live block's address, or 0 when there is none.
  std::uintptr_t pick() {
    if (live_.empty()) return 0;
    auto it = live_.begin();
    std::advance(it, in_.ConsumeIntegralInRange<std::size_t>(0, live_.size() - 1));
    return it->first;
  }

  // A new block of `size` bytes asked with `align` (0: not checked): checks it and books
  // it. One larger than kKeptLimit (the system allocator's, when it could map it) is freed
  // at once, so that the inputs' blocks stay within the fuzzer's memory limit.
  void added(void* ptr, std::size_t size, std::size_t align, bool zeroed = false) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    require(align == 0 || address % align == 0, "misaligned block", address, align);
    require(address % 16 == 0, "block below malloc's 16 B alignment", address);
    require(malloc_usable_size(ptr) >= size, "usable size below the request", size);
    require(size >= threshold_ || sdalloc_preload_owns(ptr) == 0,
            "the pool served a request below the threshold", size);
    require_disjoint(address, size);
    if (size > kKeptLimit) {
      std::free(ptr);
      return;
    }
    if (zeroed) require(zero(ptr, size), "calloc's block is not zero", address, size);
    const auto tag = static_cast<std::uint8_t>(next_tag_++);
    fill(ptr, size, tag);
    live_[address] = Block{size, tag};
  }
  // [address, address + size) overlaps no live block (a zero-size block counts as 1 byte).
  void require_disjoint(std::uintptr_t address, std::size_t size) {
    auto next = live_.lower_bound(address);
    require(next == live_.end() || next->first >= address + (size == 0 ? 1 : size),
            "overlaps the next live block", address, size);
    if (next != live_.begin()) {
      const auto prev = std::prev(next);
      require(prev->first + (prev->second.size == 0 ? 1 : prev->second.size) <= address,
              "overlaps the previous live block", address, prev->first);
    }
  }
  void failed(const char* call, std::size_t size) {
    require(errno == ENOMEM || errno == EINVAL, call, size, static_cast<std::size_t>(errno));
  }

  void step() {
    errno = 0;
    // A step of many requests makes end_step's exact search (the planner's own fuzzer's
    // subject) take most of the time: steps here end after kStepRequests calls.
    if (in_step_ && ++step_calls_ > kStepRequests) {
      require(sdalloc_preload_end_step() == 0, "end_step of a long step");
      in_step_ = false;
    }
    switch (in_.ConsumeIntegralInRange(0, 12)) {
      case 0: {
        const std::size_t n = size();
        if (void* p = std::malloc(n); p != nullptr)
          added(p, n, 16);
        else
          failed("malloc", n);
        break;
      }
      case 1: {
        const std::size_t count = in_.ConsumeBool() ? 1 : size();
        const std::size_t n = size();
        std::size_t total = 0;
        const bool overflows = __builtin_mul_overflow(count, n, &total);
        void* p = std::calloc(count, n);
        if (overflows) {
          require(p == nullptr && errno == ENOMEM, "calloc overflow not refused", count, n);
        } else if (p != nullptr) {
          added(p, total, 16, true);
        } else {
          failed("calloc", total);
        }
        break;
      }
      case 2:
      case 3:
        realloc_one(in_.ConsumeBool());
        break;
      case 4:
      case 5: {
        const std::uintptr_t address = pick();
        if (address == 0) break;
        require(intact(address, live_[address]), "a block lost its tags before its free", address);
        live_.erase(address);
        errno = 4321;
        std::free(reinterpret_cast<void*>(address));
        require(errno == 4321, "free changed errno", address);
        break;
      }
      case 6: {
        const std::size_t align = alignment();
        const std::size_t n = size();
        // Through pointers: glibc declares both alloc_align, so a direct call with an
        // alignment that is not a power of two would be UB in this harness, not a test.
        static void* (*const volatile memalign_call)(std::size_t, std::size_t) = memalign;
        static void* (*const volatile aligned_alloc_call)(std::size_t, std::size_t) =
            std::aligned_alloc;
        void* p = in_.ConsumeBool() ? memalign_call(align, n) : aligned_alloc_call(align, n);
        if (p != nullptr)
          added(p, n, effective(align));
        else
          failed("memalign", n);
        break;
      }
      case 7: {
        const std::size_t align = alignment();
        const std::size_t n = size();
        void* p = &next_tag_;  // a sentinel: a refused call leaves it
        const int rc = posix_memalign(&p, align, n);
        const bool valid = sdalloc::is_power_of_two(align) && align % sizeof(void*) == 0;
        if (!valid) {
          require(rc == EINVAL && p == &next_tag_, "posix_memalign accepted a bad alignment",
                  align);
        } else if (rc == 0) {
          added(p, n, align);
        } else {
          require(rc == ENOMEM && p == &next_tag_, "posix_memalign's failure", n, rc);
        }
        break;
      }
      case 8: {
        const std::size_t n = size();
        const bool page_rounded = in_.ConsumeBool();
        void* p = page_rounded ? pvalloc(n) : valloc(n);
        if (p != nullptr) {
          // pvalloc's request is the size rounded up to whole pages (which may cross the
          // threshold); it succeeded, so the rounding did not overflow.
          added(p, page_rounded ? (n == 0 ? 4096 : sdalloc::round_up(n, 4096)) : n, 4096);
        } else {
          failed("valloc", n);
        }
        break;
      }
      case 9: {
        const std::uintptr_t address = pick();
        if (address != 0) {
          require(malloc_usable_size(reinterpret_cast<void*>(address)) >= live_[address].size,
                  "usable size shrank", address);
        }
        require(malloc_usable_size(nullptr) == 0, "usable size of nullptr");
        std::free(nullptr);
        break;
      }
      case 10: {
        const int rc = sdalloc_preload_begin_step();
        require((rc == 0) == (planned_ && !in_step_), "begin_step answered", rc, in_step_);
        if (rc == 0) {
          in_step_ = true;
          step_calls_ = 0;
        }
        break;
      }
      case 11: {
        const int rc = sdalloc_preload_end_step();
        require((rc == 0) == (planned_ && in_step_), "end_step answered", rc, in_step_);
        if (rc == 0) in_step_ = false;
        break;
      }
      default:
        check_all();
        break;
    }
  }

  // memalign's and aligned_alloc's reading of an alignment: 0 is 1, the rest round up to a
  // power of two (glibc's); 0 when the result need not be checked (an alignment so large
  // that only a failure is possible).
  static std::size_t effective(std::size_t align) {
    if (align <= 1) return 1;
    if (align > (std::size_t{1} << 62)) return sdalloc::is_power_of_two(align) ? align : 0;
    return std::size_t{1} << (64 - __builtin_clzll(align - 1));
  }

  void realloc_one(bool array) {
    const std::uintptr_t address = in_.ConsumeBool() ? pick() : 0;
    void* old = reinterpret_cast<void*>(address);
    const Block block = address == 0 ? Block{0, 0} : live_[address];
    std::size_t n = size();
    void* p = nullptr;
    if (array) {
      const std::size_t count = in_.ConsumeIntegralInRange<std::size_t>(0, 3);
      std::size_t total = 0;
      const bool overflows = __builtin_mul_overflow(count, n, &total);
      p = reallocarray(old, count, n);
      if (overflows) {
        require(p == nullptr && errno == ENOMEM, "reallocarray overflow not refused", count, n);
        return;  // the old block stays as it was
      }
      n = total;
    } else {
      p = std::realloc(old, n);
    }
    if (address != 0 && n == 0 && p == nullptr) {
      live_.erase(address);  // realloc to 0 frees
      return;
    }
    if (p == nullptr) {
      failed("realloc", n);
      if (address != 0) {
        require(intact(address, block), "a refused realloc changed the block");
      }
      return;
    }
    if (address != 0) {
      const std::size_t kept = std::min(block.size, n);
      require(holds(p, kept, block.size, block.tag), "realloc lost the contents", kept);
      live_.erase(address);
    }
    added(p, n, 16);
  }

  void check_all() {
    for (const auto& [address, block] : live_) {
      require(intact(address, block), "a live block lost its tags", address, block.size);
    }
    // The pool's own books, read the way the entry points call into it: with this thread
    // inside sdalloc, so what check_invariants allocates goes to glibc.
    InsideScope inside;
    try {
      Runtime::built()->pool().check_invariants();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "preload_fuzzer: check_invariants: %s\n", e.what());
      std::abort();
    }
    inside.keep_errno();
  }

  FuzzedDataProvider in_;
  std::size_t threshold_ = 0;
  std::size_t scale_ = 0;
  bool planned_ = false;
  bool in_step_ = false;
  int step_calls_ = 0;
  std::map<std::uintptr_t, Block> live_;
  unsigned next_tag_ = 1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Harness(data, size).run();
  return 0;
}
