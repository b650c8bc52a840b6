// c_api_errors_test.cpp - the C API's error contract, checked from C++.
//
// tests/c_api/c_api_test.c covers every function from C. What C cannot check is here: that no
// entry point can throw (noexcept as seen from C++), that sdalloc_last_error() is per
// thread, that a C status and message are exactly the C++ error they come from, and that
// the API holds up under concurrent use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/policies/caching_pool.hpp"
#include "sdalloc/policies/virtual_memory_pool.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/host_virtual_memory.hpp"
#include "sdalloc/sdalloc.h"

namespace {

struct PoolDeleter {
  void operator()(sdalloc_pool_t* pool) const { sdalloc_pool_destroy(pool); }
};
using PoolHandle = std::unique_ptr<sdalloc_pool_t, PoolDeleter>;

PoolHandle make_pool(std::size_t capacity = 0) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.capacity = capacity;
  sdalloc_pool_t* pool = nullptr;
  EXPECT_EQ(sdalloc_pool_create(&config, &pool), SDALLOC_SUCCESS) << sdalloc_last_error();
  return PoolHandle(pool);
}

TEST(CApiErrors, NoEntryPointCanThrow) {
  sdalloc_pool_t* pool = nullptr;
  void* ptr = nullptr;
  std::size_t size = 0;
  std::int64_t value = 0;
  sdalloc_stats_t stats{};
  sdalloc_tensor_t tensor{};
  sdalloc_pool_config_t config{};
  EXPECT_TRUE(noexcept(sdalloc_last_error()));
  EXPECT_TRUE(noexcept(sdalloc_status_string(SDALLOC_SUCCESS)));
  EXPECT_TRUE(noexcept(sdalloc_version()));
  EXPECT_TRUE(noexcept(sdalloc_pool_config_init(&config)));
  EXPECT_TRUE(noexcept(sdalloc_pool_create(&config, &pool)));
  EXPECT_TRUE(noexcept(sdalloc_pool_destroy(pool)));
  EXPECT_TRUE(noexcept(sdalloc_malloc(pool, 1, nullptr, &ptr)));
  EXPECT_TRUE(noexcept(sdalloc_malloc_aligned(pool, 1, 1, nullptr, &ptr)));
  EXPECT_TRUE(noexcept(sdalloc_free(pool, ptr, nullptr)));
  EXPECT_TRUE(noexcept(sdalloc_record_stream(pool, ptr, nullptr)));
  EXPECT_TRUE(noexcept(sdalloc_allocation_size(pool, ptr, &size)));
  EXPECT_TRUE(noexcept(sdalloc_trim(pool, &size)));
  EXPECT_TRUE(noexcept(sdalloc_pool_stats(pool, &stats)));
  EXPECT_TRUE(noexcept(sdalloc_pool_reset_peak(pool)));
  sdalloc_step_stats_t steps{};
  EXPECT_TRUE(noexcept(sdalloc_pool_begin_step(pool, nullptr)));
  EXPECT_TRUE(noexcept(sdalloc_pool_end_step(pool)));
  EXPECT_TRUE(noexcept(sdalloc_pool_step_stats(pool, &steps)));
  EXPECT_TRUE(noexcept(sdalloc_memory_stat(pool, "num_ooms", &value)));
  EXPECT_TRUE(noexcept(sdalloc_dtype_bits(SDALLOC_DTYPE_FP32)));
  EXPECT_TRUE(noexcept(sdalloc_dtype_name(SDALLOC_DTYPE_FP32)));
  EXPECT_TRUE(noexcept(sdalloc_tensor_nbytes(SDALLOC_DTYPE_FP32, 0, nullptr, &size)));
  EXPECT_TRUE(
      noexcept(sdalloc_tensor_alloc(pool, SDALLOC_DTYPE_FP32, 0, nullptr, nullptr, &tensor)));
  EXPECT_TRUE(noexcept(sdalloc_tensor_free(pool, &tensor)));
}

