// resource_error_conformance_test.cpp - wrong calls are rejected and change nothing.
//
// Typed over AllConfigurations; each test runs where the configuration defines the check
// (resource_configurations.hpp traits) and is skipped elsewhere: raw resources cannot tell a
// foreign pointer from their own, so those calls are undefined there.
//   DoubleFreeIsRejected, ForeignPointersAreRejected   kRejectsUnknownPointers: InvalidPointer
//   WrongSizeIsRejected                                kRejectsWrongSize: InvalidArgument
//   BadAlignmentIsRejected                             pools: InvalidArgument
// After every rejected call the test checks what errors.hpp promises: the object is
// unchanged (pool statistics, every layer's accounting, the patterns of live allocations,
// the pool's invariants) and still usable (a fresh allocation and free succeed).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

#include "conformance/reference_model.hpp"
#include "conformance/resource_configurations.hpp"
#include "sdalloc/core/errors.hpp"

namespace sdalloc::conformance {
namespace {

template <typename Config>
class ResourceErrorConformance : public ::testing::Test {
 protected:
  MemoryResource& resource() { return config_.resource(); }
  ReferenceModel new_model() const { return ReferenceModel(Config::kGuaranteedAlignment); }

  // Runs `call`, which must throw `ExpectedError` (then `inspect` looks at it), and checks
  // that nothing changed and the resource still works. `model` is what the test holds.
  template <typename ExpectedError>
  void expect_rejected(const std::string& what, const std::function<void()>& call,
                       const ReferenceModel& model,
                       const std::function<void(const ExpectedError&)>& inspect = {}) {
    SCOPED_TRACE(what);
    [[maybe_unused]] PoolStats before;
    if constexpr (Config::kIsPool) before = config_.pool().stats();
    try {
      call();
      ADD_FAILURE() << what << " was accepted";
    } catch (const ExpectedError& e) {
      if (inspect) inspect(e);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw the wrong error type: " << e.what();
    }
    if constexpr (Config::kIsPool) {
      const PoolStats after = config_.pool().stats();
      EXPECT_EQ(after.live_bytes, before.live_bytes);
      EXPECT_EQ(after.live_allocations, before.live_allocations);
      EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
      EXPECT_EQ(after.allocations, before.allocations);
      EXPECT_EQ(after.frees, before.frees);
      EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
      EXPECT_EQ(after.segments, before.segments);
      EXPECT_EQ(after.free_bytes, before.free_bytes);
      EXPECT_EQ(after.largest_free_block, before.largest_free_block);
    }
    config_.expect_accounting(model);
    EXPECT_TRUE(model.check_all_patterns());
    expect_still_works(model);
  }

  void expect_still_works(const ReferenceModel& held) {
    ReferenceModel model = new_model();
    for (const auto& [address, entry] : held.live()) ASSERT_TRUE(model.adopt(address, entry));
    for (const std::size_t size : {std::size_t{3000}, 2 * kMiB + 1}) {
      void* ptr = resource().allocate(size, Stream{1});
      ASSERT_TRUE(model.add(ptr, size, Stream{1}));
      ASSERT_TRUE(model.remove(ptr));
      resource().deallocate(ptr, size, Stream{1});
    }
    if constexpr (Config::kIsPool) {
      void* ptr = config_.pool().allocate(5000, 4096, Stream{});
      ASSERT_TRUE(model.add(ptr, 5000));
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 4096, 0u);
      ASSERT_TRUE(model.remove(ptr));
      config_.pool().free(ptr);
      EXPECT_NO_THROW(config_.pool().check_invariants());
    }
  }

  void free_all(ReferenceModel& model) {
    while (!model.empty()) {
      auto [address, entry] = *model.live().begin();
      void* ptr = reinterpret_cast<void*>(address);
      ASSERT_TRUE(model.remove(ptr));
      resource().deallocate(ptr, entry.size, entry.stream);
    }
    config_.expect_accounting(model);
  }

