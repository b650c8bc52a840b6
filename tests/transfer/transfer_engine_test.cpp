// transfer_engine_test.cpp - the TransferEngine on the host backend: every path moves the
// right bytes, thousands of small tensors go in a handful of calls, and each error (freed
// memory, cancel, a failed call, bad arguments) is clear and leaves the engine usable.
#include "sdalloc/transfer/transfer_engine.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "sdalloc/core/errors.hpp"
#include "sdalloc/transfer/host_copy_backend.hpp"
#include "support/test_support.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * kKiB;

std::vector<unsigned char> pattern(std::size_t bytes, unsigned seed) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return v;
}

TransferEngineOptions small_options() {
  TransferEngineOptions o;
  o.staging_budget = 8 * kMiB;
  o.batch_bytes = 2 * kMiB;
  o.small_bytes = 64 * kKiB;
  o.chunk_bytes = kMiB;
  o.register_chunk_bytes = kMiB;
  return o;
}

TEST(TransferEngine, EveryPathMovesTheRightBytes) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  // small (packed), large pageable (chunked through staging), large pinned (direct)
  const std::vector<std::size_t> sizes = {1, 300, 4 * kKiB, 64 * kKiB, 3 * kMiB + 17};
  std::vector<std::vector<unsigned char>> host, device, back;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(pattern(sizes[i], static_cast<unsigned>(i)));
    device.emplace_back(sizes[i]);
    back.emplace_back(sizes[i]);
  }
  auto pinned = pattern(5 * kMiB, 99);
  std::vector<unsigned char> pinned_device(pinned.size()), pinned_back(pinned.size());
  engine.register_host(pinned.data(), pinned.size());
  engine.register_host(pinned_back.data(), pinned_back.size());
  EXPECT_TRUE(engine.is_pinned(pinned.data() + 10, 100));
  std::vector<TransferHandle> handles;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    handles.push_back(
        engine.copy(CopyKind::kHostToDevice, device[i].data(), host[i].data(), sizes[i]));
  }
  handles.push_back(
      engine.copy(CopyKind::kHostToDevice, pinned_device.data(), pinned.data(), pinned.size()));
  for (const auto& h : handles) h.wait();
  handles.clear();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(device[i], host[i]) << "host->device, " << sizes[i] << " bytes";
    handles.push_back(
        engine.copy(CopyKind::kDeviceToHost, back[i].data(), device[i].data(), sizes[i]));
  }
  handles.push_back(engine.copy(CopyKind::kDeviceToHost, pinned_back.data(), pinned_device.data(),
                                pinned.size()));
  engine.synchronize();
  for (const auto& h : handles) EXPECT_EQ(h.state(), TransferState::kDone);
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(back[i], host[i]) << sizes[i];
  EXPECT_EQ(pinned_back, pinned);
  std::vector<unsigned char> d2d(pinned.size());
  engine.copy(CopyKind::kDeviceToDevice, d2d.data(), pinned_device.data(), d2d.size()).wait();
  EXPECT_EQ(d2d, pinned);
  const TransferStats stats = engine.stats();
  EXPECT_EQ(stats.direct_requests, 3u);   // two pinned large copies and the device->device one
  EXPECT_EQ(stats.chunked_requests, 2u);  // the pageable 3 MiB, both ways
  EXPECT_EQ(stats.packed_requests, 8u);
  engine.unregister_host(pinned.data());
  engine.unregister_host(pinned_back.data());
  EXPECT_FALSE(engine.is_pinned(pinned.data(), 1));
}

TEST(TransferEngine, TenThousandSmallTensorsMoveInAHandfulOfCopyCalls) {
  HostCopyBackend backend;
  TransferEngine engine(backend);  // default options: 16 MiB batches
  constexpr std::size_t kCount = 10000;
  constexpr std::size_t kBytes = 4 * kKiB;
  std::vector<unsigned char> host(kCount * kBytes), device(kCount * kBytes);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i % 251);
  std::vector<TransferHandle> handles;
  handles.reserve(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    // Every other tensor, so nothing can be merged by address: packing does the work.
    const std::size_t slot = (i * 2) % kCount + (i * 2) / kCount;
    handles.push_back(engine.copy(CopyKind::kHostToDevice, device.data() + slot * kBytes,
                                  host.data() + slot * kBytes, kBytes));
  }
  engine.synchronize();
  for (const auto& h : handles) ASSERT_EQ(h.state(), TransferState::kDone);
  EXPECT_EQ(device, host);
  EXPECT_LE(backend.calls(), 5u);
  EXPECT_EQ(engine.stats().calls, backend.calls());
  EXPECT_EQ(engine.stats().packed_requests, kCount);
}

