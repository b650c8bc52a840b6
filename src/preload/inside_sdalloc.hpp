// inside_sdalloc.hpp - whether this thread is inside sdalloc's own code, which decides who
// serves the mallocs that code makes.
//
// While a thread runs the pool (or anything else of sdalloc's) on behalf of an entry point,
// its own allocations - vectors, strings, exceptions - must go to glibc: the pool is busy
// serving the request that got there. The entry points (malloc_entry.cpp) send every request
// of a thread inside sdalloc to glibc. Code that calls into the runtime from outside an entry
// point (the drop-in's fuzzer, which checks the pool's invariants) marks itself the same way.
//
// initial-exec TLS, so reading the flag never calls malloc (__tls_get_addr can).
#pragma once

#include <cerrno>

namespace sdalloc::preload {

// Defined in malloc_entry.cpp.
extern thread_local __attribute__((tls_model("initial-exec"))) bool t_inside;

// Marks the thread as inside sdalloc for its lifetime (nests), and keeps the caller's errno
// when asked to: what sdalloc's own code did to errno is not the caller's business.
class InsideScope {
 public:
  InsideScope() : saved_errno_(errno), was_inside_(t_inside) { t_inside = true; }
  ~InsideScope() { t_inside = was_inside_; }
  InsideScope(const InsideScope&) = delete;
  InsideScope& operator=(const InsideScope&) = delete;
  void keep_errno() const { errno = saved_errno_; }

 private:
  int saved_errno_;
  bool was_inside_;
};

}  // namespace sdalloc::preload
