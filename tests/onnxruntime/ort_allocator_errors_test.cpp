// ort_allocator_errors_test.cpp - the OrtAllocator adapter's bad inputs: a foreign Free, an
// Alloc beyond the pool's capacity (nullptr, ORT's own error, the process goes on), zero
// bytes, registering twice, a pool without steps given to PlannedSession, and the lifetime
// rule (the allocator destroyed while a session holds memory aborts with a message).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "onnxruntime/model_runner.hpp"
#include "onnxruntime/ort_env.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/onnxruntime/planned_run.hpp"
#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/resources/limit_resource.hpp"

namespace sdalloc::onnxruntime {
namespace {

using test::host;
using test::models_dir;
using test::sdalloc_settings;
using test::test_env;

TEST(OrtAllocatorErrors, ForeignFreeIsRefusedCountedAndLeavesThePoolIntact) {
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtAllocator* a = allocator.get();
  void* mine = a->Alloc(a, 4096);
  ASSERT_NE(mine, nullptr);
  int not_ours = 0;
  a->Free(a, &not_ours);
  EXPECT_EQ(allocator.counters().foreign_frees, 1u);
  EXPECT_NE(allocator.last_error(), "");
  EXPECT_EQ(allocator.counters().outstanding, 1u);
  EXPECT_EQ(allocator.stats().live_bytes, 4096u);
  a->Free(a, mine);
  a->Free(a, mine);  // a double free is a foreign pointer too
  EXPECT_EQ(allocator.counters().foreign_frees, 2u);
  EXPECT_EQ(allocator.counters().outstanding, 0u);
  a->Free(a, nullptr);  // ignored, as free(nullptr)
  EXPECT_EQ(allocator.counters().foreign_frees, 2u);
  allocator.pool().check_invariants();
}

TEST(OrtAllocatorErrors, ZeroBytesGiveNullptrWithoutAFailure) {
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtAllocator* a = allocator.get();
  EXPECT_EQ(a->Alloc(a, 0), nullptr);
  EXPECT_EQ(a->Reserve(a, 0), nullptr);
  EXPECT_EQ(allocator.counters().failed_allocs, 0u);
}

TEST(OrtAllocatorErrors, ReserveAndAllocOnStreamAreServedAndFreed) {
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtAllocator* a = allocator.get();
  void* r = a->Reserve(a, 1000);
  void* s = a->AllocOnStream(a, 3000, nullptr);  // a null stream is stream 0
  ASSERT_NE(r, nullptr);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(allocator.counters().reserves, 1u);
  EXPECT_EQ(allocator.counters().allocs, 1u);
  EXPECT_EQ(allocator.counters().max_alloc_size, 3000u);
  a->Free(a, r);
  a->Free(a, s);
  EXPECT_EQ(allocator.counters().outstanding, 0u);
  EXPECT_EQ(allocator.stats().live_bytes, 0u);
  EXPECT_EQ(a->Info(a), allocator.memory_info());
  EXPECT_EQ(a->Shrink(a), nullptr);
}

// The capacity a session's creation needs, measured on an unlimited pool: a pool capped at
// it holds the initializers but not also a Run()'s tensors.
std::size_t session_creation_bytes(const Model& model) {
  OrtPoolAllocator probe(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtEnvAllocator registered(test_env(), probe);
  ModelRunner runner(test_env(), model, sdalloc_settings());
  return probe.stats().peak_reserved_bytes;
}

TEST(OrtAllocatorErrors, AllocBeyondCapacityFailsAndOrtReportsItsOwnErrorFromRun) {
  const Model model = read_model(models_dir(), "resnet18");
  const std::size_t init_bytes = session_creation_bytes(model);
  ASSERT_GT(init_bytes, 0u);
  LimitResource capped(host(), init_bytes);
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(capped));
  OrtAllocator* a = allocator.get();
  EXPECT_THROW(a->Alloc(a, init_bytes + 1), std::bad_alloc);  // what ORT's CPU allocator does
  EXPECT_EQ(allocator.counters().failed_allocs, 1u);
  EXPECT_NE(allocator.last_error().find("out of memory"), std::string::npos)
      << allocator.last_error();
  {
    OrtEnvAllocator registered(test_env(), allocator);
    ModelRunner runner(test_env(), model, sdalloc_settings());
    for (int i = 0; i < 2; ++i) {  // the session stays usable: the same error again
      RunResult r = runner.run();
      EXPECT_NE(r.error, "") << "run " << i;  // ORT's own message
      EXPECT_TRUE(r.output.empty());
    }
    EXPECT_GT(allocator.counters().failed_allocs, 2u);
  }
  // The process and the pool go on: everything ORT took came back.
  EXPECT_EQ(allocator.counters().outstanding, 0u);
  allocator.pool().check_invariants();
}

TEST(OrtAllocatorErrors, CapacityBelowTheInitializersFailsCreateSessionWithOrtsError) {
  const Model model = read_model(models_dir(), "resnet18");
  LimitResource capped(host(), session_creation_bytes(model) / 2);
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(capped));
  OrtEnvAllocator registered(test_env(), allocator);
  try {
    ModelRunner runner(test_env(), model, sdalloc_settings());
    FAIL() << "the session was created with half the memory its initializers need";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CreateSession"), std::string::npos) << e.what();
  }
  EXPECT_GT(allocator.counters().failed_allocs, 0u);
  EXPECT_EQ(allocator.counters().outstanding, 0u);
}

// kReturnNull keeps OrtAllocator's C contract to the letter; ORT 1.29 does not check the
// nullptr in its CPU kernels and the process dies there. This test records that: when an
// ORT release checks it, the test fails and the header's note can go.
TEST(OrtAllocatorErrorsDeathTest, ReturnNullModeGivesNullptrWhichOrt129KernelsDoNotCheck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Model model = read_model(models_dir(), "resnet18");
  const std::size_t init_bytes = session_creation_bytes(model);
  OrtPoolAllocatorOptions options;
  options.on_failure = OrtAllocFailure::kReturnNull;
  {
    LimitResource capped(host(), init_bytes);
    OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(capped), options);
    OrtAllocator* a = allocator.get();
    EXPECT_EQ(a->Alloc(a, init_bytes + 1), nullptr);
    EXPECT_EQ(a->Reserve(a, init_bytes + 1), nullptr);
    EXPECT_EQ(allocator.counters().failed_allocs, 2u);
  }
  EXPECT_EXIT(
      {
        LimitResource capped(host(), init_bytes);
        OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(capped), options);
        OrtEnvAllocator registered(test_env(), allocator);
        ModelRunner runner(test_env(), model, sdalloc_settings());
        const RunResult r = runner.run();
        std::fprintf(stderr, "ORT reported: %s\n", r.error.c_str());
        std::exit(0);
      },
      [](int status) { return WIFSIGNALED(status); }, "");
}

