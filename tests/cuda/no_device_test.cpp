// What a program built with CUDA does where there is no driver or no device: it starts
// (this binary links no libcuda.so, see check_no_libcuda.cmake), the runtime queries answer
// "no", and every CUDA entry point throws a CudaError that names the object, the CUDA call
// and CUDA's error. Arguments that are wrong anyway are rejected before CUDA is asked.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_device_check.hpp"
#include "sdalloc/cuda/cuda_async_resource.hpp"
#include "sdalloc/cuda/cuda_error.hpp"
#include "sdalloc/cuda/cuda_resource.hpp"
#include "sdalloc/cuda/cuda_stream_events.hpp"
#include "sdalloc/cuda/cuda_virtual_memory.hpp"
#include "sdalloc/cuda/device_resource.hpp"
#include "sdalloc/cuda/pinned_host_resource.hpp"
#include "sdalloc/cuda/runtime.hpp"
#include "support/test_support.hpp"

namespace sdalloc::cuda {
namespace {

using test::Contains;

TEST(CudaRuntime, ReportsNoDeviceCleanly) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  EXPECT_FALSE(available());
  EXPECT_EQ(device_count(), 0);
  const std::string reason = unavailable_reason();
  EXPECT_FALSE(reason.empty());
  EXPECT_TRUE(Contains(reason, "cudaGetDeviceCount failed") || reason == "no CUDA device")
      << reason;
  // Asking again gives the same answer: the failure leaves no state behind.
  EXPECT_EQ(unavailable_reason(), reason);
  // 0 without a driver; an old or GPU-less driver still reports its version. Never throws.
  EXPECT_GE(driver_version(), 0);
}

TEST(CudaRuntime, KnowsItsOwnVersion) {
  EXPECT_GE(runtime_version(), 11020) << "cudaMallocAsync pools need CUDA 11.2";
}

TEST(CudaRuntime, ReportsDevicesWhenPresent) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  EXPECT_TRUE(available());
  EXPECT_GE(device_count(), 1);
  EXPECT_EQ(unavailable_reason(), "");
  EXPECT_GE(driver_version(), 11020);
}

// Runs `make`, expecting the CudaError of a machine without a device.
void expect_no_device_error(const std::string& what, const std::function<void()>& make) {
  try {
    make();
    ADD_FAILURE() << what << ": constructed without a CUDA device";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call, "cudaGetDeviceCount") << what;
    EXPECT_NE(e.code, 0) << what;
    EXPECT_TRUE(Contains(e.what(), "cudaGetDeviceCount failed")) << what;
    EXPECT_TRUE(Contains(e.what(), "no usable CUDA driver or device here")) << what;
  }
}

TEST(CudaWithoutDevice, EveryConstructorThrowsCudaError) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  expect_no_device_error("CudaResource", [] { CudaResource r(0); });
  expect_no_device_error("CudaAsyncResource", [] { CudaAsyncResource r(0); });
  expect_no_device_error("PinnedHostResource", [] { PinnedHostResource r; });
  expect_no_device_error("CudaStreamEvents", [] { CudaStreamEvents e(0); });
  expect_no_device_error("CudaVirtualMemory", [] { CudaVirtualMemory vm(0); });
  expect_no_device_error("device_backend", [] { (void)device_backend(0); });
  std::vector<char> buffer(4096);
  expect_no_device_error("PinnedHostRegistration",
                         [&] { PinnedHostRegistration pin(buffer.data(), buffer.size()); });
  for (DeviceResourceKind kind : {DeviceResourceKind::kCuda, DeviceResourceKind::kCudaAsync,
                                  DeviceResourceKind::kPinnedHost}) {
    expect_no_device_error(std::string(to_string(kind)),
                           [&] { (void)make_device_resource(kind, 0); });
  }
  expect_no_device_error("make_device_virtual_memory", [] { (void)make_device_virtual_memory(0); });
}

TEST(CudaWithoutDevice, ErrorNamesTheObject) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  try {
    CudaResource r(3);
    FAIL() << "constructed without a device";
  } catch (const CudaError& e) {
    EXPECT_TRUE(Contains(e.what(), "cuda(3): cudaGetDeviceCount failed: cudaError"));
  }
  try {
    CudaVirtualMemory vm(1);
    FAIL() << "constructed without a device";
  } catch (const CudaError& e) {
    EXPECT_TRUE(Contains(e.what(), "cuda-vm(device 1)"));
  }
}

TEST(CudaWithoutDevice, ErrorsAreSdallocErrors) {
  SDALLOC_REQUIRE_NO_CUDA_DEVICE();
  EXPECT_THROW(CudaResource r(0), sdalloc::Error);
}

TEST(PinnedHostRegistration, RejectsNullOrEmptyRangesBeforeAskingCuda) {
  std::vector<char> buffer(64);
  try {
    PinnedHostRegistration pin(nullptr, 64);
    FAIL() << "registered a null pointer";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "a null pointer"));
  }
  EXPECT_THROW(PinnedHostRegistration(buffer.data(), 0), InvalidArgument);
}

TEST(CudaDevices, DeviceOutOfRangeIsInvalidArgument) {
  SDALLOC_REQUIRE_CUDA_DEVICE();
  const int count = device_count();
  try {
    CudaResource r(count);
    FAIL() << "constructed on a device that does not exist";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "does not exist"));
  }
  EXPECT_THROW(CudaResource r(-1), InvalidArgument);
  EXPECT_THROW(CudaAsyncResource r(count), InvalidArgument);
  EXPECT_THROW(CudaStreamEvents e(count), InvalidArgument);
  EXPECT_THROW(CudaVirtualMemory vm(count), InvalidArgument);
}

TEST(DeviceResourceKind, NamesRoundTrip) {
  for (DeviceResourceKind kind : {DeviceResourceKind::kCuda, DeviceResourceKind::kCudaAsync,
                                  DeviceResourceKind::kPinnedHost}) {
    EXPECT_EQ(parse_device_resource_kind(to_string(kind)), kind);
  }
  EXPECT_EQ(to_string(DeviceResourceKind::kCudaAsync), "cuda_async");
}

TEST(DeviceResourceKind, UnknownNameListsTheAcceptedOnes) {
  try {
    (void)parse_device_resource_kind("cudaMalloc");
    FAIL() << "accepted an unknown name";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "unknown CUDA resource 'cudaMalloc'"));
    EXPECT_TRUE(Contains(e.what(), "cuda, cuda_async, pinned_host"));
  }
  EXPECT_THROW((void)parse_device_resource_kind(""), InvalidArgument);
}

}  // namespace
}  // namespace sdalloc::cuda