TEST(CApiErrors, LastErrorIsPerThread) {
  PoolHandle pool = make_pool();
  ASSERT_EQ(sdalloc_malloc(pool.get(), 64, nullptr, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  const std::string mine = sdalloc_last_error();
  EXPECT_EQ(mine, "sdalloc_malloc: out is NULL");

  std::string seen_by_other_thread = "unset";
  std::string other_threads_error;
  std::thread other([&] {
    seen_by_other_thread = sdalloc_last_error();
    int on_stack = 0;
    EXPECT_EQ(sdalloc_free(pool.get(), &on_stack, nullptr), SDALLOC_ERROR_INVALID_POINTER);
    other_threads_error = sdalloc_last_error();
  });
  other.join();

  EXPECT_EQ(seen_by_other_thread, "");  // a new thread has no error yet
  EXPECT_NE(other_threads_error.find("sdalloc_free: "), std::string::npos);
  EXPECT_EQ(sdalloc_last_error(), mine);  // the other thread's failure did not touch ours
}

// The C message is the C++ exception's what(), prefixed with the C function's name, and
// the status follows the exception type. The C pool is the default one, a VirtualMemoryPool
// over host pages.
TEST(CApiErrors, StatusAndMessageAreTheCppErrorPrefixedWithTheFunction) {
  PoolHandle c_pool = make_pool();
  sdalloc::HostVirtualMemory memory;
  sdalloc::VirtualMemoryPool cpp_pool(memory);

  std::string cpp_oom;
  try {
    cpp_pool.allocate(SIZE_MAX);
  } catch (const sdalloc::OutOfMemory& e) {
    cpp_oom = e.what();
  }
  ASSERT_FALSE(cpp_oom.empty());
  void* ptr = nullptr;
  EXPECT_EQ(sdalloc_malloc(c_pool.get(), SIZE_MAX, nullptr, &ptr), SDALLOC_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(std::string(sdalloc_last_error()), "sdalloc_malloc: " + cpp_oom);

  std::string cpp_bad_alignment;
  try {
    cpp_pool.allocate(64, 3, sdalloc::kDefaultStream);
  } catch (const sdalloc::InvalidArgument& e) {
    cpp_bad_alignment = e.what();
  }
  ASSERT_FALSE(cpp_bad_alignment.empty());
  EXPECT_EQ(sdalloc_malloc_aligned(c_pool.get(), 64, 3, nullptr, &ptr),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(sdalloc_last_error()), "sdalloc_malloc_aligned: " + cpp_bad_alignment);

  int on_stack = 0;
  std::string cpp_foreign;
  try {
    cpp_pool.free(&on_stack);
  } catch (const sdalloc::InvalidPointer& e) {
    cpp_foreign = e.what();
  }
  ASSERT_FALSE(cpp_foreign.empty());
  EXPECT_EQ(sdalloc_free(c_pool.get(), &on_stack, nullptr), SDALLOC_ERROR_INVALID_POINTER);
  EXPECT_EQ(std::string(sdalloc_last_error()), "sdalloc_free: " + cpp_foreign);
}

TEST(CApiErrors, ConfigStructSizesFromTheFirstVersionToTheCurrentAreAccepted) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  // The first version ends with consolidate_when_empty; anything from there up to
  // sizeof (padding included) is a size some caller may legitimately have compiled.
  const std::size_t first = offsetof(sdalloc_pool_config_t, consolidate_when_empty) + sizeof(bool);
  for (std::size_t size : {first, sizeof config}) {
    config.struct_size = size;
    sdalloc_pool_t* pool = nullptr;
    EXPECT_EQ(sdalloc_pool_create(&config, &pool), SDALLOC_SUCCESS) << sdalloc_last_error();
    sdalloc_pool_destroy(pool);
  }
  config.struct_size = first - 1;
  sdalloc_pool_t* pool = nullptr;
  EXPECT_EQ(sdalloc_pool_create(&config, &pool), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(pool, nullptr);
}

TEST(CApiErrors, ConfigInitWritesNoMoreThanTheCallersStruct) {
  // A caller built against the first, shorter struct: the init writes its bytes and no more,
  // and the pool it creates has the defaults for every field the caller does not know.
  const std::size_t first = offsetof(sdalloc_pool_config_t, consolidate_when_empty) + sizeof(bool);
  constexpr unsigned char kGuard = 0xAB;
  std::vector<unsigned char> bytes(sizeof(sdalloc_pool_config_t) + 64, kGuard);
  auto* config = reinterpret_cast<sdalloc_pool_config_t*>(bytes.data());
  sdalloc_pool_config_init_sized(config, first);
  EXPECT_EQ(config->struct_size, first);
  for (std::size_t i = first; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], kGuard) << "byte " << i;
  sdalloc_pool_t* pool = nullptr;
  ASSERT_EQ(sdalloc_pool_create(config, &pool), SDALLOC_SUCCESS) << sdalloc_last_error();
  sdalloc_step_stats_t steps{};
  steps.struct_size = sizeof steps;
  EXPECT_EQ(sdalloc_pool_step_stats(pool, &steps), SDALLOC_ERROR_INVALID_ARGUMENT)
      << "the guard bytes past the caller's struct were read as planned = true";
  sdalloc_pool_destroy(pool);

  // A caller built against a newer header: this library fills what it knows.
  std::fill(bytes.begin(), bytes.end(), kGuard);
  sdalloc_pool_config_init_sized(config, bytes.size());
  EXPECT_EQ(config->struct_size, sizeof(sdalloc_pool_config_t));
  for (std::size_t i = sizeof(sdalloc_pool_config_t); i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], kGuard) << "byte " << i;
  }

  // Too small for struct_size itself, or no struct: nothing is written.
  std::fill(bytes.begin(), bytes.end(), kGuard);
  sdalloc_pool_config_init_sized(config, sizeof(std::size_t) - 1);
  for (unsigned char b : bytes) ASSERT_EQ(b, kGuard);
  sdalloc_pool_config_init_sized(nullptr, sizeof(sdalloc_pool_config_t));

  // The header's macro passes the caller's sizeof; the symbol (ctypes) writes the whole struct.
  sdalloc_pool_config_t by_macro;
  sdalloc_pool_config_init(&by_macro);
  EXPECT_EQ(by_macro.struct_size, sizeof by_macro);
  sdalloc_pool_config_t by_symbol;
  (sdalloc_pool_config_init)(&by_symbol);
  EXPECT_EQ(std::memcmp(&by_macro, &by_symbol, sizeof by_macro), 0);
}

