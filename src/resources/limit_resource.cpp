// limit_resource.cpp - a capacity cap enforced before the upstream is asked.
//
// The reservation is taken first (CapacityCap::try_reserve), then the upstream is called,
// so concurrent requests can never pass the cap together; if the upstream throws, the
// reservation is given back and the resource is as before.
#include "sdalloc/resources/limit_resource.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

LimitResource::LimitResource(MemoryResource& upstream, std::size_t capacity)
    : upstream_(upstream), cap_(capacity) {}

std::string LimitResource::name() const {
  const std::size_t limit = cap_.limit();
  return limit == kNoLimit ? upstream_.name()
                           : "limit(" + upstream_.name() + ", " + format_size(limit) + ")";
}

namespace {

[[noreturn]] void refuse(const std::string& name, std::size_t bytes,
                         const CapacityCap::Reservation& reservation) {
  const std::size_t used = reservation.used;
  OutOfMemoryInfo info;
  info.requested = bytes;
  info.capacity = reservation.limit;
  throw OutOfMemory::describe(name, info,
                              format_bytes(used) + " of the capacity in use, " +
                                  format_bytes(reservation.limit - used) + " available");
}

}  // namespace

void* LimitResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  const CapacityCap::Reservation reservation = cap_.try_reserve(bytes);
  if (!reservation) refuse(name(), bytes, reservation);

  try {
    return upstream_.allocate(bytes, stream);
  } catch (...) {
    cap_.release(bytes);
    throw;
  }
}

void LimitResource::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (ptr == nullptr) return;
  upstream_.deallocate(ptr, bytes, stream);
  cap_.release(bytes);
}

// The returned ranges' bytes are released first, so the new range may reuse them (for a
// moment, upstream may hold both: the cap counts what this adaptor hands out). Refused,
// the ranges still go back: a zero-byte coalesce returns them and hands out nothing.
void* LimitResource::do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                                 Stream stream) {
  std::size_t returned = 0;
  for (const ResourceRange& range : ranges) returned += range.ptr != nullptr ? range.bytes : 0;
  cap_.release(returned);
  if (bytes == 0) return upstream_.coalesce(ranges, 0, stream);
  const CapacityCap::Reservation reservation = cap_.try_reserve(bytes);
  if (!reservation) {
    upstream_.coalesce(ranges, 0, stream);
    refuse(name(), bytes, reservation);
  }
  try {
    return upstream_.coalesce(ranges, bytes, stream);
  } catch (...) {
    cap_.release(bytes);
    throw;
  }
}

// The cap counts bytes, which a split does not change.
bool LimitResource::do_split(void* ptr, std::size_t bytes, std::size_t first) {
  return upstream_.split(ptr, bytes, first);
}

// The cap sees the net change: the range's new bytes less the donors' returned bytes, which
// the growth may reuse. Beyond the cap the answer is false (nothing changed): a pool then
// takes the path of a new range, which the cap refuses with its full explanation.
bool LimitResource::do_grow(void* ptr, std::size_t bytes, std::size_t new_bytes,
                            std::span<const ResourceRange> donors, Stream stream) {
  std::size_t returned = 0;
  for (const ResourceRange& range : donors) returned += range.ptr != nullptr ? range.bytes : 0;
  const std::size_t extra = new_bytes - bytes;
  const std::size_t reserved = extra > returned ? extra - returned : 0;
  if (reserved != 0 && !cap_.try_reserve(reserved)) return false;
  bool grown = false;
  try {
    grown = upstream_.grow(ptr, bytes, new_bytes, donors, stream);
  } catch (...) {
    cap_.release(reserved + returned);  // the donors went back, the range kept its size
    throw;
  }
  if (!grown) {
    cap_.release(reserved);
    return false;
  }
  cap_.release(returned - (extra - reserved));  // extra - reserved <= returned
  return true;
}

}  // namespace sdalloc
