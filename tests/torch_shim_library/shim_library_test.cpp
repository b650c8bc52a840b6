// shim_library_test.cpp - libsdalloc_torch.so as PyTorch calls it: the raising allocation
// function (through a std::function over the pointer, as CUDAPluggableAllocator stores it)
// and the refusal of a stream that is capturing a CUDA graph (a fake capture query stands
// in for cudaStreamIsCapturing); the CUDA offload entry points' argument errors and their
// refusal where no CUDA device is usable; the shim's cap, changed after its pool exists.
//
// The shim's configuration is per process and fixed by the first allocation: the bad
// configuration's test runs in a process of its own (a death test in the "threadsafe"
// style, which runs this program again for that test alone), the others all use one good
// one, so that they pass in any order (--gtest_shuffle), alone or together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "sdalloc/sdalloc.h"
#include "sdalloc/torch_shim.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
// Every test configures the same, so that any of them may run first, alone or in one process;
// the first allocation of the process fixes the configuration (later configure calls fail,
// whichever device's pool that allocation made), so it is configured once.
constexpr const char* kConfiguration = "backend:host,capacity:64MiB";
bool configured() {
  static const bool done = sdalloc_torch_configure(kConfiguration) == SDALLOC_SUCCESS;
  return done;
}

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

// In a fresh process (no pool, nothing configured): the child prints the message and
// exits 0 only if the configuration was refused and the allocation's error names the key
// and is no out-of-memory error.
TEST(TorchShimMallocRaising, BadConfigurationThrowsNamingTheKey) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const bool refused = sdalloc_torch_configure("backend:host,mode:bogus") != SDALLOC_SUCCESS;
        const std::string message = message_of(100, 0);
        std::fprintf(stderr, "refused %d, message: %s\n", refused ? 1 : 0, message.c_str());
        std::exit(refused && message.find("out of memory") == std::string::npos ? 0 : 1);
      },
      testing::ExitedWithCode(0),
      "refused 1, message: sdalloc: cannot allocate 100 bytes on device 0.*mode must be");
}

