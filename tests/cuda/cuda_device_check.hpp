// cuda_device_check.hpp - skipping device tests where there is no device, and the reverse.
#pragma once

#include <gtest/gtest.h>

#include "sdalloc/cuda/runtime.hpp"

// Skips the current test, saying why, when CUDA cannot be used here.
#define SDALLOC_REQUIRE_CUDA_DEVICE()                                                   \
  do {                                                                                  \
    if (!::sdalloc::cuda::available()) {                                                \
      GTEST_SKIP() << "needs a CUDA device: " << ::sdalloc::cuda::unavailable_reason(); \
    }                                                                                   \
  } while (false)

// Skips the current test when a device IS present: it checks the behaviour without one.
#define SDALLOC_REQUIRE_NO_CUDA_DEVICE()                                               \
  do {                                                                                 \
    if (::sdalloc::cuda::available()) GTEST_SKIP() << "a CUDA device is present here"; \
  } while (false)
