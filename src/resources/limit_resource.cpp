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

}  // namespace sdalloc
