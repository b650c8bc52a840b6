// policies/planned_arena/arena.cpp - one arena's occupancy, and the lifetime of the arena
// the plans share.
#include "policies/planned_arena/arena.hpp"

#include <algorithm>
#include <string>

#include "core/bits.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/resources/host_resource.hpp"  // prefault_host_pages

namespace sdalloc::planned_arena_detail {

// ---- Arena: one reservation and which slot lives where ----------------------------------

Arena::Arena(Stream stream, std::size_t size, std::size_t alignment, bool aligned_source)
    : stream_(stream),
      size_(size),
      alignment_(alignment),
      // The upstream guarantees kMinAlignment; stricter planned alignments need slack to
      // align the base.
      segment_bytes_(
          size + (!aligned_source && alignment > kMinAlignment ? alignment - kMinAlignment : 0)) {}

void Arena::occupy(std::shared_ptr<const StepPlan> plan) {
  occupant_.assign(plan->offsets.size(), -1);
  requested_.assign(plan->slots.size(), 0);
  plan_ = std::move(plan);
}

void* Arena::place(std::size_t k, std::size_t bytes) {
  const Slot& slot = plan_->slots[k];
  if (occupant_[slot.offset_index] != -1) return nullptr;
  occupant_[slot.offset_index] = static_cast<std::int64_t>(k);
  requested_[k] = bytes;
  ++live_count_;
  live_bytes_ += bytes;
  allocated_bytes_ += slot.rounded;
  return reinterpret_cast<void*>(base_ + slot.offset);
}

std::int64_t Arena::live_slot_at(std::uintptr_t p, std::size_t* index) const {
  if (!contains(p) || plan_ == nullptr) return -1;
  const std::vector<std::size_t>& offsets = plan_->offsets;
  const std::size_t offset = p - base_;
  const auto pos = std::lower_bound(offsets.begin(), offsets.end(), offset);
  if (pos == offsets.end() || *pos != offset) return -1;
  *index = static_cast<std::size_t>(pos - offsets.begin());
  return occupant_[*index];
}

void Arena::vacate(std::size_t index, std::size_t k) {
  occupant_[index] = -1;
  --live_count_;
  live_bytes_ -= requested_[k];
  allocated_bytes_ -= plan_->slots[k].rounded;
  requested_[k] = 0;
}

void Arena::check_invariants() const {
  const auto broken = [](const char* what) {
    throw Error(std::string("PlannedArena invariant broken: ") + what);
  };
  std::size_t count = 0;
  std::size_t live = 0;
  std::size_t allocated = 0;
  if (plan_ != nullptr) {
    if (occupant_.size() != plan_->offsets.size()) broken("occupant table size");
    for (std::size_t i = 0; i < occupant_.size(); ++i) {
      if (occupant_[i] < 0) continue;
      const auto k = static_cast<std::size_t>(occupant_[i]);
      if (k >= plan_->slots.size()) broken("an occupant names no slot of the plan");
      const Slot& slot = plan_->slots[k];
      if (slot.offset_index != i) broken("an occupant sits at another slot's offset");
      if (slot.offset + slot.rounded > size_) broken("a live buffer ends past the arena");
      ++count;
      live += requested_[k];
      allocated += slot.rounded;
    }
  }
  if (count != live_count_) broken("the arena's live count disagrees with its buffers");
  if (live != live_bytes_) broken("the arena's live bytes disagree with its buffers");
  if (allocated != allocated_bytes_) broken("the arena's allocated bytes disagree");
  if (count != 0 && !reserved()) broken("live buffers in a released arena");
}

void Arena::add_blocks(std::vector<BlockLayout>& blocks, std::uintptr_t end) const {
  auto at = reinterpret_cast<std::uintptr_t>(segment_);
  for (std::size_t i = 0; i < occupant_.size(); ++i) {
    if (occupant_[i] < 0) continue;
    const auto k = static_cast<std::size_t>(occupant_[i]);
    const std::size_t rounded = plan_->slots[k].rounded;
    const std::uintptr_t start = base_ + plan_->offsets[i];
    if (start > at) blocks.push_back({at, start - at, 0, BlockState::kFree});
    blocks.push_back({start, rounded, requested_[k], BlockState::kLive});
    at = start + rounded;
  }
  if (end > at) blocks.push_back({at, end - at, 0, BlockState::kFree});
}

void Arena::add_layout(PoolLayout& layout) const {
  if (!reserved()) return;
  SegmentLayout segment;
  segment.address = reinterpret_cast<std::uintptr_t>(segment_);
  segment.size = segment_bytes_;
  segment.stream = stream_;
  add_blocks(segment.blocks, segment.address + segment.size);
  layout.segments.push_back(std::move(segment));
}

// ---- SharedArena: reserving, growing, retiring, trimming --------------------------------

SharedArena::~SharedArena() {
  wait_for_users();
  if (current_) release(*current_);
  for (auto& arena : retired_) release(*arena);
}

bool SharedArena::holds(const StepPlan& plan) const {
  return current_ && plan.size <= current_->size() && plan.alignment <= current_->alignment();
}

bool SharedArena::grow_for(const StepPlan& plan, Stream stream, bool no_plans_left) {
  auto arena = std::make_unique<Arena>(
      stream, std::max(plan.size, current_ ? current_->size() : 0),
      std::max(plan.alignment, current_ ? current_->alignment() : kRounding), from_pool_);
  // An empty old arena's memory goes first, so that the upstream never holds both. Should
  // the new arena be refused, the old one stays for the plans there are (reserved again
  // at the next begin_step() if it was released here).
  if (current_ && current_->live_count() == 0) release(*current_);
  if (!reserve(*arena)) {
    if (no_plans_left) retire();
    return false;
  }
  retire();  // released above, or kept until the buffers still in it are freed
  current_ = std::move(arena);
  return true;
}

bool SharedArena::reserve_again() {
  if (current_ && !current_->reserved()) return reserve(*current_);
  return true;
}

void SharedArena::retire() {
  if (!current_) return;
  if (current_->live_count() == 0) {
    release(*current_);
  } else {
    retired_.push_back(std::move(current_));
  }
  current_.reset();
}

std::size_t SharedArena::trim() {
  if (!current_ || !current_->reserved() || current_->live_count() != 0) return 0;
  const std::size_t released = current_->segment_bytes();
  release(*current_);
  return released;
}

// Takes the arena's memory from the upstream or the pool; false (counted) when it is refused:
// for a lack of memory, or any other failure of the memory beneath (a map the pool rolled
// back), which leaves the source as it was, so the plan is given up rather than the step.
bool SharedArena::reserve(Arena& arena) {
  try {
    if (from_pool_) {
      // The pool moves its free pages (the recording's) under the arena: nothing to trim.
      arena.segment_ = pool_.allocate(arena.segment_bytes_, arena.alignment_, arena.stream_);
    } else {
      // What the fallback pool cached is not needed once the arena serves the step;
      // returning it first keeps the peak at the arena, not arena + cache.
      pool_.trim();
      arena.segment_ = upstream_.allocate(arena.segment_bytes_, arena.stream_);
    }
  } catch (const Error&) {
    ++figures_.failures;
    return false;
  }
  ++figures_.reservations;
  if (prefault_ && !from_pool_ && !prefault_host_pages(arena.segment_, arena.segment_bytes_)) {
    // Only a speed-up: the pages will still be faulted in on first use.
    ++figures_.prefault_failures;
  }
  arena.base_ = round_up(reinterpret_cast<std::uintptr_t>(arena.segment_), arena.alignment_);
  return true;
}

void SharedArena::release(Arena& arena) {
  if (!arena.reserved()) return;
  wait_for_users();
  // The arena leaves the books whatever the upstream answers: one it refuses is left to it.
  try {
    if (from_pool_) {
      pool_.deallocate(arena.segment_, arena.segment_bytes_, arena.stream_);
    } else {
      upstream_.deallocate(arena.segment_, arena.segment_bytes_, arena.stream_);
    }
    ++figures_.releases;
  } catch (...) {
    ++figures_.failed_releases;
  }
  arena.segment_ = nullptr;
}

// ---- serving and freeing ----------------------------------------------------------------

Arena* SharedArena::find(std::uintptr_t addr, bool* is_current) const {
  *is_current = current_ && current_->contains(addr);
  if (*is_current) return current_.get();
  for (const auto& arena : retired_) {
    if (arena->contains(addr)) return arena.get();
  }
  return nullptr;
}

void* SharedArena::place(std::size_t k, std::size_t bytes) {
  void* p = current_->place(k, bytes);
  if (p == nullptr) return nullptr;
  ++figures_.allocations;
  return p;
}

void SharedArena::vacate(Arena& arena, std::size_t index, std::size_t k) {
  arena.vacate(index, k);
  ++figures_.frees;
  if (&arena == current_.get() || arena.live_count() != 0) return;
  const auto it = std::find_if(retired_.begin(), retired_.end(),
                               [&](const auto& retired) { return retired.get() == &arena; });
  release(**it);
  retired_.erase(it);
}

void SharedArena::add_users(const std::vector<StreamEvents::Event>& events) {
  waits_.insert(waits_.end(), events.begin(), events.end());
}

void SharedArena::wait_for_users() {
  for (const StreamEvents::Event e : waits_) {
    events_.synchronize(e);
    events_.release(e);
  }
  waits_.clear();
}

// ---- figures and layout -----------------------------------------------------------------

std::size_t SharedArena::reserved_count() const {
  return (current_ && current_->reserved() ? 1 : 0) + retired_.size();
}

template <typename F>
std::size_t SharedArena::sum(F figure) const {
  std::size_t total = current_ ? figure(*current_) : 0;
  for (const auto& arena : retired_) total += figure(*arena);
  return total;
}

ArenaFigures SharedArena::figures() const {
  ArenaFigures f = figures_;
  f.live_bytes = sum([](const Arena& a) { return a.live_bytes(); });
  f.allocated_bytes = sum([](const Arena& a) { return a.allocated_bytes(); });
  f.reserved_bytes = sum([](const Arena& a) { return a.reserved() ? a.segment_bytes() : 0; });
  f.live_allocations = sum([](const Arena& a) { return a.live_count(); });
  f.arenas = reserved_count();
  return f;
}

void SharedArena::add_layout(PoolLayout& layout) const {
  if (from_pool_) {
    if (current_) splice(*current_, layout);
    for (const auto& arena : retired_) splice(*arena, layout);
    return;
  }
  if (current_) current_->add_layout(layout);
  for (const auto& arena : retired_) arena->add_layout(layout);
}

// The pool's live block that is the arena becomes the arena's own blocks (the pool may have
// rounded it up: the rest is free).
void SharedArena::splice(const Arena& arena, PoolLayout& layout) {
  if (!arena.reserved()) return;
  const auto address = reinterpret_cast<std::uintptr_t>(arena.segment_);
  for (SegmentLayout& segment : layout.segments) {
    if (address < segment.address || address >= segment.address + segment.size) continue;
    std::vector<BlockLayout>& blocks = segment.blocks;
    const auto it = std::find_if(blocks.begin(), blocks.end(), [&](const BlockLayout& b) {
      return b.address == address && b.state == BlockState::kLive;
    });
    if (it == blocks.end()) return;
    std::vector<BlockLayout> tiles;
    arena.add_blocks(tiles, it->address + it->size);
    const auto at = blocks.erase(it);
    blocks.insert(at, tiles.begin(), tiles.end());
    return;
  }
}

void SharedArena::check_invariants() const {
  if (current_) current_->check_invariants();
  for (const auto& arena : retired_) arena->check_invariants();
}

}  // namespace sdalloc::planned_arena_detail
