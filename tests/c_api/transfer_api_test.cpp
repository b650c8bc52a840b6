// transfer_api_test.cpp - sdalloc_transfer.h: copies and their handles, offload steps, and
// each error as a status with a message (no exception crosses).
#include "sdalloc/sdalloc_transfer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace {

struct Engine {
  sdalloc_transfer_engine_t* e = nullptr;
  Engine() {
    sdalloc_transfer_config_t c;
    sdalloc_transfer_config_init(&c);
    EXPECT_EQ(sdalloc_transfer_engine_create(&c, &e), SDALLOC_SUCCESS) << sdalloc_last_error();
  }
  ~Engine() { sdalloc_transfer_engine_destroy(e); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
};

TEST(TransferCApi, CopiesWaitQueryAndCancel) {
  const Engine engine;
  std::vector<char> src(5000, 'x'), dst(5000, 0);
  sdalloc_transfer_t t = 0;
  ASSERT_EQ(sdalloc_transfer_copy(engine.e, SDALLOC_COPY_HOST_TO_DEVICE, dst.data(), src.data(),
                                  src.size(), &t),
            SDALLOC_SUCCESS);
  EXPECT_NE(t, 0u);
  int done = -1;
  EXPECT_EQ(sdalloc_transfer_query(engine.e, t, &done), SDALLOC_SUCCESS);
  EXPECT_EQ(done, 0);  // queued
  EXPECT_EQ(sdalloc_transfer_wait(engine.e, t), SDALLOC_SUCCESS);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(sdalloc_transfer_wait(engine.e, t), SDALLOC_ERROR_INVALID_POINTER);  // released
  ASSERT_EQ(
      sdalloc_transfer_copy(engine.e, SDALLOC_COPY_DEVICE_TO_HOST, dst.data(), src.data(), 64, &t),
      SDALLOC_SUCCESS);
  int cancelled = 0;
  EXPECT_EQ(sdalloc_transfer_cancel(engine.e, t, &cancelled), SDALLOC_SUCCESS);
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(sdalloc_transfer_wait(engine.e, t), SDALLOC_ERROR_INTERNAL);
  EXPECT_TRUE(sdalloc::test::Contains(sdalloc_last_error(), "cancelled"));
  sdalloc_transfer_stats_t stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(sdalloc_transfer_stats(engine.e, &stats), SDALLOC_SUCCESS);
  EXPECT_EQ(stats.requests, 2u);
  EXPECT_EQ(stats.cancelled_requests, 1u);
  EXPECT_EQ(stats.calls, 1u);
}

TEST(TransferCApi, ErrorsAreStatusesWithMessages) {
  const Engine engine;
  sdalloc_transfer_t t = 0;
  char byte = 0;
  EXPECT_EQ(sdalloc_transfer_copy(nullptr, SDALLOC_COPY_HOST_TO_DEVICE, &byte, &byte, 1, &t),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  sdalloc_copy_kind_t bogus{};  // C lets any int travel in an enum
  const int seven = 7;
  std::memcpy(&bogus, &seven, sizeof bogus);
  EXPECT_EQ(sdalloc_transfer_copy(engine.e, bogus, &byte, &byte, 1, &t),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  void* block = nullptr;
  ASSERT_EQ(sdalloc_transfer_staging_alloc(engine.e, 4096, &block), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_transfer_staging_free(engine.e, block), SDALLOC_SUCCESS);
  std::vector<char> dst(4096);
  EXPECT_EQ(
      sdalloc_transfer_copy(engine.e, SDALLOC_COPY_HOST_TO_DEVICE, dst.data(), block, 4096, &t),
      SDALLOC_ERROR_INVALID_POINTER);
  EXPECT_TRUE(sdalloc::test::Contains(sdalloc_last_error(), "freed"));
  EXPECT_EQ(sdalloc_transfer_staging_free(engine.e, block), SDALLOC_ERROR_INVALID_POINTER);
  sdalloc_transfer_config_t bad;
  sdalloc_transfer_config_init(&bad);
  bad.struct_size = 3;
  sdalloc_transfer_engine_t* none = nullptr;
  EXPECT_EQ(sdalloc_transfer_engine_create(&bad, &none), SDALLOC_ERROR_INVALID_ARGUMENT);
  sdalloc_transfer_config_init(&bad);
  bad.staging_budget = 1;
  EXPECT_EQ(sdalloc_transfer_engine_create(&bad, &none), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
}

// The inits write no more than the caller's struct: an older, shorter struct gets its own
// fields (and struct_size says how many bytes), nothing past them.
template <class Config, class Init>
void expect_init_stays_within(Init init, std::size_t first) {
  constexpr unsigned char kGuard = 0xAB;
  std::vector<unsigned char> bytes(sizeof(Config) + 64, kGuard);
  auto* config = reinterpret_cast<Config*>(bytes.data());
  init(config, first);
  EXPECT_EQ(config->struct_size, first);
  for (std::size_t i = first; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], kGuard) << "byte " << i;
  std::fill(bytes.begin(), bytes.end(), kGuard);
  init(config, bytes.size());  // a newer caller: this library fills what it knows
  EXPECT_EQ(config->struct_size, sizeof(Config));
  for (std::size_t i = sizeof(Config); i < bytes.size(); ++i) ASSERT_EQ(bytes[i], kGuard) << i;
  std::fill(bytes.begin(), bytes.end(), kGuard);
  init(config, sizeof(std::size_t) - 1);  // cannot even hold struct_size: nothing written
  for (const unsigned char b : bytes) ASSERT_EQ(b, kGuard);
  init(nullptr, sizeof(Config));
}

TEST(TransferCApi, ConfigInitsWriteNoMoreThanTheCallersStruct) {
  expect_init_stays_within<sdalloc_transfer_config_t>(
      [](sdalloc_transfer_config_t* c, std::size_t n) { sdalloc_transfer_config_init_sized(c, n); },
      offsetof(sdalloc_transfer_config_t, chunk_bytes));
  expect_init_stays_within<sdalloc_offload_config_t>(
      [](sdalloc_offload_config_t* c, std::size_t n) { sdalloc_offload_config_init_sized(c, n); },
      offsetof(sdalloc_offload_config_t, prefetch));
  // The macro passes the caller's sizeof; the plain symbol (ctypes) this library's.
  sdalloc_transfer_config_t full;
  (sdalloc_transfer_config_init)(&full);
  EXPECT_EQ(full.struct_size, sizeof full);
  EXPECT_GT(full.staging_budget, 0u);
}

TEST(TransferCApi, OffloadStepsServeEqualWeightsUnderTheBudget) {
  const Engine engine;
  sdalloc_offload_config_t c;
  sdalloc_offload_config_init(&c);
  c.budget = 2 * 4096;
  sdalloc_offload_t* off = nullptr;
  ASSERT_EQ(sdalloc_offload_create(engine.e, &c, &off), SDALLOC_SUCCESS) << sdalloc_last_error();
  std::vector<std::vector<char>> weights;
  for (int i = 0; i < 5; ++i) weights.emplace_back(4096, static_cast<char>('a' + i));
  for (const auto& w : weights) {
    size_t id = 99;
    ASSERT_EQ(sdalloc_offload_add_weight(off, w.data(), w.size(), &id), SDALLOC_SUCCESS);
  }
  std::vector<char> too_big(3 * 4096);
  size_t id = 0;
  EXPECT_EQ(sdalloc_offload_add_weight(off, too_big.data(), too_big.size(), &id),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(sdalloc::test::Contains(sdalloc_last_error(), "largest single weight"));
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(sdalloc_offload_begin_step(off), SDALLOC_SUCCESS);
    for (size_t w = 0; w < weights.size(); ++w) {
      void* device = nullptr;
      ASSERT_EQ(sdalloc_offload_acquire(off, &w, 1, &device), SDALLOC_SUCCESS);
      EXPECT_EQ(std::string(static_cast<const char*>(device), 4096),
                std::string(weights[w].data(), 4096));
    }
    ASSERT_EQ(sdalloc_offload_end_step(off), SDALLOC_SUCCESS);
  }
  sdalloc_offload_stats_t stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(sdalloc_offload_stats(off, &stats), SDALLOC_SUCCESS);
  EXPECT_LE(stats.peak_resident_bytes, c.budget);
  EXPECT_EQ(stats.planned_steps, 2u);
  void* device = nullptr;
  EXPECT_EQ(sdalloc_offload_acquire(off, &id, 1, &device), SDALLOC_ERROR_INVALID_ARGUMENT);
  sdalloc_offload_destroy(off);
}

}  // namespace