  Config config_;
};

TYPED_TEST_SUITE(ResourceErrorConformance, AllConfigurations, ConfigurationName);

TYPED_TEST(ResourceErrorConformance, DoubleFreeIsRejected) {
  if constexpr (!TypeParam::kRejectsUnknownPointers) {
    GTEST_SKIP() << "raw resource: a double free is undefined";
  } else {
    for (const std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
      SCOPED_TRACE("size " + std::to_string(size));
      ReferenceModel model = this->new_model();
      void* neighbour = this->resource().allocate(size);
      ASSERT_TRUE(model.add(neighbour, size));
      void* ptr = this->resource().allocate(size);
      ASSERT_TRUE(model.add(ptr, size));
      ASSERT_TRUE(model.remove(ptr));
      this->resource().deallocate(ptr, size);

      this->template expect_rejected<InvalidPointer>(
          "deallocate of a freed pointer", [&] { this->resource().deallocate(ptr, size); }, model,
          [&](const InvalidPointer& e) { EXPECT_EQ(e.pointer, ptr) << e.what(); });
      if constexpr (TypeParam::kIsPool) {
        auto& pool = this->config_.pool();
        this->template expect_rejected<InvalidPointer>(
            "free() of a freed pointer", [&] { pool.free(ptr); }, model);
        // The same through the size-less path on both sides.
        void* freed = pool.allocate(size, 512, Stream{});
        pool.free(freed);
        this->template expect_rejected<InvalidPointer>(
            "free() twice", [&] { pool.free(freed); }, model);
        this->template expect_rejected<InvalidPointer>(
            "allocation_size of a freed pointer", [&] { (void)pool.allocation_size(freed); },
            model);
      }
      this->free_all(model);
    }
  }
}

TYPED_TEST(ResourceErrorConformance, ForeignPointersAreRejected) {
  if constexpr (!TypeParam::kRejectsUnknownPointers) {
    GTEST_SKIP() << "raw resource: freeing a foreign pointer is undefined";
  } else {
    ReferenceModel model = this->new_model();
    constexpr std::size_t kSize = 8192;
    void* ptr = this->resource().allocate(kSize);
    ASSERT_TRUE(model.add(ptr, kSize));
    auto* bytes = static_cast<unsigned char*>(ptr);

    alignas(4096) unsigned char on_stack[1024] = {};
    this->template expect_rejected<InvalidPointer>(
        "a stack address", [&] { this->resource().deallocate(on_stack, sizeof on_stack); }, model);

    void* from_malloc = std::malloc(4096);
    ASSERT_NE(from_malloc, nullptr);
    this->template expect_rejected<InvalidPointer>(
        "a malloc'd pointer", [&] { this->resource().deallocate(from_malloc, 4096); }, model);
    std::free(from_malloc);

    HostResource other;
    void* from_other = other.allocate(4096);
    this->template expect_rejected<InvalidPointer>(
        "another resource's pointer", [&] { this->resource().deallocate(from_other, 4096); },
        model);
    other.deallocate(from_other, 4096);

    for (const std::size_t offset : {std::size_t{256}, std::size_t{512}, std::size_t{4096}}) {
      this->template expect_rejected<InvalidPointer>(
          "an interior pointer ptr+" + std::to_string(offset),
          [&] { this->resource().deallocate(bytes + offset, 256); }, model);
    }
    // Just past the allocation: free space or another block's start, never this one's.
    if (model.live().count(reinterpret_cast<std::uintptr_t>(bytes + kSize)) == 0) {
      this->template expect_rejected<InvalidPointer>(
          "the address just past an allocation",
          [&] { this->resource().deallocate(bytes + kSize, 512); }, model);
    }
    if constexpr (TypeParam::kIsPool) {
      auto& pool = this->config_.pool();
      this->template expect_rejected<InvalidPointer>(
          "free() of an interior pointer", [&] { pool.free(bytes + 512); }, model);
      this->template expect_rejected<InvalidPointer>(
          "free() of a stack address", [&] { pool.free(on_stack); }, model);
      this->template expect_rejected<InvalidPointer>(
          "allocation_size of an interior pointer",
          [&] { (void)pool.allocation_size(bytes + 256); }, model);
    }
    this->free_all(model);
  }
}

TYPED_TEST(ResourceErrorConformance, WrongSizeIsRejected) {
  if constexpr (!TypeParam::kRejectsWrongSize) {
    GTEST_SKIP() << "the resource does not record sizes";
  } else {
    for (const std::size_t size : {std::size_t{1000}, 3 * kMiB + 100}) {
      SCOPED_TRACE("size " + std::to_string(size));
      ReferenceModel model = this->new_model();
      void* ptr = this->resource().allocate(size);
      ASSERT_TRUE(model.add(ptr, size));
      // size rounded to the pool's 512 bytes is the block's size, still not the request's.
      const std::size_t wrong_sizes[] = {size + 1, size - 1, rounded_to_pool_blocks(size), 2 * size,
                                         1};
      for (const std::size_t wrong : wrong_sizes) {
        if (wrong == size) continue;
        this->template expect_rejected<InvalidArgument>(
            "deallocate with " + std::to_string(wrong) + " bytes",
            [&] { this->resource().deallocate(ptr, wrong); }, model);
      }
      this->free_all(model);  // the right size still frees it
    }
  }
}

TYPED_TEST(ResourceErrorConformance, BadAlignmentIsRejected) {
  if constexpr (!TypeParam::kIsPool) {
    GTEST_SKIP() << "only pools take an alignment";
  } else {
    auto& pool = this->config_.pool();
    ReferenceModel model = this->new_model();
    void* held = this->resource().allocate(6000);
    ASSERT_TRUE(model.add(held, 6000));
    const std::size_t bad_alignments[] = {3,
                                          48,
                                          384,
                                          1000,
                                          3 * kMiB,
                                          CachingPool::kMaxAlignment + 1,
                                          CachingPool::kMaxAlignment * 2,
                                          std::size_t{1} << 63};
    for (const std::size_t alignment : bad_alignments) {
      this->template expect_rejected<InvalidArgument>(
          "alignment " + std::to_string(alignment),
          [&] { (void)pool.allocate(4096, alignment, Stream{}); }, model);
    }
    this->free_all(model);
  }
}

}  // namespace
}  // namespace sdalloc::conformance
