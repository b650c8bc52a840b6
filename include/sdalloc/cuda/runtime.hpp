// sdalloc/cuda/runtime.hpp - is CUDA usable here, and how many devices are there?
//
// sdalloc_cuda links the CUDA runtime statically (libcudart_static), which loads the driver
// (libcuda.so.1) only when a CUDA function is first called; driver-API functions (cuMem*)
// are looked up through the runtime (cudaGetDriverEntryPointByVersion). So a program built
// with sdalloc_cuda starts on any machine; where no driver or device is present, these
// queries answer "no" and every CUDA resource's constructor throws CudaError saying why.
// A program picks its resources with available() and falls back to host ones.
//
// Thread-safe; each call asks the runtime afresh (cheap after the first).
#pragma once

#include <string>

namespace sdalloc::cuda {

// True when the CUDA runtime finds a driver and at least one device.
bool available();

// Number of CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// Why available() is false, e.g. "cudaGetDeviceCount failed: cudaErrorInsufficientDriver
// (CUDA driver version is insufficient for CUDA runtime version)" or "no CUDA device";
// empty when CUDA is available.
std::string unavailable_reason();

// Version numbers as CUDA encodes them (1000 * major + 10 * minor, e.g. 13000):
// the runtime sdalloc_cuda was built with, and the installed driver (0 when none).
int runtime_version();
int driver_version();

// Whether a stream (a cudaStream_t, passed as void* so callers need no CUDA header) is
// capturing a CUDA graph, from cudaStreamIsCapturing, which is legal during a capture.
// While a stream captures, cudaMalloc, cudaEventQuery, cudaStreamQuery and device-wide
// synchronisation invalidate the capture, and memory a graph uses must not be reused while
// the graph lives: an allocator asks this before serving a stream. kUnknown: the runtime
// cannot tell (e.g. cudaErrorStreamCaptureImplicit, the legacy stream while another stream
// captures in global mode), which callers must treat as capturing. Never throws.
enum class StreamCapture { kNone, kActive, kInvalidated, kUnknown };
StreamCapture stream_capture(void* stream) noexcept;

}  // namespace sdalloc::cuda
