// block.hpp - the records a stream-ordered pool keeps for its memory (internal).
//
// A Segment is one range obtained from the upstream resource. It is tiled, without gaps,
// by Blocks in address order: `prev`/`next` link address-neighbours inside one segment, so
// freeing a block can merge it with free neighbours in O(1). A free block also sits in a
// FreeBlockIndex (the treap links below); a live block sits in a PointerTable.
//
// Records are plain structs with intrusive links so the pool's hot path never allocates:
// Block records are recycled through a BlockRecycler; Segment records change only on the
// slow path (a system call is made there anyway).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sdalloc/core/stream.hpp"

namespace sdalloc::detail {

struct Segment;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // a multiple of kBlockRounding (block_limits.hpp)
  std::size_t requested = 0;  // bytes asked for while live; 0 while free
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address-neighbours in the same segment
  Block* next = nullptr;
  bool free = true;
  bool indexed = false;  // true while in a FreeBlockIndex
  bool cached = false;   // true while parked, unmerged, in QuickLists
  Block* next_cached = nullptr;

  // FreeBlockIndex (treap keyed by (size, addr)) links.
  Block* left = nullptr;
  Block* right = nullptr;
  std::uint32_t priority = 0;

  // Streams other than the owner's that use this live block (record_stream); rare, so
  // stored out of line. Owned by the block, released on free.
  std::vector<Stream>* other_streams = nullptr;

  void* ptr() const { return reinterpret_cast<void*>(addr); }
  std::uintptr_t end() const { return addr + size; }
  bool is_whole_segment() const { return prev == nullptr && next == nullptr; }
};

struct alignas(64) Segment {  // own cache line: shards on other threads never share it
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool huge = false;    // made for one huge request: its blocks are reused only by such
  bool pinned = false;  // the initial reservation: never released before destruction
  bool used = false;    // a block of it was ever handed out: a stream's work may touch it
  Block* first = nullptr;
  Segment* prev = nullptr;  // the owning shard's segment list
  Segment* next = nullptr;
};

}  // namespace sdalloc::detail
