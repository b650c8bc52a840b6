// stream_gate.hpp - holds a CUDA stream busy until the test opens the gate.
//
// close() queues a host function on the stream (cudaLaunchHostFunc) that waits until
// open() is called: every piece of work queued on the stream after it waits too. So a test
// can prove deterministically that a pool does not reuse memory a busy stream may still
// touch, without timing-dependent kernels. The destructor opens the gate and waits for the
// stream, so a failing test never leaves a stream blocked forever.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace sdalloc::cuda::test {

class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {}
  ~StreamGate() {
    open();
    (void)cudaStreamSynchronize(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Returns cudaSuccess when the waiting host function was queued.
  cudaError_t close() {
    open_.store(false);
    return cudaLaunchHostFunc(stream_, &wait_until_open, this);
  }
  void open() { open_.store(true); }

 private:
  static void CUDART_CB wait_until_open(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    while (!gate->open_.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  cudaStream_t stream_;
  std::atomic<bool> open_{true};
};

// A non-blocking stream of the current device, destroyed with the object.
class OwnedStream {
 public:
  OwnedStream() { ok_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess; }
  ~OwnedStream() {
    if (ok_) (void)cudaStreamDestroy(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  bool ok() const { return ok_; }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  bool ok_ = false;
};

}  // namespace sdalloc::cuda::test
