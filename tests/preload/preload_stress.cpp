// preload_stress.cpp - the drop-in's stress test, run with LD_PRELOAD=libsdalloc_preload.so.
//
// `preload_stress all` checks what drop-ins get wrong: a large request before main and
// dlopen/dlsym there, malloc(0) and free(nullptr), errno kept by free, calloc overflow and
// zeroing of reused memory, realloc across the threshold both ways, every alignment from
// 1 B to 16 MiB through every aligned entry point,
// malloc_usable_size, operator new/delete, many threads at once, fork() while other threads
// allocate (the child allocates), and a free of a pointer inside the pool's range that is not
// an allocation (the child must abort with a message). `capacity` checks that a full pool
// hands requests to the system allocator (a calloc to glibc's calloc); `off` that the program runs
// when the drop-in is off (bad SDALLOC_CONF); `steps` marks steps (mode:planned); `autostep` runs a
// loop whose steps the drop-in must find by itself (mode:planned); `system_heap` that glibc keeps
// the memory of requests below the threshold (keep_system_heap, the default) and
// `system_heap_default` that keep_system_heap:false leaves glibc's defaults. Exit 0: every
// check held.
#include <dlfcn.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

using OwnsFn = int (*)(const void*);
using ThresholdFn = std::size_t (*)();
using StepFn = int (*)();

OwnsFn g_owns = nullptr;
std::size_t g_threshold = 0;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Hides a pointer from the optimiser, so a malloc/free pair it could prove unused stays.
void* opaque(void* p) {
  asm volatile("" : "+r"(p));
  return p;
}

bool owns(const void* p) { return g_owns != nullptr && g_owns(p) != 0; }

void fill(void* p, std::size_t n, unsigned char seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096) b[i] = static_cast<unsigned char>(seed + i / 4096);
  if (n > 0 && (n - 1) % 4096 != 0) b[n - 1] = seed;  // the last byte, unless it is a marker
}
bool holds(const void* p, std::size_t n, unsigned char seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096) {
    if (b[i] != static_cast<unsigned char>(seed + i / 4096)) return false;
  }
  return n == 0 || (n - 1) % 4096 == 0 || b[n - 1] == seed;
}

// The process's resident memory (/proc/self/statm), 0 when it cannot be read.
std::size_t resident_bytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long long total = 0, resident = 0;
  const int read = std::fscanf(statm, "%llu %llu", &total, &resident);
  std::fclose(statm);
  return read == 2 ? static_cast<std::size_t>(resident) * 4096 : 0;
}

// A size the compiler cannot see through (so malloc/free pairs are not elided).
volatile std::size_t g_big = 8 * kMiB;

// Before main, and inside the dynamic loader's own calls: the first large request may come
// from a constructor, and dlopen/dlsym allocate.
void* g_early = nullptr;
bool g_early_dlsym = false;
__attribute__((constructor(101))) void early_requests() {
  g_early = opaque(std::malloc(g_big));
  std::memset(g_early, 1, g_big);
  void* z = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  g_early_dlsym = z != nullptr && dlsym(z, "zlibVersion") != nullptr;
  if (z != nullptr) dlclose(z);
}

void early_checks() {
  CHECK(g_early != nullptr && owns(g_early));
  CHECK(g_early_dlsym);
  std::free(g_early);
}

void basics() {
  void* zero = std::malloc(0);
  CHECK(zero != nullptr);
  std::free(zero);
  std::free(nullptr);
  void* big = std::malloc(g_big);
  CHECK(big != nullptr && owns(big));
  CHECK(reinterpret_cast<std::uintptr_t>(big) % 16 == 0);
  void* small = std::malloc(100);
  CHECK(small != nullptr && !owns(small));
  CHECK(malloc_usable_size(big) >= g_big);
  CHECK(malloc_usable_size(small) >= 100);
  CHECK(malloc_usable_size(nullptr) == 0);
  errno = 1234;
  std::free(big);
  CHECK(errno == 1234);
  std::free(small);
  CHECK(errno == 1234);
}

