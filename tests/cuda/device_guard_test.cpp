// device_guard_test.cpp - detail::DeviceGuard against fake runtime calls: it switches and
// restores the device, throws for a real failure, and stays quiet while the runtime is
// tearing down at exit (a free's guard must not throw before the free's own shutdown check).
#include <gtest/gtest.h>

#include <vector>

#include "cuda_call.hpp"
#include "sdalloc/cuda/cuda_error.hpp"

namespace sdalloc::cuda::detail {
namespace {

cudaError_t g_get_result = cudaSuccess;
int g_current = 0;
std::vector<int> g_sets;

cudaError_t fake_get(int* device) {
  *device = g_current;
  return g_get_result;
}
cudaError_t fake_set(int device) {
  g_sets.push_back(device);
  g_current = device;
  return cudaSuccess;
}

class DeviceGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_get_result = cudaSuccess;
    g_current = 1;
    g_sets.clear();
  }
  DeviceCalls calls_{&fake_get, &fake_set};
};

TEST_F(DeviceGuardTest, SwitchesToTheDeviceAndRestoresTheCallersOne) {
  {
    const DeviceGuard guard(0, "test", calls_);
    EXPECT_EQ(g_current, 0);
  }
  EXPECT_EQ(g_current, 1);
  EXPECT_EQ(g_sets, (std::vector<int>{0, 1}));
}

TEST_F(DeviceGuardTest, TheCurrentDeviceCostsNoSwitch) {
  { const DeviceGuard guard(1, "test", calls_); }
  EXPECT_TRUE(g_sets.empty());
}

TEST_F(DeviceGuardTest, ARuntimeTearingDownIsNotAnError) {
  for (const cudaError_t rc : {cudaErrorCudartUnloading, cudaErrorContextIsDestroyed}) {
    g_get_result = rc;
    EXPECT_NO_THROW({ const DeviceGuard guard(0, "free at exit", calls_); });
    EXPECT_TRUE(g_sets.empty()) << "no device switch while the runtime goes away";
  }
}

TEST_F(DeviceGuardTest, OtherFailuresThrowNamingTheCall) {
  g_get_result = cudaErrorInvalidValue;
  try {
    const DeviceGuard guard(0, "cuda(0)", calls_);
    ADD_FAILURE() << "no exception";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda(0): cudaGetDevice failed"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sdalloc::cuda::detail
