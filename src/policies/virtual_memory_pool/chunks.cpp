// chunks.cpp - the physical chunks of a VirtualMemoryPool: table, spares, cap, trim.
//
// Every chunk the pool holds has a slot in `chunks` (a freed slot is reused) and is either
// mapped at exactly one page of one range or in the spare list. The physical
// cap is claimed (commit) before a chunk is created, so threads creating at once never pass
// it together. chunk_mutex guards the table and the spare lists and is held only for a few
// vector operations, never across a call into the VirtualMemory.

#include <algorithm>
#include <mutex>

#include "policies/virtual_memory_pool/vm_pool_impl.hpp"

namespace sdalloc {

using detail::PoolShard;

// =======================================================================================
// chunks in hand during one attempt

namespace vm_detail {

std::uint32_t Gathered::take() {
  std::vector<std::uint32_t>& from = reused.empty() ? created : reused;
  const std::uint32_t chunk = from.back();
  from.pop_back();
  return chunk;
}

void Gathered::put_back(std::uint32_t chunk) {
  const bool fresh = std::binary_search(created_now.begin(), created_now.end(), chunk);
  (fresh ? created : reused).push_back(chunk);
}

}  // namespace vm_detail

// take() pops from the back: sorting each list by decreasing handle makes the pages of a
// block, mapped at increasing addresses, get increasing handles (see pages.cpp).
void VirtualMemoryPool::Impl::order_for_mapping(Gathered& got) const {
  std::lock_guard lock(chunk_mutex);
  const auto higher_handle_first = [this](std::uint32_t a, std::uint32_t b) {
    return chunks[a].handle > chunks[b].handle;
  };
  std::sort(got.reused.begin(), got.reused.end(), higher_handle_first);
  std::sort(got.created.begin(), got.created.end(), higher_handle_first);
  // Pages to move go under the request in the order of their chunks' handles, as created
  // chunks do. Pages that are neighbours with following handles stay next to each other and
  // move in one call; pages from different places whose handles follow each other land side
  // by side and join into one kernel mapping, so the next move of them is one call too. In
  // address order each move would lay runs from several places side by side, and the runs
  // of a loop that moves pages every step would get shorter with every step.
  std::sort(got.moving.begin(), got.moving.end(),
            [this](const vm_detail::Gathered::Moving& a, const vm_detail::Gathered::Moving& b) {
              return chunks[a.chunk].handle < chunks[b.chunk].handle;
            });
}

// =======================================================================================
// the chunk table and the spares

PhysicalChunk VirtualMemoryPool::Impl::chunk_at(std::uint32_t index) const {
  std::lock_guard lock(chunk_mutex);
  return chunks[index];
}

void VirtualMemoryPool::Impl::take_spares(std::size_t want, std::vector<std::uint32_t>& out) {
  std::lock_guard lock(chunk_mutex);
  while (!spares.empty() && out.size() < want) {
    out.push_back(spares.back());
    spares.pop_back();
  }
}

void VirtualMemoryPool::Impl::give_back_reused(std::vector<std::uint32_t>& reused) {
  if (reused.empty()) return;
  {
    std::lock_guard lock(chunk_mutex);
    spares.insert(spares.end(), reused.begin(), reused.end());
  }
  reused.clear();
  if (options.destroy_spare_chunks) destroy_spares();
}

void VirtualMemoryPool::Impl::give_back(Gathered& got) {
  give_back_reused(got.reused);
  for (std::uint32_t chunk : got.created) destroy_chunk(chunk);
  got.created.clear();
}

// =======================================================================================
// creating and destroying

// Creates up to `want` chunks within the cap. Stops at the first refusal, noting why.
void VirtualMemoryPool::Impl::create_chunks(std::size_t want, std::vector<std::uint32_t>& out,
                                            std::string& failure) {
  const std::size_t page_size = options.page_size;
  for (std::size_t i = 0; i < want; ++i) {
    if (!commit(page_size)) {
      failure = "the physical cap of " + format_bytes(cap()) + " is reached";
      return;
    }
    PhysicalChunk chunk;
    try {
      chunk = memory.create(page_size);
    } catch (const OutOfMemory& e) {
      uncommit(page_size);
      failure = std::string("creating a chunk failed: ") + e.what();
      return;
    } catch (const Error& e) {
      uncommit(page_size);
      throw Error(name() + ": creating a chunk of " + format_bytes(page_size) +
                  " failed: " + e.what());
    }
    try {
      out.push_back(add_chunk(chunk));
    } catch (...) {
      memory.destroy(chunk);
      uncommit(page_size);
      throw;
    }
    counters.physical.add(page_size);
    counters.creates.fetch_add(1, std::memory_order_relaxed);
  }
}

// Claims `bytes` of the physical cap before a chunk is created.
bool VirtualMemoryPool::Impl::commit(std::size_t bytes) {
  std::size_t used = committed.load(std::memory_order_relaxed);
  do {
    const std::size_t limit = cap();
    if (limit != 0 && (used > limit || bytes > limit - used)) return false;
  } while (!committed.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

std::uint32_t VirtualMemoryPool::Impl::add_chunk(PhysicalChunk chunk) {
  std::lock_guard lock(chunk_mutex);
  if (!free_chunk_slots.empty()) {
    const std::uint32_t index = free_chunk_slots.back();
    free_chunk_slots.pop_back();
    chunks[index] = chunk;
    return index;
  }
  free_chunk_slots.reserve(chunks.size() + 1);  // so destroy_chunk cannot fail to push
  chunks.push_back(chunk);
  return static_cast<std::uint32_t>(chunks.size() - 1);
}

void VirtualMemoryPool::Impl::destroy_chunk(std::uint32_t index) {
  PhysicalChunk chunk;
  {
    std::lock_guard lock(chunk_mutex);
    chunk = chunks[index];
    chunks[index] = PhysicalChunk{};
    free_chunk_slots.push_back(index);
  }
  counters.physical.sub(chunk.bytes);
  counters.destroys.fetch_add(1, std::memory_order_relaxed);
  uncommit(chunk.bytes);
  memory.destroy(chunk);
}

std::size_t VirtualMemoryPool::Impl::destroy_spares() {
  std::vector<std::uint32_t> doomed;
  {
    std::lock_guard lock(chunk_mutex);
    doomed.swap(spares);
  }
  std::size_t bytes = 0;
  for (std::uint32_t chunk : doomed) {
    bytes += chunk_at(chunk).bytes;
    destroy_chunk(chunk);
  }
  return bytes;
}

// Unmaps every page wholly inside free space, then destroys every spare.
std::size_t VirtualMemoryPool::Impl::trim() {
  for (PoolShard* shard : shards()) {
    std::vector<std::uint32_t> freed;
    {
      std::lock_guard lock(shard->mutex);
      if (!shard->pending.empty()) shard->collect_pending(events, true);
      try {
        steal_pages(*shard, SIZE_MAX, freed);
      } catch (...) {
        give_back_reused(freed);
        throw;
      }
    }
    give_back_reused(freed);
  }
  return destroy_spares();
}

}  // namespace sdalloc
