// sdalloc/core/stream.hpp - the stream token every allocation is ordered on.
//
// A stream is an ordered queue of device work (a cudaStream_t on NVIDIA GPUs). sdalloc treats
// it as an opaque handle: memory allocated on stream S may be used by work queued on S, and
// memory freed on S may be handed out again on S at once, because later work on S runs after
// the work that used it. Reuse on another stream needs proof that S has finished (see
// stream_events.hpp). On host resources there is no queued work, so a stream is only a token.
#pragma once

#include <cstdint>

namespace sdalloc {

struct Stream {
  std::uintptr_t handle = 0;  // 0 is the default (legacy) stream

  constexpr Stream() = default;
  constexpr explicit Stream(std::uintptr_t h) : handle(h) {}
  // Accepts any native handle, e.g. a cudaStream_t, without including CUDA headers here.
  template <typename T>
  static Stream from_native(T* native) {
    return Stream(reinterpret_cast<std::uintptr_t>(native));
  }
  template <typename T>
  T* as_native() const {
    return reinterpret_cast<T*>(handle);
  }

  friend constexpr bool operator==(Stream, Stream) = default;
};

inline constexpr Stream kDefaultStream{};

}  // namespace sdalloc
