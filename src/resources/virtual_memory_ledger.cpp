// virtual_memory_ledger.cpp - the tables of a VirtualMemory (virtual_memory_ledger.hpp).
//
// Lookups by address use the ordered maps: the candidate range or mapping is the last one
// starting at or below the address, so each question is one O(log n) search.
#include "resources/virtual_memory_ledger.hpp"

#include <utility>

namespace sdalloc::detail {

// ---------------------------------------------------------------------------------------
// address ranges

void VirtualMemoryLedger::add_range(std::uintptr_t base, std::size_t bytes) {
  ranges_.emplace(base, bytes);
  reserved_bytes_ += bytes;
}

bool VirtualMemoryLedger::is_range(std::uintptr_t base, std::size_t bytes) const {
  const auto it = ranges_.find(base);
  return it != ranges_.end() && it->second == bytes;
}

VirtualMemoryLedger::Ranges::const_iterator VirtualMemoryLedger::range_holding(
    std::uintptr_t address, std::size_t bytes) const {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return ranges_.end();
  --it;
  const std::uintptr_t end = it->first + it->second;
  if (address >= end || bytes > end - address) return ranges_.end();
  return it;
}

void VirtualMemoryLedger::remove_range(std::uintptr_t base) {
  const auto it = ranges_.find(base);
  if (it == ranges_.end()) return;
  reserved_bytes_ -= it->second;
  ranges_.erase(it);
}

// ---------------------------------------------------------------------------------------
// physical chunks

void VirtualMemoryLedger::add_chunk(std::uint64_t handle, std::size_t bytes) {
  chunks_.emplace(handle, Chunk{bytes, false});
  physical_bytes_ += bytes;
}

const VirtualMemoryLedger::Chunk* VirtualMemoryLedger::find_chunk(std::uint64_t handle,
                                                                  std::size_t bytes) const {
  const auto it = chunks_.find(handle);
  return it != chunks_.end() && it->second.bytes == bytes ? &it->second : nullptr;
}

void VirtualMemoryLedger::remove_chunk(std::uint64_t handle) {
  const auto it = chunks_.find(handle);
  if (it == chunks_.end()) return;
  physical_bytes_ -= it->second.bytes;
  chunks_.erase(it);
}

// ---------------------------------------------------------------------------------------
// mappings

bool VirtualMemoryLedger::overlaps_mapping(std::uintptr_t address, std::size_t bytes) const {
  auto it = mappings_.lower_bound(address);
  if (it != mappings_.end() && it->first < address + bytes) return true;
  if (it == mappings_.begin()) return false;
  --it;
  return it->first + it->second.bytes > address;
}

const VirtualMemoryLedger::Mapping* VirtualMemoryLedger::find_mapping(std::uintptr_t address,
                                                                      std::size_t bytes) const {
  const auto it = mappings_.find(address);
  return it != mappings_.end() && it->second.bytes == bytes ? &it->second : nullptr;
}

void VirtualMemoryLedger::add_mapping(std::uintptr_t address, std::uint64_t chunk,
                                      std::size_t bytes) {
  mappings_.emplace(address, Mapping{bytes, chunk});
  if (const auto it = chunks_.find(chunk); it != chunks_.end()) {
    it->second.mapped = true;
  }
  mapped_bytes_ += bytes;
}

void VirtualMemoryLedger::remove_mapping(std::uintptr_t address) {
  const auto it = mappings_.find(address);
  if (it == mappings_.end()) return;
  if (const auto chunk = chunks_.find(it->second.chunk); chunk != chunks_.end()) {
    chunk->second.mapped = false;
  }
  mapped_bytes_ -= it->second.bytes;
  mappings_.erase(it);
}

void VirtualMemoryLedger::move_mapping(std::uintptr_t from, std::uintptr_t to) noexcept {
  auto node = mappings_.extract(from);
  if (node.empty()) return;
  node.key() = to;
  mappings_.insert(std::move(node));
}

}  // namespace sdalloc::detail
