// VirtualMemoryResource: a table of ranges, each a reservation with chunks mapped from its
// start; grow and coalesce hand chunks from range to range (virtual_memory_resource.hpp).
#include "sdalloc/resources/virtual_memory_resource.hpp"

#include <cstddef>
#include <limits>
#include <new>
#include <utility>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

namespace {

std::uintptr_t key(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

}  // namespace

VirtualMemoryResource::~VirtualMemoryResource() {
  while (!ranges_.empty()) {
    auto node = ranges_.extract(ranges_.begin());
    try {
      std::vector<PhysicalChunk> chunks;
      unmap_into(reinterpret_cast<void*>(node.key()), node.mapped(), kDefaultStream, chunks);
      destroy_all(chunks);
    } catch (const Error&) {  // NOLINT(bugprone-empty-catch): a broken device; leaked
    }
  }
}

std::size_t VirtualMemoryResource::chunk_bytes() const {
  const std::size_t unit = memory_.granularity();
  return kChunkBytes > unit ? kChunkBytes / unit * unit : unit;
}

std::size_t VirtualMemoryResource::ranges() const {
  const std::lock_guard lock(mutex_);
  return ranges_.size();
}

std::size_t VirtualMemoryResource::mapped_bytes() const {
  const std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& entry : ranges_) total += entry.second.mapped;
  return total;
}

std::size_t VirtualMemoryResource::rounded(std::size_t bytes, const char* call) const {
  const std::size_t unit = memory_.granularity();
  // The reservation is twice the range: anything over a quarter of the address space fails.
  if (bytes > std::numeric_limits<std::size_t>::max() / 4) {
    throw OutOfMemory::describe(name() + " " + call, OutOfMemoryInfo{.requested = bytes},
                                "more than the address space can reserve with growth room");
  }
  const std::size_t size = (bytes + unit - 1) / unit * unit;
  const std::size_t ceiling = memory_.physical_ceiling();
  if (ceiling != 0 && size > ceiling) {  // refused at once, not after creating chunks for it
    throw OutOfMemory::describe(
        name() + " " + call,
        OutOfMemoryInfo{.requested = bytes, .capacity = memory_.physical_capacity()},
        "more than the memory can ever hold (" + format_bytes(ceiling) + ")");
  }
  return size;
}

void* VirtualMemoryResource::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  return do_coalesce({}, bytes, stream);
}

void VirtualMemoryResource::do_deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (ptr == nullptr) return;
  const ResourceRange returned{ptr, bytes};
  destroy_all(return_ranges({&returned, 1}, stream, "deallocate"));
}

std::vector<PhysicalChunk> VirtualMemoryResource::return_ranges(
    std::span<const ResourceRange> ranges, Stream stream, const char* call) {
  std::vector<Range> taken = take(ranges, call);
  std::vector<PhysicalChunk> chunks;
  try {
    for (std::size_t i = 0; i < taken.size(); ++i) {
      unmap_into(ranges[i].ptr, taken[i], stream, chunks);
    }
  } catch (...) {
    destroy_all(chunks);  // the ranges are returned whatever happens (resource.hpp)
    throw;
  }
  return chunks;
}

std::vector<VirtualMemoryResource::Range> VirtualMemoryResource::take(
    std::span<const ResourceRange> ranges, const char* call) {
  const std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const bool known = ranges_.contains(key(ranges[i].ptr));
    bool repeated = false;
    for (std::size_t j = 0; j < i; ++j) repeated = repeated || ranges[j].ptr == ranges[i].ptr;
    if (!known || repeated) {
      throw InvalidPointer(name() + " " + call + ": " +
                               (repeated ? "a range given twice" : "not a range it handed out"),
                           ranges[i].ptr);
    }
  }
  std::vector<Range> taken;
  taken.reserve(ranges.size());
  for (const ResourceRange& range : ranges) {
    auto node = ranges_.extract(key(range.ptr));
    taken.push_back(std::move(node.mapped()));
  }
  return taken;
}

void VirtualMemoryResource::unmap_into(void* base, Range& range, Stream stream,
                                       std::vector<PhysicalChunk>& spare) {
  char* at = static_cast<char*>(base);
  for (const PhysicalChunk& chunk : range.chunks) {
    memory_.unmap(at, chunk.bytes, stream);
    spare.push_back(chunk);
    at += chunk.bytes;
  }
  range.chunks.clear();
  range.mapped = 0;
  std::size_t release_bytes = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto it = reservations_.find(range.reservation);
    if (it != reservations_.end() && --it->second.ranges == 0) {
      release_bytes = it->second.bytes;
      reservations_.erase(it);
    }
  }
  if (release_bytes != 0)
    memory_.release(reinterpret_cast<void*>(range.reservation), release_bytes);
}

void VirtualMemoryResource::destroy_all(const std::vector<PhysicalChunk>& chunks) noexcept {
  for (const PhysicalChunk& chunk : chunks) {
    try {
      memory_.destroy(chunk);
    } catch (const Error&) {  // NOLINT(bugprone-empty-catch): a broken device; leaked
    }
  }
}