TEST(TransferEngine, CopyFromFreedStagingMemoryIsRefused) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  void* block = engine.staging().allocate(kMiB);
  std::vector<unsigned char> device(kMiB);
  engine.copy(CopyKind::kHostToDevice, device.data(), block, kMiB).wait();  // live: fine
  engine.staging().deallocate(block);
  try {
    (void)engine.copy(CopyKind::kHostToDevice, device.data(), block, kMiB);
    FAIL() << "a copy from freed staging memory was accepted";
  } catch (const InvalidPointer& e) {
    EXPECT_TRUE(test::Contains(e.what(), "freed"));
    EXPECT_EQ(e.pointer, block);
  }
  EXPECT_THROW((void)engine.copy(CopyKind::kDeviceToHost, block, device.data(), 64),
               InvalidPointer);
  EXPECT_EQ(engine.stats().requests, 1u);  // nothing was queued
  std::vector<unsigned char> host = pattern(kMiB, 3);
  engine.copy(CopyKind::kHostToDevice, device.data(), host.data(), kMiB).wait();  // usable
  EXPECT_EQ(device, host);
}

TEST(TransferEngine, QueuedRequestCanBeCancelledAndTheRestStillRun) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  auto a = pattern(1000, 1), b = pattern(1000, 2);
  std::vector<unsigned char> da(1000, 0), db(1000, 0);
  const TransferHandle ha = engine.copy(CopyKind::kHostToDevice, da.data(), a.data(), a.size());
  const TransferHandle hb = engine.copy(CopyKind::kHostToDevice, db.data(), b.data(), b.size());
  EXPECT_EQ(ha.state(), TransferState::kQueued);
  EXPECT_TRUE(ha.cancel());
  EXPECT_FALSE(ha.cancel());
  EXPECT_TRUE(ha.ready());
  EXPECT_THROW(ha.wait(), TransferCancelled);
  hb.wait();  // flushes the queue itself
  EXPECT_EQ(db, b);
  EXPECT_EQ(da, std::vector<unsigned char>(1000, 0));  // the cancelled copy never ran
  EXPECT_FALSE(hb.cancel());                           // ended: too late
  EXPECT_TRUE(test::Contains(ha.error(), "cancelled"));
  EXPECT_EQ(engine.stats().cancelled_requests, 1u);
}

TEST(TransferEngine, FailedCopyCallFailsItsRequestsAndTheEngineStaysUsable) {
  std::atomic<int> calls_to_fail{1};
  HostCopyBackendOptions backend_options;
  backend_options.fail_call = [&](const CopyCall&) { return calls_to_fail.fetch_sub(1) > 0; };
  HostCopyBackend backend(backend_options);
  TransferEngine engine(backend, small_options());
  auto host = pattern(3 * kMiB, 5);
  std::vector<unsigned char> device(host.size());
  const TransferHandle small =
      engine.copy(CopyKind::kHostToDevice, device.data(), host.data(), 512);
  try {
    small.wait();
    FAIL() << "the failed call's request succeeded";
  } catch (const TransferError& e) {
    EXPECT_TRUE(test::Contains(e.what(), "failed"));
  }
  EXPECT_EQ(small.state(), TransferState::kFailed);
  // A request whose first chunk fails fails as a whole, once its other chunks ended.
  calls_to_fail = 1;
  const TransferHandle chunked =
      engine.copy(CopyKind::kHostToDevice, device.data(), host.data(), host.size());
  EXPECT_THROW(chunked.wait(), TransferError);
  engine.copy(CopyKind::kHostToDevice, device.data(), host.data(), host.size()).wait();
  EXPECT_EQ(device, host);
  EXPECT_EQ(engine.staging().stats().live_bytes, 0u);  // failed calls gave staging back
}

