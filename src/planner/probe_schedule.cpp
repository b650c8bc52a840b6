// probe_schedule.cpp - the probes plan() runs after the greedy placements (probe_schedule.hpp).
//
// A probe asks the search (search.cpp) one question: is there a plan within C bytes? It
// answers found (a plan, often below C), infeasible (a proof) or out of time. With a
// capacity that is the only question. Without one, plan() minimises, keeping the best plan:
//
//  1. the lower bound first, with kBoundProbeShare of the time left: the search is at its
//     most pruned there, and the bound is often reachable (9 of MiniMalloc's 11 instances);
//  2. a bisection between the lowest arena not ruled out and the best plan, each probe with
//     kBisectProbeShare of the time left, its targets on the grid every plan's arena is on
//     (arena_step). A time-out moves the bisection up without proving anything;
//  3. sweeps of the kSweepDepth targets just below the best plan, with short probes. The
//     search's time to a plan jumps with the capacity and with the order it ranks buffers
//     in (on MiniMalloc's D: 28 s within 1030144 bytes in the static orders, 5035 nodes
//     under seed 11), a heavy-tailed distribution, so each sweep ranks under a new
//     seed (SearchSettings::order_seed) and the budgets follow Luby's restart schedule. A
//     plan found moves the sweep below it.
// On one thread these run in that order. With more (PlannerOptions::threads), the other
// threads sweep from the start, beside the bound probe and the bisection, and the calling
// thread joins them when its bisection is done: the probes are independent searches over
// the same buffers, so the cores a machine has become probes. The threads share the best
// plan, the bound proven and the sweep's targets under one mutex; a plan found cancels the
// running probes it makes pointless (those within a capacity at or above it).
#include "planner/probe_schedule.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "planner/search.hpp"

namespace sdalloc::planner_detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kBoundProbeShare = 0.3;
constexpr double kBisectProbeShare = 0.1;
// (Probes of 0.3 s at each 1 KiB from 1040 KiB down to 990 KiB find a plan on 10 of the 51
// targets on MiniMalloc's D, 24 on J, scattered.)
constexpr std::uint64_t kSweepDepth = 12;
constexpr std::chrono::milliseconds kFirstSweepProbe{30};
// A probe that is out of time on its first look at the clock has learnt nothing.
constexpr std::chrono::milliseconds kMinimumProbe{50};
// Under a node limit (PlannerOptions::max_search_nodes) the probes share the nodes left as
// they share the time, and each may take at least this many.
constexpr std::uint64_t kMinimumProbeNodes = 1024;
// Under a node limit the sweeps' probes are sized in nodes, not time: kFirstSweepProbe
// made the plan depend on the machine's speed and on what else it ran, which a node limit
// is there to rule out (the same problem planned to different sizes from run to run on
// one machine; docs/planner.md has the figures).
constexpr std::uint64_t kFirstSweepProbeNodes = 1024;

// The greatest common divisor of the sizes and of the alignments above 1: offsets built
// from sums of sizes, each rounded up to an alignment, stay multiples of it.
std::uint64_t arena_step(std::span<const Buffer> buffers) {
  std::uint64_t step = 0;
  for (const Buffer& b : buffers) {
    step = std::gcd(step, b.size);
    if (b.alignment > 1) step = std::gcd(step, b.alignment);
  }
  return std::max<std::uint64_t>(step, 1);
}

// value rounded up to a multiple of step, saturating (an arena that large is no target).
std::uint64_t next_multiple(std::uint64_t value, std::uint64_t step) {
  const std::uint64_t rest = value % step;
  if (rest == 0) return value;
  const std::uint64_t gap = step - rest;
  return value > std::numeric_limits<std::uint64_t>::max() - gap
             ? std::numeric_limits<std::uint64_t>::max()
             : value + gap;
}

}  // namespace

std::uint64_t acceptable_arena(std::uint64_t lower_bound, const PlannerOptions& options) {
  const double extra = static_cast<double>(lower_bound) * options.accept_within;
  const auto room = static_cast<double>(std::numeric_limits<std::uint64_t>::max() - lower_bound);
  if (!(extra < room)) return std::numeric_limits<std::uint64_t>::max();
  return lower_bound + static_cast<std::uint64_t>(extra);
}

