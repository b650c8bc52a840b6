// consumer.cpp - a C++ program built against an installed sdalloc (see check-install.sh).
//
// Includes the umbrella header (so every public header, and the generated version.hpp,
// must have been installed), allocates from a CachingPool over HostResource, writes to the
// memory, checks the pool's counters and that a freed block is handed out again, and exits
// non-zero with a message if anything is off.
#include <cstddef>
#include <cstdio>
#include <cstring>

#include <sdalloc/sdalloc.hpp>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "consumer: FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  try {
    sdalloc::HostResource host;
    sdalloc::CachingPool pool(host);
    constexpr std::size_t kBytes = std::size_t{1} << 20;

    void* first = pool.allocate(kBytes);
    if (first == nullptr) return fail("allocate returned nullptr");
    std::memset(first, 0x5a, kBytes);
    if (pool.stats().live_bytes != kBytes) return fail("live_bytes is not the request");
    pool.deallocate(first, kBytes);

    void* again = pool.allocate(kBytes);
    if (again != first) return fail("a freed block was not reused for the same size");
    pool.deallocate(again, kBytes);
    if (pool.stats().live_bytes != 0) return fail("live_bytes is not 0 after the frees");

    std::printf("consumer: sdalloc %s OK (pool: %s)\n", SDALLOC_VERSION_STRING,
                pool.name().c_str());
    return 0;
  } catch (const sdalloc::Error& e) {
    std::fprintf(stderr, "consumer: FAILED: sdalloc error: %s\n", e.what());
    return 1;
  }
}