// A count the compiler cannot see through, so the overflowing products below are not
// refused at compile time (-Walloc-size-larger-than): the point is that calloc refuses them.
std::size_t opaque(std::size_t value) {
  volatile std::size_t copy = value;
  return copy;
}

void calloc_checks() {
  errno = 0;
  CHECK(std::calloc(opaque(SIZE_MAX / 2), 3) == nullptr && errno == ENOMEM);
  errno = 0;
  CHECK(std::calloc(opaque(std::size_t{1} << 40), std::size_t{1} << 40) == nullptr &&
        errno == ENOMEM);
  errno = 0;
  CHECK(reallocarray(nullptr, opaque(SIZE_MAX / 2), 3) == nullptr && errno == ENOMEM);
  // Dirty pool memory, free it, calloc the same size: the reused block must read zero.
  for (std::size_t n : {g_threshold, 3 * kMiB + 123, 64 * kMiB}) {
    void* dirty = std::malloc(n);
    std::memset(dirty, 0xab, n);
    std::free(dirty);
    auto* z = static_cast<unsigned char*>(std::calloc(n, 1));
    CHECK(z != nullptr && owns(z));
    bool all_zero = true;
    for (std::size_t i = 0; i < n; ++i) all_zero = all_zero && z[i] == 0;
    CHECK(all_zero);
    std::memset(z, 0xcd, n);
    std::free(z);
  }
  // A calloc past the peak: the pool releases its dirty free segments to grow, and in
  // mode:pool their pages move into the new segment (coalesce) - it must read zero anyway.
  {
    const std::size_t n = 256 * kMiB;
    auto* z = static_cast<unsigned char*>(std::calloc(n, 1));
    CHECK(z != nullptr && owns(z));
    bool all_zero = true;
    for (std::size_t i = 0; i < n; i += 64) all_zero = all_zero && z[i] == 0;
    CHECK(all_zero);
    std::free(z);
  }
  auto* tiny = static_cast<int*>(std::calloc(10, sizeof(int)));
  CHECK(tiny != nullptr && tiny[9] == 0);
  std::free(tiny);
}

void realloc_checks() {
  const std::size_t t = g_threshold;
  auto* p = static_cast<unsigned char*>(std::malloc(1000));
  fill(p, 1000, 7);
  p = static_cast<unsigned char*>(std::realloc(p, 4 * t));  // glibc -> pool
  CHECK(p != nullptr && owns(p) && holds(p, 1000, 7));
  fill(p, 4 * t, 9);
  p = static_cast<unsigned char*>(std::realloc(p, 16 * t));  // pool -> pool, grows
  CHECK(p != nullptr && owns(p) && holds(p, 4 * t, 9));
  fill(p, 100, 11);
  p = static_cast<unsigned char*>(std::realloc(p, 100));  // pool -> glibc
  CHECK(p != nullptr && !owns(p) && holds(p, 100, 11));
  p = static_cast<unsigned char*>(std::realloc(p, t));  // glibc -> pool at the threshold
  CHECK(p != nullptr && owns(p) && holds(p, 100, 11));
  CHECK(std::realloc(p, 0) == nullptr);  // frees, like glibc
  p = static_cast<unsigned char*>(std::realloc(nullptr, 2 * t));
  CHECK(p != nullptr && owns(p));
  errno = 0;
  CHECK(std::realloc(p, opaque(SIZE_MAX - 4096)) == nullptr && errno == ENOMEM);
  std::free(p);  // untouched by the failed realloc
}