namespace {

unsigned thread_count(const PlannerOptions& options) {
  // A node limit is there for one answer on every run: one thread keeps it so.
  if (options.max_search_nodes != 0) return 1;
  const unsigned wanted =
      options.threads != 0 ? options.threads : std::max(1U, std::thread::hardware_concurrency());
  return std::min(wanted, PlannerOptions::kMaxThreads);
}

class ProbeSchedule {
 public:
  ProbeSchedule(std::span<const Buffer> buffers, const PlannerOptions& options,
                Clock::time_point start, Clock::time_point deadline, PlanResult& result,
                std::uint64_t& proven_below)
      : buffers_(buffers),
        options_(options),
        start_(start),
        deadline_(deadline),
        step_(arena_step(buffers)),
        acceptable_(options.capacity != 0 ? 0 : acceptable_arena(result.lower_bound, options)),
        result_(result),
        proven_below_(proven_below),
        workers_(thread_count(options)),
        best_arena_(result.plan.arena_size),
        last_progress_(start) {}

  void run() {
    if (options_.capacity != 0) {
      probe(workers_[0], options_.capacity, deadline_, share_of_nodes_left(1.0));
    } else {
      minimise();
    }
    result_.search_nodes = nodes_.load();
  }

 private:
  struct Worker {
    std::atomic<bool> cancel{false};
    std::atomic<std::uint64_t> searching{0};  // nodes of its running probe, for progress
    std::uint64_t target = 0;                 // of its running probe, 0: none (mutex_)
  };
  enum class Answer : std::uint8_t { kFound, kNotFound, kCancelled };

  void minimise() {
    std::vector<std::thread> helpers;
    for (std::size_t i = 1; i < workers_.size(); ++i) {
      try {
        helpers.emplace_back([this, i] { guarded([&] { sweep(workers_[i]); }); });
      } catch (const std::system_error&) {
        break;  // no more threads: the ones there are do the work
      }
    }
    guarded([&] {
      if (probe(workers_[0], result_.lower_bound, share_of_time_left(kBoundProbeShare),
                share_of_nodes_left(kBoundProbeShare)) != Answer::kFound) {
        bisect(workers_[0]);
      }
      sweep(workers_[0]);
    });
    for (std::thread& t : helpers) t.join();
    if (error_) std::rethrow_exception(error_);
  }

  // Runs one thread's part; an exception stops every thread and is rethrown by minimise().
  template <class Work>
  void guarded(Work&& work) {
    try {
      work();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopped_ = true;
      for (Worker& w : workers_) w.cancel.store(true);
      changed_.notify_all();
    }
  }