std::vector<PhysicalChunk> VirtualMemoryResource::fill(char* base, std::size_t from, std::size_t to,
                                                       std::vector<PhysicalChunk> spare,
                                                       Stream stream) {
  std::vector<PhysicalChunk> mapped;
  std::vector<PhysicalChunk> left;
  std::size_t next = 0;  // spare chunks before it are in `mapped` or `left`
  std::size_t at = from;
  try {
    for (; next < spare.size(); ++next) {
      if (at + spare[next].bytes <= to) {
        memory_.map(base + at, spare[next]);  // all or nothing: a failure maps nothing
        mapped.push_back(spare[next]);
        at += spare[next].bytes;
      } else {
        left.push_back(spare[next]);
      }
    }
    destroy_all(left);  // before creating: never more physical memory than needed
    left.clear();
    const std::size_t unit = chunk_bytes();
    while (at < to) {
      const PhysicalChunk fresh = memory_.create(to - at < unit ? to - at : unit);
      try {
        memory_.map(base + at, fresh);
      } catch (...) {
        destroy_all({fresh});
        throw;
      }
      mapped.push_back(fresh);
      at += fresh.bytes;
    }
  } catch (...) {
    std::size_t offset = from;
    for (const PhysicalChunk& chunk : mapped) {
      try {
        memory_.unmap(base + offset, chunk.bytes, stream);
      } catch (const Error&) {  // NOLINT(bugprone-empty-catch): the rollback goes on
      }
      offset += chunk.bytes;
    }
    destroy_all(mapped);
    destroy_all(left);
    destroy_all({spare.begin() + static_cast<std::ptrdiff_t>(next), spare.end()});
    throw;
  }
  return mapped;
}

void* VirtualMemoryResource::do_coalesce(std::span<const ResourceRange> ranges, std::size_t bytes,
                                         Stream stream) {
  std::vector<PhysicalChunk> spare = return_ranges(ranges, stream, "coalesce");
  if (bytes == 0) {
    destroy_all(spare);
    return nullptr;
  }
  std::size_t size = 0;
  void* base = nullptr;
  try {
    size = rounded(bytes, "allocate");
    base = memory_.reserve(2 * size);
  } catch (...) {
    destroy_all(spare);
    throw;
  }
  const std::uintptr_t start = key(base);
  Range range{.reservation = start, .limit = start + 2 * size, .mapped = size, .chunks = {}};
  try {
    const std::lock_guard lock(mutex_);
    reservations_.emplace(start, Reservation{.bytes = 2 * size, .ranges = 1});
  } catch (...) {
    destroy_all(spare);
    memory_.release(base, 2 * size);
    throw;
  }
  try {
    range.chunks = fill(static_cast<char*>(base), 0, size, std::move(spare), stream);
    const std::lock_guard lock(mutex_);
    ranges_.emplace(start, range);
  } catch (...) {
    std::vector<PhysicalChunk> chunks;        // fill maps nothing when it fails; the table's
    unmap_into(base, range, stream, chunks);  // refusal leaves the chunks to unmap
    destroy_all(chunks);
    throw;
  }
  return base;
}

bool VirtualMemoryResource::do_grow(void* ptr, std::size_t /*bytes*/, std::size_t new_bytes,
                                    std::span<const ResourceRange> donors, Stream stream) {
  std::size_t mapped = 0;
  std::size_t room = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto it = ranges_.find(key(ptr));
    if (it == ranges_.end()) {
      throw InvalidPointer(name() + " grow: not a range it handed out", ptr);
    }
    for (const ResourceRange& donor : donors) {
      if (donor.ptr == ptr) throw InvalidArgument(name() + " grow: the range is its own donor");
    }
    mapped = it->second.mapped;
    room = it->second.limit - key(ptr);
  }
  if (new_bytes > room) return false;  // no room left: nothing changes
  std::vector<PhysicalChunk> spare = return_ranges(donors, stream, "grow");
  std::size_t size = 0;
  try {  // the donors are returned whatever happens (resource.hpp)
    size = rounded(new_bytes, "grow");
  } catch (...) {
    destroy_all(spare);
    throw;
  }
  if (size <= mapped) {  // the rounding already covers it
    destroy_all(spare);
    return true;
  }
  std::vector<PhysicalChunk> added =
      fill(static_cast<char*>(ptr), mapped, size, std::move(spare), stream);
  const std::lock_guard lock(mutex_);
  Range& range = ranges_.at(key(ptr));
  range.chunks.insert(range.chunks.end(), added.begin(), added.end());
  range.mapped = size;
  return true;
}

bool VirtualMemoryResource::do_split(void* ptr, std::size_t /*bytes*/, std::size_t first) {
  const std::lock_guard lock(mutex_);
  const auto it = ranges_.find(key(ptr));
  if (it == ranges_.end()) return false;
  Range& range = it->second;
  if (first >= range.mapped) return false;
  std::size_t at = 0;
  std::size_t cut = 0;  // the first chunk of the second part
  while (cut < range.chunks.size() && at < first) at += range.chunks[cut++].bytes;
  if (at != first) return false;  // inside a chunk: chunks are mapped whole
  Range second{
      .reservation = range.reservation,
      .limit = range.limit,
      .mapped = range.mapped - first,
      .chunks = {range.chunks.begin() + static_cast<std::ptrdiff_t>(cut), range.chunks.end()}};
  try {
    ranges_.emplace(key(ptr) + first, std::move(second));
  } catch (const std::bad_alloc&) {
    return false;  // nothing changed yet: the caller keeps the range whole
  }
  ++reservations_.at(range.reservation).ranges;
  range.chunks.resize(cut);
  range.mapped = first;
  range.limit = key(ptr) + first;
  return true;
}

}  // namespace sdalloc
