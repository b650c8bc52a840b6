// planner/deep_stack.hpp - running a deeply recursive computation on a stack big enough for it.
//
// The search (search.cpp) recurses once per buffer it places, so its depth is the number of
// buffers of one component: thousands for one step of a large denoiser.
// At a few hundred bytes a level in a release build (several KiB under AddressSanitizer)
// that overflows a thread's default 8 MiB stack. run_on_deep_stack() runs the work on a
// thread of its own with kDeepStackBytes of stack (address space: the kernel backs only the
// pages the recursion touches) and waits for it; an exception thrown by the work is
// rethrown in the caller. Where no such thread can be made, the work runs on the caller's
// own stack, as before.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <exception>
#include <utility>

namespace sdalloc::planner_detail {

inline constexpr std::size_t kDeepStackBytes = std::size_t{256} << 20;

template <class Work>
void run_on_deep_stack(Work&& work) {
  struct Job {
    Work* work;
    std::exception_ptr error;
    static void* run(void* arg) {
      Job* job = static_cast<Job*>(arg);
      try {
        (*job->work)();
      } catch (...) {
        job->error = std::current_exception();
      }
      return nullptr;
    }
  };
  Job job{&work, nullptr};
  pthread_attr_t attr;
  bool started = false;
  pthread_t thread{};
  if (pthread_attr_init(&attr) == 0) {
    started = pthread_attr_setstacksize(&attr, kDeepStackBytes) == 0 &&
              pthread_create(&thread, &attr, &Job::run, &job) == 0;
    pthread_attr_destroy(&attr);
  }
  if (!started) {
    work();
    return;
  }
  pthread_join(thread, nullptr);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace sdalloc::planner_detail
