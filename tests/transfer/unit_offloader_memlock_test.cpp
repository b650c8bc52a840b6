// unit_offloader_memlock_test.cpp - the arena's page-locking refused by the operating
// system (RLIMIT_MEMLOCK, in a child process without CAP_IPC_LOCK, which would bypass it):
// the documented fallback (staged copies, never a pageable one) or, with not even staging
// locked, a clear error.
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>

#include "../../bench/transfer/unit_table.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/transfer/unit_offloader.hpp"
#include "support/sanitizers.hpp"

namespace sdalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// AddressSanitizer and ThreadSanitizer replace mlock with a call that does nothing and
// succeeds, so the operating system never refuses a lock there: these tests run in the other
// builds.
constexpr bool kMlockIsReal = !test::kAddressOrThreadSanitizer;

// Runs `body` in a child whose locked memory is capped at `limit`; answers its exit status.
int in_child_with_memlock(std::size_t limit, const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &header, caps) != 0) _exit(90);
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    caps[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &header, caps) != 0) _exit(91);
    const rlimit cap{limit, limit};
    if (setrlimit(RLIMIT_MEMLOCK, &cap) != 0) _exit(92);
    int status = 93;
    try {
      status = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      status = 94;
    }
    std::fflush(nullptr);
    _exit(status);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<bench::UnitWork> units(std::size_t n, std::size_t bytes) {
  std::vector<bench::UnitWork> work(n);
  for (auto& w : work) {
    w.bytes = bytes;
    w.kernels = 1;
    w.device_seconds = 0.2e-3;
  }
  return work;
}

TEST(UnitOffloaderMemlock, ARefusedRegistrationFallsBackToStagingNeverPageable) {
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under this sanitizer";
  // 16 units of 1 MiB, 6 MiB lockable: the first chunks lock, the rest is refused; the
  // staging chunks (2 x 256 KiB) still lock.
  const int status = in_child_with_memlock(6 * kMiB, [] {
    const auto work = units(16, kMiB);
    SimulatedDeviceOptions d;
    d.copy_bytes_per_second = 4e9;
    SimulatedDevice device(d);
    UnitOffloadOptions o;
    o.budget = 8 * kMiB;
    o.register_chunk_bytes = 2 * kMiB;
    o.staging_chunk_bytes = 256 * 1024;
    UnitOffloader offloader(device, o);
    for (const auto& w : work) offloader.add_unit(w.bytes);
    offloader.seal();
    for (std::size_t u = 0; u < work.size(); ++u) {
      bench::fill_image(offloader.host_image(u), u, work[u].bytes);
    }
    std::atomic<std::uint64_t> bad{0};
    for (int step = 0; step < 5; ++step) bench::run_step(device, &offloader, work, {}, 0, bad);
    const UnitOffloadStats s = offloader.stats();
    std::fprintf(stderr, "child: refusal: %s\n", offloader.registration_refusal().c_str());
    if (bad != 0) return 1;
    if (!s.registration_refused || s.registered_bytes == 0 || s.registered_bytes >= 16 * kMiB) {
      return 2;
    }
    if (offloader.registration_refusal().find("RLIMIT_MEMLOCK") == std::string::npos) return 3;
    if (s.staged_copies == 0) return 4;
    if (device.counters().pageable_copies != 0) return 5;
    if (s.planned_steps != 4) return 6;
    return 0;
  });
  EXPECT_EQ(status, 0);
}

TEST(UnitOffloaderMemlock, NoLockableMemoryAtAllIsAClearError) {
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under this sanitizer";
  const int status = in_child_with_memlock(0, [] {
    const auto work = units(4, kMiB);
    SimulatedDevice device;
    UnitOffloadOptions o;
    o.budget = 2 * kMiB;
    UnitOffloader offloader(device, o);
    for (const auto& w : work) offloader.add_unit(w.bytes);
    offloader.seal();
    offloader.begin_step(device.compute_stream());
    try {
      offloader.enter(0);
    } catch (const RegistrationRefused& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "child: %s\n", e.what());
      const bool says_why = what.find("no page-locked staging") != std::string::npos &&
                            what.find("RLIMIT_MEMLOCK") != std::string::npos;
      return says_why ? 0 : 2;
    }
    return 1;
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace sdalloc