TEST(TransferEngine, BadArgumentsAreRefused) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  char byte = 0;
  EXPECT_THROW((void)engine.copy(CopyKind::kHostToDevice, nullptr, &byte, 1), InvalidArgument);
  EXPECT_THROW((void)engine.copy(CopyKind::kHostToDevice, &byte, nullptr, 1), InvalidArgument);
  EXPECT_TRUE(engine.copy(CopyKind::kHostToDevice, nullptr, nullptr, 0).ready());
  EXPECT_THROW(engine.unregister_host(&byte), InvalidPointer);
  TransferEngineOptions tiny = small_options();
  tiny.staging_budget = kMiB / 2;
  EXPECT_THROW(TransferEngine(backend, tiny), InvalidArgument);
  TransferEngineOptions inverted = small_options();
  inverted.small_bytes = inverted.batch_bytes + 1;
  EXPECT_THROW(TransferEngine(backend, inverted), InvalidArgument);
  HostCopyBackendOptions none;
  none.copy_streams = 0;
  EXPECT_THROW(HostCopyBackend{none}, InvalidArgument);
}

TEST(TransferEngine, RegistrationInTheBackgroundMakesTheRangePinnedInChunks) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  std::vector<unsigned char> weights = pattern(5 * kMiB + 3, 7);
  const TransferHandle done = engine.register_host_async(weights.data(), weights.size());
  done.wait();
  EXPECT_TRUE(engine.is_pinned(weights.data(), weights.size()));
  EXPECT_EQ(backend.registered_bytes(), weights.size());
  std::vector<unsigned char> device(weights.size());
  engine.copy(CopyKind::kHostToDevice, device.data(), weights.data(), weights.size()).wait();
  EXPECT_EQ(device, weights);
  EXPECT_EQ(engine.stats().direct_requests, 1u);
  EXPECT_THROW(engine.register_host(weights.data(), weights.size()), InvalidArgument);
  engine.unregister_host(weights.data());
  EXPECT_EQ(backend.registered_bytes(), 0u);
  EXPECT_THROW((void)engine.register_host_async(nullptr, 1), InvalidArgument);
}

TEST(TransferEngine, ManyBackgroundRegistrationsEndAndUnregisterWaitsForThem) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  std::vector<std::vector<unsigned char>> ranges(40, std::vector<unsigned char>(3 * kMiB / 2));
  std::vector<TransferHandle> handles;
  for (auto& r : ranges) handles.push_back(engine.register_host_async(r.data(), r.size()));
  engine.unregister_host(ranges[39].data());  // waits for its registration first
  EXPECT_TRUE(handles[39].ready());
  for (const auto& h : handles) h.wait();
  EXPECT_EQ(backend.registered_bytes(), 39 * ranges[0].size());
  EXPECT_TRUE(engine.is_pinned(ranges[0].data(), ranges[0].size()));
  EXPECT_FALSE(engine.is_pinned(ranges[39].data(), 1));
}

TEST(TransferEngine, SmallDeviceToDeviceCopiesGoAsOneCall) {
  HostCopyBackend backend;
  TransferEngine engine(backend, small_options());
  auto src = pattern(100 * kKiB, 9);
  std::vector<unsigned char> dst(src.size());
  for (std::size_t i = 0; i < 100; ++i) {
    (void)engine.copy(CopyKind::kDeviceToDevice, dst.data() + i * kKiB, src.data() + i * kKiB,
                      kKiB);
  }
  engine.synchronize();
  EXPECT_EQ(dst, src);
  EXPECT_EQ(backend.calls(), 1u);
  EXPECT_EQ(engine.staging().stats().upstream_allocations, 0u);  // no staging needed
}

TEST(TransferEngine, StreamWaitReturnsOnceTheCopyLandedAndMappedMemoryIsShared) {
  HostCopyBackendOptions slow;
  slow.bytes_per_second = 100.0 * kMiB;  // 2 MiB: about 20 ms
  HostCopyBackend backend(slow);
  TransferEngine engine(backend, small_options());
  auto host = pattern(2 * kMiB, 11);
  engine.register_host(host.data(), host.size());
  std::vector<unsigned char> device(host.size());
  const TransferHandle h =
      engine.copy(CopyKind::kHostToDevice, device.data(), host.data(), host.size());
  engine.stream_wait(h, kDefaultStream);
  EXPECT_TRUE(h.ready());
  EXPECT_EQ(device, host);
  const MappedBuffer mapped = engine.map(4096);
  ASSERT_NE(mapped.host, nullptr);
  static_cast<char*>(mapped.host)[7] = 42;
  EXPECT_EQ(static_cast<const char*>(mapped.device)[7], 42);
  engine.unmap(mapped);
  engine.unregister_host(host.data());
}

}  // namespace
}  // namespace sdalloc
