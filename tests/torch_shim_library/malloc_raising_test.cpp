// malloc_raising_test.cpp - libsdalloc_torch.so's raising allocation function, called as
// PyTorch's CUDAPluggableAllocator calls it (through a std::function over the pointer).
//
// The shim's configuration is per process and fixed by the first allocation, so the tests
// run in this order: a bad configuration first (no pool exists yet), then a good one.
#include <gtest/gtest.h>

#include <functional>
#include <new>
#include <stdexcept>
#include <string>

#include "sdalloc/torch_shim.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The allocation function as PyTorch stores it (CUDAPluggableAllocator's alloc_fn_).
const std::function<void*(std::size_t, int, cudaStream_t)> kAllocFn = sdalloc_torch_malloc_raising;

std::string message_of(std::size_t size, int device) {
  try {
    void* ptr = kAllocFn(size, device, nullptr);
    ADD_FAILURE() << "no exception, got " << ptr;
  } catch (const std::bad_alloc& e) {  // the base PyTorch's std::exception handler sees
    return e.what();
  }
  return "";
}

TEST(TorchShimMallocRaising, BadConfigurationThrowsNamingTheKey) {
  ASSERT_NE(sdalloc_torch_configure("backend:host,mode:bogus"), SDALLOC_SUCCESS);
  const std::string message = message_of(100, 0);
  EXPECT_NE(message.find("sdalloc: cannot allocate 100 bytes on device 0"), std::string::npos)
      << message;
  EXPECT_NE(message.find("mode must be"), std::string::npos) << message;
  EXPECT_EQ(message.find("out of memory"), std::string::npos) << message;
}

TEST(TorchShimMallocRaising, OutOfMemoryThrowsABadAllocWithSdallocsFigures) {
  ASSERT_EQ(sdalloc_torch_configure("backend:host,capacity:8MiB"), SDALLOC_SUCCESS);
  void* held = kAllocFn(3 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  const std::string message = message_of(16 * kMiB, 0);
  EXPECT_EQ(message.rfind("CUDA out of memory (sdalloc): cannot allocate 16777216 bytes on "
                          "device 0: ",
                          0),
            0U)
      << message;
  for (const char* figure : {"16777216", "live", "reserved", "largest free"}) {
    EXPECT_NE(message.find(figure), std::string::npos) << figure << " in: " << message;
  }
  // Catchable as std::exception too (PyTorch's last handler turns it into RuntimeError).
  EXPECT_THROW(kAllocFn(16 * kMiB, 0, nullptr), std::exception);
  // The pool is intact after the throw: the held block frees, and a fitting request works.
  sdalloc_torch_free(held, 3 * kMiB, 0, nullptr);
  void* fits = kAllocFn(6 * kMiB, 0, nullptr);
  EXPECT_NE(fits, nullptr);
  sdalloc_torch_free(fits, 6 * kMiB, 0, nullptr);
  EXPECT_EQ(kAllocFn(0, 0, nullptr), nullptr);  // zero bytes: nullptr, no exception
}

}  // namespace