void alignment_checks() {
  for (std::size_t alignment = 1; alignment <= 16 * kMiB; alignment *= 2) {
    for (std::size_t n : {std::size_t{1}, std::size_t{4000}, g_threshold, 5 * kMiB + 7}) {
      void* a = memalign(alignment, n);
      CHECK(a != nullptr && reinterpret_cast<std::uintptr_t>(a) % alignment == 0);
      CHECK(n < g_threshold || owns(a));
      fill(a, n, 3);
      std::free(a);
      void* b = aligned_alloc(alignment, n);
      CHECK(b != nullptr && reinterpret_cast<std::uintptr_t>(b) % alignment == 0);
      std::free(b);
      void* c = nullptr;
      const int rc = posix_memalign(&c, alignment, n);
      if (alignment < sizeof(void*)) {
        CHECK(rc == EINVAL);
      } else {
        CHECK(rc == 0 && reinterpret_cast<std::uintptr_t>(c) % alignment == 0);
        CHECK(malloc_usable_size(c) >= n);
        std::free(c);
      }
    }
  }
  void* d = nullptr;
  CHECK(posix_memalign(&d, 24, 100) == EINVAL);
  for (std::size_t odd : {std::size_t{0}, std::size_t{24}, std::size_t{3000}}) {  // as glibc
    void* e = memalign(odd, g_big);
    CHECK(e != nullptr && owns(e));
    std::free(e);
  }
  void* v = valloc(g_big);
  CHECK(v != nullptr && reinterpret_cast<std::uintptr_t>(v) % 4096 == 0 && owns(v));
  std::free(v);
  void* pv = pvalloc(1);
  CHECK(pv != nullptr && reinterpret_cast<std::uintptr_t>(pv) % 4096 == 0);
  CHECK(malloc_usable_size(pv) >= 4096);
  std::free(pv);
}

struct alignas(4096) Page {
  unsigned char bytes[4096];
};

void new_delete_checks() {
  auto* floats = new float[4 * kMiB];  // 16 MiB through operator new[]
  CHECK(owns(floats));
  floats[4 * kMiB - 1] = 1.0f;
  delete[] floats;
  auto* pages = new Page[1024];  // aligned operator new[] (4 MiB)
  CHECK(owns(pages) && reinterpret_cast<std::uintptr_t>(pages) % 4096 == 0);
  delete[] pages;
  std::vector<double> grow;
  for (int i = 0; i < 2'000'000; ++i) grow.push_back(i);  // crosses the threshold growing
  CHECK(owns(grow.data()) && grow[1'999'999] == 1'999'999.0);
  auto small = std::make_unique<int>(5);
  CHECK(!owns(small.get()));
}

