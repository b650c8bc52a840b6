/* malloc_census.c - libsdalloc_peers_census.so: counts who served a program's memory.
 *
 * Preloaded in front of the drop-in (LD_PRELOAD="libsdalloc_peers_census.so
 * libsdalloc_preload.so"), it passes every malloc, calloc, realloc, posix_memalign,
 * aligned_alloc and memalign on to the next library (the drop-in) and counts the request's
 * bytes as the pool's when the drop-in owns the pointer it returned
 * (sdalloc_preload_owns, include/sdalloc/preload.h), as the system's otherwise. The drop-in's
 * own report counts only what its pool served; this says what share of all the bytes that
 * is, which is what tests/peers/run_peers.py checks ("served most of the bytes").
 *
 * At exit each process writes $SDALLOC_CENSUS_DIR/census.<pid>.json:
 *   {"pid", "pool_requests", "pool_bytes", "system_requests", "system_bytes", "drop_in"}
 * (drop_in: whether sdalloc_preload_owns was found). A fork()ed child starts from zero (its
 * parent counts what came before). Without SDALLOC_CENSUS_DIR it counts and writes nothing.
 * free is passed on too (it counts nothing); the rest of the family reaches the drop-in
 * directly.
 *
 * While dlsym looks the next functions up it may itself call calloc or malloc (glibc keeps
 * a failed lookup's message in malloc'd memory and frees it later): those requests are served
 * from a small static buffer, whose pointers free ignores and realloc copies out of. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void* (*malloc_fn)(size_t);
typedef void* (*calloc_fn)(size_t, size_t);
typedef void* (*realloc_fn)(void*, size_t);
typedef int (*posix_memalign_fn)(void**, size_t, size_t);
typedef void* (*aligned_fn)(size_t, size_t);
typedef void (*free_fn)(void*);
typedef int (*owns_fn)(const void*);

static malloc_fn next_malloc;
static calloc_fn next_calloc;
static realloc_fn next_realloc;
static free_fn next_free;
static posix_memalign_fn next_posix_memalign;
static aligned_fn next_aligned_alloc;
static aligned_fn next_memalign;
static owns_fn drop_in_owns;

static atomic_ullong pool_requests, pool_bytes, system_requests, system_bytes;
static atomic_int resolving;

static _Alignas(64) char bootstrap[1 << 16];
static atomic_size_t bootstrap_used;

static void* bootstrap_alloc(size_t size) {
  size = (size + 63) & ~(size_t)63;
  size_t at = atomic_fetch_add(&bootstrap_used, size);
  if (at + size > sizeof bootstrap) return NULL;
  return bootstrap + at;
}

static int in_bootstrap(const void* p) {
  return (const char*)p >= bootstrap && (const char*)p < bootstrap + sizeof bootstrap;
}

static void count(const void* p, size_t bytes) {
  if (p == NULL) return;
  if (drop_in_owns != NULL && drop_in_owns(p)) {
    atomic_fetch_add_explicit(&pool_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool_bytes, bytes, memory_order_relaxed);
  } else {
    atomic_fetch_add_explicit(&system_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&system_bytes, bytes, memory_order_relaxed);
  }
}

static void reset_in_child(void) {
  atomic_store(&pool_requests, 0);
  atomic_store(&pool_bytes, 0);
  atomic_store(&system_requests, 0);
  atomic_store(&system_bytes, 0);
}

/* A function pointer from dlsym (memcpy: ISO C has no cast from object to function pointer). */
static void lookup(void* handle, const char* name, void* out, size_t size) {
  void* symbol = dlsym(handle, name);
  memcpy(out, &symbol, size);
}

static void resolve(void) {
  if (next_malloc != NULL) return;
  atomic_store(&resolving, 1);
  lookup(RTLD_NEXT, "calloc", &next_calloc, sizeof next_calloc);
  lookup(RTLD_NEXT, "realloc", &next_realloc, sizeof next_realloc);
  lookup(RTLD_NEXT, "free", &next_free, sizeof next_free);
  lookup(RTLD_NEXT, "posix_memalign", &next_posix_memalign, sizeof next_posix_memalign);
  lookup(RTLD_NEXT, "aligned_alloc", &next_aligned_alloc, sizeof next_aligned_alloc);
  lookup(RTLD_NEXT, "memalign", &next_memalign, sizeof next_memalign);
  lookup(RTLD_DEFAULT, "sdalloc_preload_owns", &drop_in_owns, sizeof drop_in_owns);
  lookup(RTLD_NEXT, "malloc", &next_malloc, sizeof next_malloc);
  atomic_store(&resolving, 0);
}

static int bootstrapping(void) { return atomic_load(&resolving) != 0; }

void* malloc(size_t size) {
  if (bootstrapping()) return bootstrap_alloc(size);
  resolve();
  void* p = next_malloc(size);
  count(p, size);
  return p;
}

void* calloc(size_t n, size_t size) {
  if (bootstrapping()) return bootstrap_alloc(n * size); /* static: already zero */
  resolve();
  void* p = next_calloc(n, size);
  count(p, n * size);
  return p;
}

void free(void* p) {
  if (p == NULL || in_bootstrap(p)) return;
  resolve();
  next_free(p);
}

void* realloc(void* old, size_t size) {
  if (bootstrapping()) return bootstrap_alloc(size);
  resolve();
  if (old != NULL && in_bootstrap(old)) {
    /* Its size is unknown: copy what can be there (the buffer's end bounds it). */
    void* p = next_malloc(size);
    if (p != NULL) {
      size_t room = (size_t)(bootstrap + sizeof bootstrap - (char*)old);
      memcpy(p, old, size < room ? size : room);
    }
    count(p, size);
    return p;
  }
  void* p = next_realloc(old, size);
  count(p, size);
  return p;
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  resolve();
  int rc = next_posix_memalign(out, alignment, size);
  if (rc == 0) count(*out, size);
  return rc;
}

void* aligned_alloc(size_t alignment, size_t size) {
  resolve();
  void* p = next_aligned_alloc(alignment, size);
  count(p, size);
  return p;
}

void* memalign(size_t alignment, size_t size) {
  resolve();
  void* p = next_memalign(alignment, size);
  count(p, size);
  return p;
}

static void write_census(void) {
  const char* dir = getenv("SDALLOC_CENSUS_DIR");
  if (dir == NULL || *dir == '\0') return;
  char path[4096];
  char text[512];
  snprintf(path, sizeof path, "%s/census.%d.json", dir, (int)getpid());
  int n = snprintf(text, sizeof text,
                   "{\"pid\": %d, \"pool_requests\": %llu, \"pool_bytes\": %llu, "
                   "\"system_requests\": %llu, \"system_bytes\": %llu, \"drop_in\": %s}\n",
                   (int)getpid(), atomic_load(&pool_requests), atomic_load(&pool_bytes),
                   atomic_load(&system_requests), atomic_load(&system_bytes),
                   drop_in_owns != NULL ? "true" : "false");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t written = write(fd, text, (size_t)n);
  (void)written;
  close(fd);
}

__attribute__((constructor)) static void census_start(void) {
  resolve();
  pthread_atfork(NULL, NULL, reset_in_child);
}

__attribute__((destructor)) static void census_end(void) { write_census(); }