TEST(TorchShimMallocRaising, OutOfMemoryThrowsABadAllocWithSdallocsFigures) {
  ASSERT_TRUE(configured()) << sdalloc_torch_last_error();
  void* held = kAllocFn(3 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  const std::string message = message_of(96 * kMiB, 0);
  EXPECT_EQ(message.rfind("CUDA out of memory (sdalloc): cannot allocate 100663296 bytes on "
                          "device 0: ",
                          0),
            0U)
      << message;
  for (const char* figure : {"100663296", "live", "reserved", "largest free"}) {
    EXPECT_NE(message.find(figure), std::string::npos) << figure << " in: " << message;
  }
  // Catchable as std::exception too (PyTorch's last handler turns it into RuntimeError).
  EXPECT_THROW(kAllocFn(96 * kMiB, 0, nullptr), std::exception);
  // The pool is intact after the throw: the held block frees, and a fitting request works.
  sdalloc_torch_free(held, 3 * kMiB, 0, nullptr);
  void* fits = kAllocFn(6 * kMiB, 0, nullptr);
  EXPECT_NE(fits, nullptr);
  sdalloc_torch_free(fits, 6 * kMiB, 0, nullptr);
  EXPECT_EQ(kAllocFn(0, 0, nullptr), nullptr);  // zero bytes: nullptr, no exception
}

// The shim's cap (capacity, memory_fraction) bounds the default pool, which maps pages on
// host memory; lowered after the pool exists, it still refuses what would pass it, keeps what
// is held, and raised again serves as before.
TEST(TorchShimHostPool, AFractionSetAfterThePoolExistsCapsIt) {
  ASSERT_TRUE(configured()) << sdalloc_torch_last_error();
  constexpr int kDevice = 1;  // a pool of its own, whatever the other tests did to device 0's
  const auto stats = [=] {
    sdalloc_stats_t out{};
    out.struct_size = sizeof(out);
    EXPECT_EQ(sdalloc_pool_stats(sdalloc_torch_pool(kDevice), &out), SDALLOC_SUCCESS);
    return out;
  };
  const auto take = [=](std::size_t mib) { return kAllocFn(mib * kMiB, kDevice, nullptr); };
  const auto give = [=](void* ptr, std::size_t mib) {
    sdalloc_torch_free(ptr, mib * kMiB, kDevice, nullptr);
  };
  void* held = take(20);
  ASSERT_NE(held, nullptr);
  std::fill_n(static_cast<char*>(held), 20 * kMiB, '\x5a');
  ASSERT_EQ(sdalloc_torch_set_memory_fraction(0.5, kDevice), SDALLOC_SUCCESS);  // 32 MiB
  EXPECT_THROW(take(16), std::bad_alloc);
  EXPECT_EQ(stats().live_bytes, 20 * kMiB) << "the refusal changed nothing";
  void* fits = take(8);
  EXPECT_NE(fits, nullptr);
  give(fits, 8);
  // Below what is held (28 MiB: the 8 MiB stay mapped): held pages serve, no new ones come.
  ASSERT_EQ(sdalloc_torch_set_memory_fraction(0.25, kDevice), SDALLOC_SUCCESS);  // 16 MiB
  void* from_held = take(4);
  EXPECT_NE(from_held, nullptr);
  give(from_held, 4);
  EXPECT_THROW(take(12), std::bad_alloc) << "12 MiB need pages beyond the cap";
  ASSERT_EQ(sdalloc_torch_set_memory_fraction(1.0, kDevice), SDALLOC_SUCCESS);
  void* large = take(40);
  EXPECT_NE(large, nullptr);
  give(large, 40);
  give(held, 20);
}

// A stream the fake capture query says is capturing.
cudaStream_t capturing_stream() { return reinterpret_cast<cudaStream_t>(0xC0); }
int fake_capture_query(cudaStream_t stream) { return stream == capturing_stream() ? 1 : 0; }

TEST(TorchShimGraphCapture, ACapturingStreamIsRefusedAndItsFreesAreNeverReused) {
  ASSERT_TRUE(configured()) << sdalloc_torch_last_error();
  const cudaStream_t other = reinterpret_cast<cudaStream_t>(0x51);
  void* before = kAllocFn(kMiB, 0, other);  // made before the capture, freed during it
  ASSERT_NE(before, nullptr);
  sdalloc_torch_set_capture_query_for_testing(fake_capture_query);

  std::string message;
  try {
    kAllocFn(kMiB, 0, capturing_stream());
    ADD_FAILURE() << "served a capturing stream";
  } catch (const std::bad_alloc& e) {
    message = e.what();
  }
  for (const char* part :
       {"is capturing a CUDA graph", "sdalloc.torch.mempool()", "reduce-overhead"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
  }
  EXPECT_EQ(sdalloc_torch_malloc(kMiB, 0, capturing_stream()), nullptr);  // MemPool's path
  EXPECT_NE(std::string(sdalloc_torch_last_error()).find("capturing a CUDA graph"),
            std::string::npos);

  const std::size_t quarantined = sdalloc_torch_quarantined_bytes();
  sdalloc_torch_free(before, kMiB, 0, capturing_stream());
  EXPECT_GE(sdalloc_torch_quarantined_bytes(), quarantined + kMiB);
  sdalloc_torch_set_capture_query_for_testing(nullptr);  // the capture is over

  // Other streams are served as before, and never get the quarantined block back.
  std::vector<void*> after;
  for (int i = 0; i < 4; ++i) {
    void* ptr = kAllocFn(kMiB, 0, other);
    ASSERT_NE(ptr, nullptr);
    after.push_back(ptr);
  }
  EXPECT_EQ(std::find(after.begin(), after.end(), before), after.end());
  for (void* ptr : after) sdalloc_torch_free(ptr, kMiB, 0, other);
}

// ---- weight offload on a CUDA device -------------------------------------------------

std::string last_error() { return sdalloc_last_error(); }

TEST(TorchShimCudaOffload, WithoutADeviceTheEngineIsRefusedSayingWhy) {
  sdalloc_transfer_config_t config;
  sdalloc_transfer_config_init(&config);
  sdalloc_transfer_engine_t* engine = nullptr;
  const sdalloc_status_t status = sdalloc_torch_transfer_engine_create_cuda(&config, 0, &engine);
  if (status == SDALLOC_SUCCESS) {  // a device is here: its path is the device checks' job
    sdalloc_transfer_engine_destroy(engine);
    GTEST_SKIP() << "a CUDA device is present here";
  }
  EXPECT_EQ(status, SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(engine, nullptr);
  const char* expected =
      sdalloc_torch_has_cuda() != 0 ? "no CUDA device to offload to: " : "built without CUDA";
  EXPECT_NE(last_error().find(expected), std::string::npos) << last_error();
  // A device index that cannot exist is refused the same way, never dereferenced.
  EXPECT_EQ(sdalloc_torch_transfer_engine_create_cuda(&config, 64, &engine),
            SDALLOC_ERROR_INVALID_ARGUMENT);
}

TEST(TorchShimCudaOffload, ArgumentErrorsAreRefusedWithAMessage) {
  sdalloc_transfer_config_t config;
  sdalloc_transfer_config_init(&config);
  sdalloc_transfer_engine_t* engine = nullptr;
  EXPECT_EQ(sdalloc_torch_transfer_engine_create_cuda(&config, 0, nullptr),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("out is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(sdalloc_torch_transfer_engine_create_cuda(nullptr, 0, &engine),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("config is NULL"), std::string::npos) << last_error();
  sdalloc_transfer_config_t stale = config;
  stale.struct_size = 8;
  EXPECT_EQ(sdalloc_torch_transfer_engine_create_cuda(&stale, 0, &engine),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("call sdalloc_transfer_config_init first"), std::string::npos)
      << last_error();

  // The offloader: a NULL engine, and an engine on the host backend, are refused.
  sdalloc_offload_config_t options;
  sdalloc_offload_config_init(&options);
  options.budget = 4 * kMiB;
  sdalloc_offload_t* offload = nullptr;
  EXPECT_EQ(sdalloc_torch_offload_create_cuda(nullptr, &options, 0, nullptr, &offload),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("engine is NULL"), std::string::npos) << last_error();
  ASSERT_EQ(sdalloc_transfer_engine_create(&config, &engine), SDALLOC_SUCCESS);
  EXPECT_EQ(sdalloc_torch_offload_create_cuda(engine, &options, 0, nullptr, &offload),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(offload, nullptr);
  const char* expected =
      sdalloc_torch_has_cuda() != 0 ? "not on the CUDA backend" : "built without CUDA";
  EXPECT_NE(last_error().find(expected), std::string::npos) << last_error();

  // reserved_bytes serves an offloader of either kind: here one on the host backend.
  ASSERT_EQ(sdalloc_offload_create(engine, &options, &offload), SDALLOC_SUCCESS);
  std::size_t reserved = 1;
  ASSERT_EQ(sdalloc_torch_offload_reserved_bytes(offload, &reserved), SDALLOC_SUCCESS);
  EXPECT_EQ(reserved, 0U);  // nothing loaded yet
  std::vector<unsigned char> weight(kMiB, 7);
  std::size_t id = 0;
  ASSERT_EQ(sdalloc_offload_add_weight(offload, weight.data(), weight.size(), &id),
            SDALLOC_SUCCESS);
  void* device = nullptr;
  ASSERT_EQ(sdalloc_offload_begin_step(offload), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_offload_acquire(offload, &id, 1, &device), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_offload_end_step(offload), SDALLOC_SUCCESS);
  ASSERT_EQ(sdalloc_torch_offload_reserved_bytes(offload, &reserved), SDALLOC_SUCCESS);
  EXPECT_GE(reserved, kMiB);
  EXPECT_EQ(sdalloc_torch_offload_reserved_bytes(offload, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_torch_offload_reserved_bytes(nullptr, &reserved),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("offload is NULL"), std::string::npos) << last_error();
  sdalloc_offload_destroy(offload);
  sdalloc_transfer_engine_destroy(engine);
}

}  // namespace
