// virtual_memory.cpp - what VirtualMemory does where an implementation adds nothing.

#include "sdalloc/core/virtual_memory.hpp"

#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

void VirtualMemory::map_run(void*, const PhysicalChunk*, std::size_t) {
  throw InvalidArgument(name() + ": map_run is not supported here (maps_runs() is false)");
}

void VirtualMemory::move(void*, void*, const PhysicalChunk*, std::size_t, Stream) {
  throw InvalidArgument(name() + ": move is not supported here (can_move() is false)");
}

}  // namespace sdalloc