  // One search for a plan within `target` until `until` or `node_limit` nodes (0: none).
  Answer probe(Worker& w, std::uint64_t target, Clock::time_point until, std::uint64_t node_limit,
               std::uint64_t seed = 0) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return Answer::kCancelled;
      w.target = target;
      w.cancel.store(false);
    }
    SearchResult found;
    try {
      found = search_within(buffers_, target, SearchSettings{until, node_limit, &w.cancel, seed},
                            [&](std::uint64_t nodes) {
                              w.searching.store(nodes, std::memory_order_relaxed);
                              report_progress(target);
                            });
    } catch (...) {
      std::lock_guard lock(mutex_);
      w.target = 0;
      throw;
    }
    std::lock_guard lock(mutex_);
    w.target = 0;
    w.searching.store(0, std::memory_order_relaxed);
    nodes_.fetch_add(found.nodes);
    Answer answer = Answer::kNotFound;
    switch (found.outcome) {
      case SearchOutcome::kFound:
        if (found.plan.arena_size < result_.plan.arena_size) {
          result_.plan = std::move(found.plan);
          result_.method = "search";
          best_arena_.store(result_.plan.arena_size);
          const bool accepted = result_.plan.arena_size <= acceptable_;
          for (Worker& other : workers_) {
            if (other.target != 0 && (accepted || other.target >= result_.plan.arena_size)) {
              other.cancel.store(true);
            }
          }
        }
        answer = Answer::kFound;
        break;
      case SearchOutcome::kInfeasible:
        proven_below_ = std::max(proven_below_, target + 1);  // no plan fits in target
        break;
      case SearchOutcome::kTimedOut:
        if (w.cancel.load()) {
          answer = Answer::kCancelled;
        } else {
          result_.timed_out = true;
        }
        break;
    }
    changed_.notify_all();
    return answer;
  }

  void bisect(Worker& w) {
    std::uint64_t low = 0;
    while (true) {
      std::uint64_t target = 0;
      {
        std::lock_guard lock(mutex_);
        low = std::max(low, next_multiple(proven_below_, step_));  // a sweep may prove more
        if (low >= result_.plan.arena_size || out_of_work()) return;
        const std::uint64_t steps = (result_.plan.arena_size - low) / step_;
        if (steps == 0) return;  // no multiple of step between low and the best
        target = low + (steps - 1) / 2 * step_;
      }
      if (probe(w, target, share_of_time_left(kBisectProbeShare),
                share_of_nodes_left(kBisectProbeShare)) == Answer::kNotFound) {
        low = target + step_;
      }
    }
  }

  void sweep(Worker& w) {
    while (const std::optional<SweepProbe> next = next_sweep_probe()) {
      if (options_.max_search_nodes != 0) {
        const std::uint64_t nodes =
            std::min(share_of_nodes_left(1.0), kFirstSweepProbeNodes * next->restart_term);
        probe(w, next->target, deadline_, nodes, next->seed);
      } else {
        probe(w, next->target,
              std::min(deadline_, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     kFirstSweepProbe * next->restart_term)),
              0, next->seed);
      }
    }
  }

  struct SweepProbe {
    std::uint64_t target;
    std::uint64_t restart_term;  // its budget in first probes' budgets: Luby's sequence
    std::uint64_t seed;
  };

  // The next probe of the sweeps below the best plan; nullopt when the work is done (out of
  // time or nodes, or the best plan proven minimal). Sweep r (from 0) orders the search
  // with seed r (0: the static orders as they are) and gives each probe kFirstSweepProbe
  // times the r-th term of Luby's sequence (1 1 2 1 1 2 4 1 1 2 ...): the restart schedule
  // within a constant factor of the best for any distribution of the time to a plan (Luby,
  // Sinclair, Zuckerman 1993). No (target, seed) is probed twice: a plan found restarts the
  // current sweep below it, with the same seed, at targets it has not reached.
  std::optional<SweepProbe> next_sweep_probe() {
    std::unique_lock lock(mutex_);
    while (true) {
      const std::uint64_t best = result_.plan.arena_size;
      // (The best plan is never below proven_below; steps below it are counted so that no
      // sum or product can pass 2^64 - 1, whatever the sizes.)
      if (out_of_work() || best - proven_below_ < step_) return std::nullopt;
      if (best != sweep_below_) {  // a plan found: the sweep goes on below it
        sweep_below_ = best;
        sweep_k_ = 1;
      }
      const std::uint64_t depth = std::min(kSweepDepth, (best - proven_below_) / step_);
      bool busy = false;
      while (sweep_k_ <= depth) {
        const std::uint64_t target = best - sweep_k_ * step_;
        ++sweep_k_;
        if (std::any_of(workers_.begin(), workers_.end(),
                        [&](const Worker& other) { return other.target == target; })) {
          busy = true;  // another thread is on it
          continue;
        }
        return SweepProbe{target, luby(sweep_ + 1), sweep_};
      }
      if (busy) {
        // Every target left is being probed: wait for one of those probes to end.
        sweep_k_ = 1;
        changed_.wait_until(lock, deadline_);
        continue;
      }
      ++sweep_;  // a sweep that found nothing: the next, under a new seed
      sweep_k_ = 1;
    }
  }

  // Luby's sequence, i >= 1: with k the least such that i <= 2^k - 1, 2^(k-1) when
  // i = 2^k - 1, else luby(i - 2^(k-1) + 1). Capped at 2^20 (a probe budget of hours).
  static std::uint64_t luby(std::uint64_t i) {
    while (true) {
      std::uint64_t k = 1;
      while (k < 63 && (std::uint64_t{1} << k) - 1 < i) ++k;
      if ((std::uint64_t{1} << k) - 1 == i) {
        return std::uint64_t{1} << std::min<std::uint64_t>(k - 1, 20);
      }
      i -= (std::uint64_t{1} << (k - 1)) - 1;
    }
  }

  // Under mutex_.
  bool out_of_work() const {
    const std::uint64_t max_nodes = options_.max_search_nodes;
    return stopped_ || result_.plan.arena_size <= acceptable_ || Clock::now() >= deadline_ ||
           (max_nodes != 0 && nodes_.load() >= max_nodes);
  }

  // A share of the time left, and at least kMinimumProbe. Under a node limit a probe ends
  // by its share of the nodes alone (the whole search's time limit still holds): a clock
  // share made the plan depend on the machine's speed, and a node-limited run under
  // ThreadSanitizer on a busy machine gave another plan than the run before it.
  Clock::time_point share_of_time_left(double share) const {
    if (options_.max_search_nodes != 0) return deadline_;
    const Clock::time_point now = Clock::now();
    const auto slice =
        std::chrono::duration_cast<Clock::duration>((deadline_ - now) * share) + kMinimumProbe;
    return std::min(deadline_, now + slice);
  }

  // A share of the nodes left, as a probe's node limit (0: no limit).
  std::uint64_t share_of_nodes_left(double share) const {
    const std::uint64_t max_nodes = options_.max_search_nodes;
    if (max_nodes == 0) return 0;
    const std::uint64_t left = max_nodes - std::min(nodes_.load(), max_nodes);
    const auto part = static_cast<std::uint64_t>(static_cast<double>(left) * share);
    return std::max<std::uint64_t>(1, std::min(left, part + kMinimumProbeNodes));
  }

  // Called by the searches every few hundred nodes: options.progress about once a second,
  // from one thread at a time.
  void report_progress(std::uint64_t probing) {
    if (!options_.progress) return;
    // A probe at or above the best plan is being cancelled: not worth a report.
    if (probing >= best_arena_.load()) return;
    std::unique_lock lock(progress_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    const Clock::time_point now = Clock::now();
    if (now - last_progress_ < std::chrono::seconds(1)) return;
    last_progress_ = now;
    std::uint64_t nodes = nodes_.load();
    for (const Worker& w : workers_) nodes += w.searching.load(std::memory_order_relaxed);
    options_.progress(PlanProgress{.seconds = std::chrono::duration<double>(now - start_).count(),
                                   .best_arena = best_arena_.load(),
                                   .lower_bound = result_.lower_bound,
                                   .nodes = nodes,
                                   .probing = probing});
  }

  const std::span<const Buffer> buffers_;
  const PlannerOptions& options_;
  const Clock::time_point start_;
  const Clock::time_point deadline_;
  const std::uint64_t step_;
  // Without a capacity, a best plan this small ends the work (PlannerOptions::accept_within);
  // 0 with a capacity, where the one probe decides.
  const std::uint64_t acceptable_;

  std::mutex mutex_;  // guards what follows, up to progress_mutex_
  PlanResult& result_;
  std::uint64_t& proven_below_;
  std::vector<Worker> workers_;  // [0] is the calling thread
  bool stopped_ = false;         // an exception: every thread stops
  std::exception_ptr error_;
  std::condition_variable changed_;  // a probe ended (or the work stopped)
  std::uint64_t sweep_below_ = 0;    // the best arena the current sweep runs below
  std::uint64_t sweep_k_ = 1;        // its next target: sweep_below_ - sweep_k_ * step_
  std::uint64_t sweep_ = 0;          // the sweep's number: its seed, and its budget's term

  std::atomic<std::uint64_t> nodes_{0};  // of the probes finished
  std::atomic<std::uint64_t> best_arena_;
  std::mutex progress_mutex_;
  Clock::time_point last_progress_;  // progress_mutex_
};

}  // namespace

void run_probes(std::span<const Buffer> buffers, const PlannerOptions& options,
                Clock::time_point start, Clock::time_point deadline, PlanResult& result,
                std::uint64_t& proven_below) {
  ProbeSchedule(buffers, options, start, deadline, result, proven_below).run();
}

}  // namespace sdalloc::planner_detail