void worker(unsigned seed, int rounds, std::atomic<int>* errors) {
  std::mt19937 rng(seed);
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < rounds; ++i) {
    if (live.size() < 16 && (rng() % 3 != 0 || live.empty())) {
      const std::size_t n = rng() % 2 == 0 ? 16 + rng() % 8192 : g_threshold + rng() % (8 * kMiB);
      void* p = rng() % 4 == 0 ? std::calloc(1, n) : std::malloc(n);
      if (p == nullptr) {
        std::fprintf(stderr, "allocation of %zu bytes failed\n", n);
        errors->fetch_add(1);
        continue;
      }
      fill(p, n, static_cast<unsigned char>(n));
      live.emplace_back(p, n);
    } else {
      const std::size_t k = rng() % live.size();
      auto [p, n] = live[k];
      if (!holds(p, n, static_cast<unsigned char>(n))) {
        std::fprintf(stderr, "block %p of %zu bytes lost its contents\n", p, n);
        errors->fetch_add(1);
      }
      if (rng() % 4 == 0) {
        const std::size_t m = rng() % 2 == 0 ? 64 : g_threshold + rng() % (4 * kMiB);
        void* q = std::realloc(p, m);
        const std::size_t kept = m < n ? m : n;
        if (q == nullptr ||
            (kept > 0 && static_cast<unsigned char*>(q)[0] != static_cast<unsigned char>(n))) {
          std::fprintf(stderr, "realloc %p of %zu to %zu bytes: %p\n", p, n, m, q);
          errors->fetch_add(1);
        }
        live[k] = {q, m};
        fill(q, m, static_cast<unsigned char>(m));
      } else {
        std::free(p);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  for (auto [p, n] : live) std::free(p);
}

void thread_and_fork_checks() {
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 8; ++t) threads.emplace_back(worker, t + 1, 1500, &errors);
  // fork() while the threads allocate: the child must be able to allocate (no lock left
  // held by a thread that does not exist in it).
  for (int f = 0; f < 6; ++f) {
    const pid_t child = fork();
    if (child == 0) {
      std::atomic<int> child_errors{0};
      worker(100 + static_cast<unsigned>(f), 400, &child_errors);
      std::thread helper(worker, 200u, 200, &child_errors);
      helper.join();
      _exit(child_errors.load() == 0 ? 0 : 3);
    }
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
}

// Runs `bad` in a child with stderr captured; it must die of SIGABRT saying "invalid pointer".
void expect_abort(void (*bad)()) {
  int pipe_fds[2];
  CHECK(pipe(pipe_fds) == 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    bad();
    _exit(0);  // not reached when the drop-in aborts
  }
  close(pipe_fds[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(text.find("invalid pointer") != std::string::npos);
  if (text.find("invalid pointer") == std::string::npos)
    std::fprintf(stderr, "got: %s\n", text.c_str());
}

void foreign_free_checks() {
  expect_abort([] {
    auto* p = static_cast<unsigned char*>(opaque(std::malloc(g_big)));
    std::free(opaque(p + 4096));  // inside the pool's range, not an allocation
  });
  expect_abort([] {
    void* p = opaque(std::malloc(g_big));
    std::free(p);
    std::free(opaque(p));  // double free
  });
}

int run_all() {
  early_checks();
  basics();
  calloc_checks();
  realloc_checks();
  alignment_checks();
  new_delete_checks();
  thread_and_fork_checks();
  foreign_free_checks();
  return 0;
}

// Requests below the threshold go to glibc. Kept (the default): a 512 KiB block comes from
// its heap, not an mmap of its own, and freeing 8 MiB at the heap's top does not trim it.
// glibc's defaults: a fresh process mmaps a 512 KiB block (its mmap threshold starts at
// 128 KiB). mallinfo2 counts mmap'd blocks (hblks) and the heaps' bytes (arena).
int run_system_heap(bool kept) {
  const std::size_t blocks_before = mallinfo2().hblks;
  void* volatile half = std::malloc(512 * 1024);
  CHECK(half != nullptr && !owns(half));
  const std::size_t blocks_after = mallinfo2().hblks;
  std::free(half);
  if (!kept) {
    CHECK(blocks_after == blocks_before + 1);
    return 0;
  }
  CHECK(blocks_after == blocks_before);
  std::vector<void*> quarters;
  for (int i = 0; i < 32; ++i) quarters.push_back(std::malloc(256 * 1024));
  const std::size_t heap_full = mallinfo2().arena;
  for (auto it = quarters.rbegin(); it != quarters.rend(); ++it) std::free(*it);
  CHECK(mallinfo2().arena == heap_full);  // nothing trimmed
  CHECK(heap_full >= 8 * kMiB);
  return 0;
}

// SDALLOC_CONF=capacity:16MiB: requests beyond the cap still succeed, from glibc.
int run_capacity() {
  std::vector<void*> blocks;
  int outside = 0;
  for (int i = 0; i < 8; ++i) {
    void* p = std::malloc(4 * kMiB);
    CHECK(p != nullptr);
    std::memset(p, 1, 4 * kMiB);
    outside += owns(p) ? 0 : 1;
    blocks.push_back(p);
  }
  CHECK(outside > 0 && outside < 8);
  // A calloc glibc serves while the pool is full is glibc's calloc: zero, without the drop-in
  // writing (and so faulting in) every page of a block glibc just mapped.
  const std::size_t before = resident_bytes();
  auto* zeroed = static_cast<unsigned char*>(std::calloc(1, g_big * 8));
  const std::size_t after = resident_bytes();
  CHECK(zeroed != nullptr && !owns(zeroed));
  CHECK(after < before + 8 * kMiB);
  if (zeroed != nullptr) {
    for (std::size_t i = 0; i < g_big * 8; i += 4096) CHECK(zeroed[i] == 0);
  }
  std::free(zeroed);
  for (void* p : blocks) std::free(p);
  return 0;
}

// A bad SDALLOC_CONF: the drop-in is off, everything comes from glibc.
int run_off() {
  void* p = std::malloc(g_big);
  CHECK(p != nullptr && !owns(p));
  std::memset(p, 1, g_big);
  std::free(p);
  return 0;
}

// mode:planned with marked steps: the same sequence each step, served from the arena later.
int run_steps() {
  auto begin = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "sdalloc_preload_begin_step"));
  auto end = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "sdalloc_preload_end_step"));
  CHECK(begin != nullptr && end != nullptr);
  if (begin == nullptr || end == nullptr) return 1;
  CHECK(end() == -1);  // outside a step
  for (int step = 0; step < 5; ++step) {
    CHECK(begin() == 0);
    void* a = opaque(std::malloc(4 * kMiB));
    void* b = opaque(std::malloc(2 * kMiB));
    fill(a, 4 * kMiB, 1);
    std::free(a);
    void* c = opaque(std::malloc(6 * kMiB));
    fill(c, 6 * kMiB, 2);
    std::free(b);
    std::free(c);
    CHECK(owns(a) && owns(c));
    CHECK(end() == 0);
  }
  return 0;
}

