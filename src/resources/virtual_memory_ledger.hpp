// virtual_memory_ledger.hpp - what a VirtualMemory implementation has reserved, created and
// mapped, and the rules of virtual_memory.hpp checked against it.
//
// HostVirtualMemory (anonymous pages + mmap) and the CUDA driver's DriverVirtualMemory (cuMem*)
// keep the same bookkeeping: reserved address ranges (base -> bytes), physical chunks (handle ->
// bytes, mapped or not) and mappings (address -> bytes and chunk), with the byte totals of
// each. Both check every call against it before the system or driver call, so a pool's bug
// is an InvalidArgument instead of clobbered memory; the checks are the questions below,
// and the messages stay each implementation's own.
//
// Invariants: a mapping lies inside one range and overlaps no other mapping; its chunk
// exists and is marked mapped exactly while the mapping exists (add_mapping and
// remove_mapping keep both); each total is the sum of its table's sizes. The ledger does
// not check a call's preconditions itself (the callers ask first, then record), so a
// record call on something that breaks them is a caller's bug.
// Not thread-safe: the owner holds its own mutex around every call. Only std::map
// insertion allocates; an add that throws std::bad_alloc records nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace sdalloc::detail {

class VirtualMemoryLedger {
 public:
  struct Chunk {
    std::size_t bytes = 0;
    bool mapped = false;
  };
  struct Mapping {
    std::size_t bytes = 0;
    std::uint64_t chunk = 0;  // the handle of the chunk mapped there
  };
  using Ranges = std::map<std::uintptr_t, std::size_t>;  // base -> bytes
  using Chunks = std::map<std::uint64_t, Chunk>;         // handle -> chunk
  using Mappings = std::map<std::uintptr_t, Mapping>;    // address -> mapping

  // --- address ranges
  void add_range(std::uintptr_t base, std::size_t bytes);
  // Whether [base, base + bytes) is exactly a range added here.
  bool is_range(std::uintptr_t base, std::size_t bytes) const;
  // The range that holds all of [address, address + bytes) (bytes > 0), or ranges().end().
  Ranges::const_iterator range_holding(std::uintptr_t address, std::size_t bytes) const;
  void remove_range(std::uintptr_t base);  // a range is_range() confirmed

  // --- physical chunks
  void add_chunk(std::uint64_t handle, std::size_t bytes);
  // The chunk made with this handle and size, or nullptr (unknown handle, other size).
  const Chunk* find_chunk(std::uint64_t handle, std::size_t bytes) const;
  void remove_chunk(std::uint64_t handle);  // an unmapped chunk find_chunk() found

  // --- mappings
  // Whether any mapping overlaps [address, address + bytes).
  bool overlaps_mapping(std::uintptr_t address, std::size_t bytes) const;
  // The mapping that starts at `address` with this size, or nullptr.
  const Mapping* find_mapping(std::uintptr_t address, std::size_t bytes) const;
  // Records the mapping and marks its chunk (found unmapped by find_chunk) mapped.
  void add_mapping(std::uintptr_t address, std::uint64_t chunk, std::size_t bytes);
  // Forgets the mapping at `address` (one find_mapping() found) and unmarks its chunk.
  void remove_mapping(std::uintptr_t address);
  // Moves the mapping at `from` (one find_mapping() found) to `to`, where no mapping may
  // be. Allocates nothing (the map's node moves), so it cannot fail: a move and its undo
  // are both safe.
  void move_mapping(std::uintptr_t from, std::uintptr_t to) noexcept;

  // --- what exists now
  const Ranges& ranges() const { return ranges_; }
  const Chunks& chunks() const { return chunks_; }
  const Mappings& mappings() const { return mappings_; }
  std::size_t reserved_bytes() const { return reserved_bytes_; }
  std::size_t physical_bytes() const { return physical_bytes_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }

 private:
  Ranges ranges_;
  Chunks chunks_;
  Mappings mappings_;
  std::size_t reserved_bytes_ = 0;
  std::size_t physical_bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
};

}  // namespace sdalloc::detail