TEST(CApiErrors, ConcurrentCallsOnOnePoolKeepCountsExact) {
  PoolHandle pool = make_pool();
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share the default stream, half have their own.
      auto* stream = reinterpret_cast<sdalloc_stream_t>(std::uintptr_t(t % 2 == 0 ? 0 : t));
      std::vector<void*> live;
      for (int i = 0; i < kRounds; ++i) {
        void* ptr = nullptr;
        const std::size_t size = 256 + std::size_t(i % 17) * 1000;
        if (sdalloc_malloc(pool.get(), size, stream, &ptr) != SDALLOC_SUCCESS) ++failures[t];
        live.push_back(ptr);
        if (i % 3 == 2) {
          for (void* p : live) {
            if (sdalloc_free(pool.get(), p, stream) != SDALLOC_SUCCESS) ++failures[t];
          }
          live.clear();
        }
      }
      for (void* p : live) {
        if (sdalloc_free(pool.get(), p, stream) != SDALLOC_SUCCESS) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;

  sdalloc_stats_t stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(sdalloc_pool_stats(pool.get(), &stats), SDALLOC_SUCCESS);
  EXPECT_EQ(stats.allocations, std::uint64_t{kThreads} * kRounds);
  EXPECT_EQ(stats.frees, std::uint64_t{kThreads} * kRounds);
  EXPECT_EQ(stats.live_bytes, 0U);
  EXPECT_EQ(stats.live_allocations, 0U);
  EXPECT_EQ(stats.streams, 3U);  // the default stream and streams 1 and 3
}

}  // namespace
