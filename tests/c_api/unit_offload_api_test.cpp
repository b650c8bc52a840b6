// unit_offload_api_test.cpp - sdalloc_transfer.h's unit offload and simulated device for C:
// a whole offload through the C functions (kernels check what they read), the errors and
// their messages, and describe()'s truncation.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sdalloc/sdalloc_transfer.h"

namespace {

std::string last_error() { return sdalloc_last_error(); }

struct Sim {
  Sim() {
    sdalloc_sim_device_config_t config;
    sdalloc_sim_device_config_init(&config);
    config.copy_bytes_per_second = 4e9;
    config.host_compute = false;
    EXPECT_EQ(sdalloc_sim_device_create(&config, &device), SDALLOC_SUCCESS);
  }
  ~Sim() { sdalloc_stream_device_destroy(device); }
  sdalloc_stream_device_t* device = nullptr;
};

TEST(UnitOffloadCApi, AnOffloadThroughTheCFunctionsReadsTheRightBytes) {
  Sim sim;
  sdalloc_unit_offload_config_t config;
  sdalloc_unit_offload_config_init(&config);
  EXPECT_TRUE(config.pin);
  EXPECT_EQ(config.budget, 0u);
  config.budget = 3 << 20;
  sdalloc_unit_offload_t* offload = nullptr;
  ASSERT_EQ(sdalloc_unit_offload_create(sim.device, &config, &offload), SDALLOC_SUCCESS);
  constexpr std::size_t kUnits = 8, kBytes = 1 << 20;
  for (std::size_t u = 0; u < kUnits; ++u) {
    std::size_t id = 99;
    ASSERT_EQ(sdalloc_unit_offload_add_unit(offload, kBytes, 0, &id), SDALLOC_SUCCESS);
    EXPECT_EQ(id, u);
  }
  ASSERT_EQ(sdalloc_unit_offload_seal(offload), SDALLOC_SUCCESS);
  std::vector<void*> host(kUnits);
  for (std::size_t u = 0; u < kUnits; ++u) {
    ASSERT_EQ(sdalloc_unit_offload_host_image(offload, u, &host[u]), SDALLOC_SUCCESS);
    std::memset(host[u], static_cast<int>(u + 1), kBytes);
  }
  sdalloc_stream_t stream = nullptr;
  ASSERT_EQ(sdalloc_stream_device_compute_stream(sim.device, &stream), SDALLOC_SUCCESS);
  for (int step = 0; step < 4; ++step) {
    ASSERT_EQ(sdalloc_unit_offload_begin_step(offload, stream), SDALLOC_SUCCESS);
    for (std::size_t u = 0; u < kUnits; ++u) {
      ASSERT_EQ(sdalloc_unit_offload_enter(offload, u), SDALLOC_SUCCESS) << last_error();
      void* image = nullptr;
      ASSERT_EQ(sdalloc_unit_offload_device_image(offload, u, &image), SDALLOC_SUCCESS);
      ASSERT_EQ(sdalloc_sim_launch(sim.device, 1e-5, 1e-4, image, host[u], kBytes),
                SDALLOC_SUCCESS);
    }
    ASSERT_EQ(sdalloc_unit_offload_end_step(offload), SDALLOC_SUCCESS);
  }
  ASSERT_EQ(sdalloc_stream_device_synchronize(sim.device), SDALLOC_SUCCESS);
  sdalloc_sim_device_stats_t sim_stats;
  sim_stats.struct_size = sizeof sim_stats;
  ASSERT_EQ(sdalloc_sim_device_stats(sim.device, &sim_stats), SDALLOC_SUCCESS);
  EXPECT_EQ(sim_stats.check_failures, 0u);
  EXPECT_EQ(sim_stats.kernels, 4 * kUnits);
  EXPECT_EQ(sim_stats.pageable_copies, 0u);
  sdalloc_unit_offload_stats_t stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(sdalloc_unit_offload_stats(offload, &stats), SDALLOC_SUCCESS);
  EXPECT_EQ(stats.planned_steps, 3u);
  EXPECT_EQ(stats.units, kUnits);
  EXPECT_GT(stats.streamed_units, 0u);
  EXPECT_LE(stats.region_bytes, config.budget);
  EXPECT_EQ(stats.planned, 1);
  std::uint64_t version = 0;
  int planned = 0;
  ASSERT_EQ(sdalloc_unit_offload_layout(offload, &version, &planned), SDALLOC_SUCCESS);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(planned, 1);
  std::size_t needed = 0;
  ASSERT_EQ(sdalloc_unit_offload_describe(offload, nullptr, 0, &needed), SDALLOC_SUCCESS);
  std::string text(needed, '\0');
  ASSERT_EQ(sdalloc_unit_offload_describe(offload, text.data(), needed, nullptr), SDALLOC_SUCCESS);
  EXPECT_NE(text.find("predicted step"), std::string::npos) << text;
  char cut[8];
  ASSERT_EQ(sdalloc_unit_offload_describe(offload, cut, sizeof cut, nullptr), SDALLOC_SUCCESS);
  EXPECT_EQ(std::string(cut), text.substr(0, 7));
  sdalloc_unit_offload_destroy(offload);
}

TEST(UnitOffloadCApi, ErrorsSayWhatIsWrong) {
  Sim sim;
  sdalloc_unit_offload_config_t config;
  sdalloc_unit_offload_config_init(&config);
  sdalloc_unit_offload_t* offload = nullptr;
  EXPECT_EQ(sdalloc_unit_offload_create(nullptr, &config, &offload),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("device is NULL"), std::string::npos);
  config.struct_size = 3;
  EXPECT_EQ(sdalloc_unit_offload_create(sim.device, &config, &offload),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("call sdalloc_unit_offload_config_init first"), std::string::npos);
  sdalloc_unit_offload_config_init(&config);
  EXPECT_EQ(sdalloc_unit_offload_create(sim.device, &config, &offload),
            SDALLOC_ERROR_INVALID_ARGUMENT);  // budget 0
  EXPECT_NE(last_error().find("the budget is 0 bytes"), std::string::npos) << last_error();
  EXPECT_EQ(offload, nullptr);
  config.budget = 1 << 20;
  ASSERT_EQ(sdalloc_unit_offload_create(sim.device, &config, &offload), SDALLOC_SUCCESS);
  std::size_t id = 0;
  EXPECT_EQ(sdalloc_unit_offload_add_unit(offload, 2 << 20, 0, &id),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("the budget must hold the largest unit"), std::string::npos);
  ASSERT_EQ(sdalloc_unit_offload_add_unit(offload, 1024, 0, &id), SDALLOC_SUCCESS);
  EXPECT_EQ(sdalloc_unit_offload_begin_step(offload, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("before seal"), std::string::npos) << last_error();
  ASSERT_EQ(sdalloc_unit_offload_seal(offload), SDALLOC_SUCCESS);
  int dummy = 0;
  EXPECT_EQ(sdalloc_unit_offload_begin_step(offload, &dummy), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("but the copies are ordered before stream"), std::string::npos);
  EXPECT_EQ(sdalloc_unit_offload_enter(offload, 0), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("outside begin_step"), std::string::npos);
  EXPECT_EQ(sdalloc_unit_offload_enter(nullptr, 0), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_unit_offload_stats(offload, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_sim_launch(nullptr, 0, 0, nullptr, nullptr, 0), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_sim_launch(sim.device, -1, 0, nullptr, nullptr, 0),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  sdalloc_unit_offload_destroy(offload);
  sdalloc_unit_offload_destroy(nullptr);
  sdalloc_stream_device_destroy(nullptr);
}

}  // namespace