// mode:planned without marks: a loop the drop-in must find the step of by itself.
int run_autostep() {
  std::vector<void*> weights;
  for (int i = 0; i < 20; ++i) weights.push_back(opaque(std::malloc((i % 3 + 1) * kMiB)));
  for (int step = 0; step < 60; ++step) {
    void* a = opaque(std::malloc(4 * kMiB));
    void* b = opaque(std::malloc(2 * kMiB));
    fill(a, 4 * kMiB, 1);
    std::free(a);
    void* c = opaque(std::malloc(6 * kMiB));
    void* d = opaque(std::calloc(1, 3 * kMiB));
    CHECK(static_cast<unsigned char*>(d)[3 * kMiB - 1] == 0);
    fill(c, 6 * kMiB, 2);
    fill(d, 3 * kMiB, 3);
    std::free(b);
    std::free(c);
    std::free(d);
  }
  for (void* w : weights) std::free(w);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  g_owns = reinterpret_cast<OwnsFn>(dlsym(RTLD_DEFAULT, "sdalloc_preload_owns"));
  auto threshold = reinterpret_cast<ThresholdFn>(dlsym(RTLD_DEFAULT, "sdalloc_preload_threshold"));
  if (g_owns == nullptr || threshold == nullptr) {
    std::fprintf(stderr, "libsdalloc_preload.so is not preloaded (LD_PRELOAD)\n");
    return 2;
  }
  const std::string what = argc > 1 ? argv[1] : "all";
  g_threshold = threshold();
  if (what == "off") {
    CHECK(g_threshold == 0);
    run_off();
  } else {
    CHECK(g_threshold >= 4096);
    if (what == "all") run_all();
    if (what == "capacity") run_capacity();
    if (what == "steps") run_steps();
    if (what == "autostep") run_autostep();
    if (what == "system_heap") run_system_heap(true);
    if (what == "system_heap_default") run_system_heap(false);
  }
  if (g_failures == 0) std::printf("preload_stress %s: all checks held\n", what.c_str());
  return g_failures == 0 ? 0 : 1;
}