TEST(OrtAllocatorErrors, RegisteringTwiceOnOneEnvIsRefusedWithOrtsMessage) {
  OrtPoolAllocator first(std::make_shared<PoolOf<CachingPool>>(host()));
  OrtPoolAllocator second(std::make_shared<PoolOf<CachingPool>>(host()));
  {
    OrtEnvAllocator registered(test_env(), first);
    try {
      OrtEnvAllocator again(test_env(), second);
      FAIL() << "a second allocator for the same memory info was registered";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("RegisterAllocator"), std::string::npos) << e.what();
    }
    EXPECT_THROW(OrtEnvAllocator(test_env(), first), InvalidArgument);
  }
  // Unregistered by the destructor: registering again works.
  EXPECT_NO_THROW(OrtEnvAllocator(test_env(), second));
  EXPECT_THROW(OrtEnvAllocator(nullptr, second), InvalidArgument);
}

TEST(OrtAllocatorErrors, PlannedSessionRefusesAPoolWithoutSteps) {
  const Model model = read_model(models_dir(), "small_unet");
  OrtPoolAllocator allocator(std::make_shared<PoolOf<CachingPool>>(host()));
  ModelRunner runner(test_env(), model, SessionSettings{});
  EXPECT_THROW(PlannedSession(runner.session(), allocator), InvalidArgument);
  OrtPoolAllocator planned(std::make_shared<PoolOf<PlannedArena>>(host()));
  EXPECT_THROW(PlannedSession(nullptr, planned), InvalidArgument);
  EXPECT_THROW(OrtPoolAllocator(nullptr), InvalidArgument);
}

TEST(OrtAllocatorLifetime, DroppingTheCallersPoolReferenceEarlyIsHarmless) {
  const Model model = read_model(models_dir(), "small_unet");
  auto pool = std::make_shared<PoolOf<CachingPool>>(host());
  OrtPoolAllocator allocator(pool);
  pool.reset();  // the allocator keeps the pool alive
  OrtEnvAllocator registered(test_env(), allocator);
  ModelRunner runner(test_env(), model, sdalloc_settings());
  EXPECT_EQ(runner.run().error, "");
}

TEST(OrtAllocatorLifetimeDeathTest, DestroyingTheAllocatorWhileASessionHoldsMemoryAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Model model = read_model(models_dir(), "small_unet");
  EXPECT_DEATH(
      {
        auto allocator =
            std::make_unique<OrtPoolAllocator>(std::make_shared<PoolOf<CachingPool>>(host()));
        auto registered = std::make_unique<OrtEnvAllocator>(test_env(), *allocator);
        ModelRunner runner(test_env(), model, sdalloc_settings());
        registered.reset();
        allocator.reset();  // the session still holds its initializers: refused
      },
      "OrtPoolAllocator destroyed while ONNX Runtime holds [0-9]+ allocations");
}

}  // namespace
}  // namespace sdalloc::onnxruntime
