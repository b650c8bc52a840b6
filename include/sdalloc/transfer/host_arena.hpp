// sdalloc/transfer/host_arena.hpp - one host mapping holding every unit's image back to
// back: the one copy of the model's weights in RAM.
//
// Each unit's image starts on a page (4 KiB) boundary, so every unit lies inside one
// page-locked range. The arena is page-locked in place (StreamDevice::register_host:
// cudaHostRegister on a GPU, mlock on the simulated device) on a background thread, in
// chunks of whole units of about `chunk_bytes`, in order; pinned(unit) says whether a
// unit's chunk is done. A refusal by the operating system (RegistrationRefused) stops the
// registration there: the chunks before stay locked, refusal() says why, and the units
// after are copied through staging (the offloader's documented fallback; where the
// staging itself cannot be locked, the last chunks are unlocked to make room for it).
//
// resident_bytes() is measured, not computed: mincore() over the mapping, the pages of it
// in RAM. The destructor waits for the registration thread, unlocks and unmaps.
// Thread-safe for the queries; the writer of the images is the caller.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/transfer/stream_device.hpp"

namespace sdalloc {

class HostArena {
 public:
  HostArena(StreamDevice& device, const std::vector<std::size_t>& unit_bytes,
            std::size_t chunk_bytes, bool pin = true);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  std::byte* data() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  std::byte* image(std::size_t unit) const { return base_ + offsets_[unit]; }
  std::size_t offset(std::size_t unit) const { return offsets_[unit]; }

  // Waits for the background registration to end (done or refused).
  void finish_registration();
  bool pinned(std::size_t unit) const;
  std::size_t registered_bytes() const { return registered_.load(); }
  std::string refusal() const;
  std::size_t resident_bytes() const;
  // Unlocks the last locked chunk (after finish_registration, with no copy from it in
  // flight), to leave the operating system's limit room for staging; false when none is.
  bool unlock_last_chunk();

 private:
  void register_chunks();

  StreamDevice& device_;
  std::vector<std::size_t> offsets_;
  std::vector<std::size_t> ends_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t chunk_bytes_;
  std::vector<std::pair<std::size_t, std::size_t>> chunks_;  // locked: offset, bytes
  std::atomic<std::size_t> registered_{0};                   // a locked prefix of the arena
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::string refusal_;
  std::thread registrar_;
};

}  // namespace sdalloc
