// host_arena.cpp - the units' mapping, locked in chunks on a background thread.
#include "sdalloc/transfer/host_arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sdalloc {

namespace {

constexpr std::size_t kPage = 4096;

std::size_t page_align(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

HostArena::HostArena(StreamDevice& device, const std::vector<std::size_t>& unit_bytes,
                     std::size_t chunk_bytes, bool pin)
    : device_(device), chunk_bytes_(chunk_bytes) {
  if (unit_bytes.empty()) throw InvalidArgument("HostArena: no units");
  if (chunk_bytes_ == 0) throw InvalidArgument("HostArena: the registration chunk is 0 bytes");
  for (const std::size_t b : unit_bytes) {
    if (b == 0) throw InvalidArgument("HostArena: an empty unit");
    offsets_.push_back(bytes_);
    ends_.push_back(bytes_ + b);
    bytes_ += page_align(b);
  }
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemory::describe("host arena", OutOfMemoryInfo{bytes_}, std::strerror(errno));
  }
  base_ = static_cast<std::byte*>(p);
  if (pin) {
    registrar_ = std::thread([this] { register_chunks(); });
  } else {
    refusal_ = "not registered (pin off)";
  }
}

HostArena::~HostArena() {
  stop_ = true;
  if (registrar_.joinable()) registrar_.join();
  for (const auto& [offset, bytes] : chunks_) {
    try {
      device_.unregister_host(base_ + offset, bytes);
    } catch (const std::exception&) {  // nothing to report to from a destructor
    }
  }
  munmap(base_, bytes_);
}

void HostArena::register_chunks() {
  std::size_t start = 0;
  std::size_t unit = 0;
  while (unit < offsets_.size() && !stop_) {
    // Whole units, at least chunk_bytes_ (or the rest): each unit inside one registration.
    std::size_t end = start;
    while (unit < offsets_.size() && (end == start || end - start < chunk_bytes_)) {
      end = offsets_[unit] + page_align(ends_[unit] - offsets_[unit]);
      ++unit;
    }
    try {
      device_.register_host(base_ + start, end - start);
    } catch (const std::exception& error) {
      const std::lock_guard lock(mutex_);
      refusal_ = "registering bytes " + std::to_string(start) + ".." + std::to_string(end) +
                 " of the " + format_size(bytes_) + " arena: " + error.what();
      return;
    }
    {
      const std::lock_guard lock(mutex_);
      chunks_.emplace_back(start, end - start);
    }
    registered_ = end;
    start = end;
  }
}

void HostArena::finish_registration() {
  if (registrar_.joinable()) registrar_.join();
}

bool HostArena::pinned(std::size_t unit) const { return ends_[unit] <= registered_.load(); }

std::string HostArena::refusal() const {
  const std::lock_guard lock(mutex_);
  return refusal_;
}

bool HostArena::unlock_last_chunk() {
  finish_registration();
  const std::lock_guard lock(mutex_);
  if (chunks_.empty()) return false;
  const auto [offset, bytes] = chunks_.back();
  device_.unregister_host(base_ + offset, bytes);
  chunks_.pop_back();
  registered_ = offset;
  if (refusal_.empty()) refusal_ = "unlocked to make room for staging";
  return true;
}

std::size_t HostArena::resident_bytes() const {
  const std::size_t pages = bytes_ / kPage;
  std::vector<unsigned char> in_ram(pages);
  if (mincore(base_, bytes_, in_ram.data()) != 0) {
    throw Error(std::string("HostArena: mincore failed: ") + std::strerror(errno));
  }
  std::size_t resident = 0;
  for (const unsigned char page : in_ram) resident += (page & 1) != 0 ? kPage : 0;
  return resident;
}

}  // namespace sdalloc
