// virtual_memory.cpp - what VirtualMemory does where an implementation adds nothing.

#include "sdalloc/core/virtual_memory.hpp"

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

void VirtualMemory::move(void*, void*, const PhysicalChunk*, std::size_t, Stream) {
  throw InvalidArgument(name() + ": move is not supported here (can_move() is false)");
}

}  // namespace sdalloc
