// unit_plan.cpp - choose the resident units and the ring by simulating one copy engine.
#include "sdalloc/transfer/unit_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc {

namespace {

std::size_t align_up(std::size_t n, std::size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

void check_input(const UnitPlanInput& in) {
  if (in.compute_seconds.size() != in.bytes.size()) {
    throw InvalidArgument("plan_units: " + std::to_string(in.bytes.size()) + " unit sizes but " +
                          std::to_string(in.compute_seconds.size()) + " compute times");
  }
  const auto sized = [&](std::size_t size, const char* what) {
    if (size != 0 && size != in.bytes.size()) {
      throw InvalidArgument("plan_units: " + std::to_string(in.bytes.size()) + " units but " +
                            std::to_string(size) + " " + what);
    }
  };
  sized(in.host_seconds.size(), "host times");
  sized(in.keep_resident.size(), "keep_resident flags");
  if (!(in.bytes_per_second > 0)) {
    throw InvalidArgument("plan_units: the copy speed must be positive bytes per second");
  }
  if (in.seconds_per_copy < 0) throw InvalidArgument("plan_units: negative seconds per copy");
  if (in.alignment == 0 || (in.alignment & (in.alignment - 1)) != 0) {
    throw InvalidArgument("plan_units: the alignment must be a power of two");
  }
  for (const std::size_t u : in.order) {
    if (u >= in.bytes.size()) {
      throw InvalidArgument("plan_units: the order uses unit " + std::to_string(u) + " of " +
                            std::to_string(in.bytes.size()));
    }
  }
  std::size_t largest = 0;
  for (std::size_t u = 0; u < in.bytes.size(); ++u) {
    if (in.bytes[u] == 0)
      throw InvalidArgument("plan_units: unit " + std::to_string(u) + " is empty");
    if (in.compute_seconds[u] < 0) {
      throw InvalidArgument("plan_units: unit " + std::to_string(u) +
                            " has a negative compute time");
    }
    largest = std::max(largest, in.bytes[u]);
  }
  if (in.budget < align_up(largest, in.alignment)) {
    throw InvalidArgument("plan_units: the budget " + format_bytes(in.budget) +
                          " is below the largest unit's " + format_bytes(largest) +
                          ": the budget must hold the largest unit");
  }
}

// Lays out a candidate: `resident` units from 0, the others in a ring of `ring` bytes,
// placed in order of use from `phase` on (wrapping when one does not fit); *end gets where
// the step's placement stopped, the phase that continues it into the next step.
UnitPlan lay_out(const UnitPlanInput& in, const std::vector<bool>& resident, std::size_t ring,
                 std::size_t phase = 0, std::size_t* stop = nullptr) {
  const std::size_t n_units = in.bytes.size();
  UnitPlan plan;
  plan.streamed.assign(n_units, false);
  plan.device_offset.assign(n_units, 0);
  std::size_t at = 0;
  for (std::size_t u = 0; u < n_units; ++u) {
    if (!resident[u]) continue;
    plan.device_offset[u] = at;
    at += align_up(in.bytes[u], in.alignment);
  }
  plan.resident_bytes = at;
  plan.ring_offset = at;
  for (const std::size_t u : in.order) {
    if (!resident[u]) plan.stream_order.push_back(u);
  }
  plan.ring_bytes = plan.stream_order.empty() ? 0 : ring;
  std::vector<std::size_t> start(plan.stream_order.size());
  std::size_t pos = phase;
  for (std::size_t j = 0; j < plan.stream_order.size(); ++j) {
    const std::size_t size = align_up(in.bytes[plan.stream_order[j]], in.alignment);
    if (pos + size > ring) pos = 0;
    start[j] = pos;
    plan.device_offset[plan.stream_order[j]] = plan.ring_offset + pos;
    plan.streamed[plan.stream_order[j]] = true;
    plan.streamed_bytes += in.bytes[plan.stream_order[j]];
    pos += size;
  }
  if (stop != nullptr) *stop = pos >= ring ? 0 : pos;
  const std::size_t n = plan.stream_order.size();
  plan.wait_back.assign(n, n);
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t end = start[j] + in.bytes[plan.stream_order[j]];
    for (std::size_t d = 1; d < n; ++d) {
      const std::size_t k = (j + n - d) % n;
      const std::size_t k_end = start[k] + in.bytes[plan.stream_order[k]];
      if (start[k] < end && start[j] < k_end) {
        plan.wait_back[j] = d;
        break;
      }
    }
  }
  plan.region_bytes = plan.ring_offset + plan.ring_bytes;
  return plan;
}

// Ring sizes tried for streamed units of at most `bound` bytes: a few multiples of it, and
// steps up to the most the budget leaves (`most`).
std::vector<std::size_t> ring_sizes(std::size_t bound, std::size_t most, std::size_t alignment) {
  std::vector<std::size_t> sizes;
  for (const double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0}) {
    sizes.push_back(static_cast<std::size_t>(m * static_cast<double>(bound)));
  }
  constexpr int kSteps = 12;
  for (int i = 1; i <= kSteps; ++i) sizes.push_back(bound + (most - bound) / kSteps * i);
  for (std::size_t& s : sizes) s = std::min(align_up(s, alignment), most / alignment * alignment);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](std::size_t s) { return s < bound; }),
              sizes.end());
  return sizes;
}

double copy_time(const UnitPlanInput& in, std::size_t bytes) {
  return in.seconds_per_copy + static_cast<double>(bytes) / in.bytes_per_second;
}

}  // namespace

double simulate_unit_plan(const UnitPlanInput& in, const UnitPlan& plan, int steps) {
  const std::size_t n = plan.stream_order.size();
  std::vector<std::size_t> position(in.bytes.size(), 0);
  for (std::size_t j = 0; j < n; ++j) position[plan.stream_order[j]] = j;
  const std::size_t total = static_cast<std::size_t>(steps) * n;
  std::vector<double> released(total, 0.0);  // on the device
  std::vector<double> recorded(total, 0.0);  // on the host: when the release was issued
  double host = 0, device = 0, engine = 0;
  double last_end = 0, last_step = 0;
  std::size_t next = 0;  // absolute index of the next streamed use
  std::size_t issued = 0;
  std::size_t released_count = 0;  // streamed uses whose release was recorded
  std::vector<double> copy_end(total, 0.0);
  // Issues, in order, every copy whose slot has been released (or was never used).
  const auto issue_copies = [&](std::size_t released_upto) {
    while (issued < total) {
      const std::size_t back = plan.wait_back[issued % n];
      const bool free_slot = issued < back;
      if (!free_slot && issued - back >= released_upto) break;
      const double slot_free = free_slot ? 0.0 : released[issued - back];
      const double issue_time = free_slot ? 0.0 : recorded[issued - back];
      const double start = std::max({engine, slot_free, issue_time});
      engine = start + copy_time(in, in.bytes[plan.stream_order[issued % n]]);
      copy_end[issued] = engine;
      ++issued;
    }
  };
  issue_copies(0);
  for (int s = 0; s < steps; ++s) {
    for (const std::size_t u : in.order) {
      const double issue = host;
      host += in.host_seconds.empty() ? 0.0 : in.host_seconds[u];
      double start = std::max(device, issue);
      if (plan.streamed[u] && n > 0) {
        const std::size_t abs = next++;
        if (released_count < abs) {  // the previous streamed unit's release
          released[abs - 1] = start;
          recorded[abs - 1] = issue;
          released_count = abs;
          issue_copies(released_count);
        }
        start = std::max(start, copy_end[abs]);
      }
      device = std::max(start + in.compute_seconds[u], host);
    }
    if (released_count < next) {
      released[next - 1] = device;
      recorded[next - 1] = host;
      released_count = next;
      issue_copies(released_count);
    }
    host = device = std::max(host, device);  // the caller waits for the step
    last_step = device - last_end;
    last_end = device;
  }
  return last_step;
}

std::string UnitPlan::describe() const {
  std::size_t resident_units = 0;
  for (std::size_t u = 0; u < streamed.size(); ++u) resident_units += streamed[u] ? 0 : 1;
  char text[512];
  std::snprintf(text, sizeof text,
                "plan: %zu units, %zu streamed (%s a step) in a ring of %s, %zu resident (%s) "
                "under a budget of %s; predicted step %.2f ms, floor %.2f ms = max(T %.2f ms, "
                "copies %.2f ms); ideal floor %.2f ms (model - budget copied)",
                streamed.size(), stream_order.size(), format_size(streamed_bytes).c_str(),
                format_size(ring_bytes).c_str(), resident_units,
                format_size(resident_bytes).c_str(), format_size(budget).c_str(),
                predicted_step_seconds * 1e3, floor_seconds * 1e3, compute_seconds * 1e3,
                copy_seconds * 1e3, ideal_floor_seconds * 1e3);
  return text;
}

UnitPlan plan_units(const UnitPlanInput& in) {
  check_input(in);
  const std::size_t n_units = in.bytes.size();
  std::vector<std::size_t> uses(n_units, 0);
  for (const std::size_t u : in.order) ++uses[u];
  const auto kept = [&](std::size_t u) {
    return uses[u] != 1 || (!in.keep_resident.empty() && in.keep_resident[u]);
  };
  const UnitPlan everything = lay_out(in, std::vector<bool>(n_units, true), 0);
  const double compute = simulate_unit_plan(in, everything);
  const std::size_t model = std::accumulate(in.bytes.begin(), in.bytes.end(), std::size_t{0});
  const auto finish = [&](UnitPlan plan) {
    plan.model_bytes = model;
    plan.budget = in.budget;
    plan.compute_seconds = compute;
    plan.copy_seconds = 0;
    for (const std::size_t u : plan.stream_order) plan.copy_seconds += copy_time(in, in.bytes[u]);
    plan.floor_seconds = std::max(compute, plan.copy_seconds);
    const std::size_t must_copy = model > in.budget ? model - in.budget : 0;
    plan.ideal_floor_seconds =
        std::max(compute, static_cast<double>(must_copy) / in.bytes_per_second);
    return plan;
  };

  std::size_t all = 0;
  for (std::size_t u = 0; u < n_units; ++u) all += align_up(in.bytes[u], in.alignment);
  if (all <= in.budget) {
    UnitPlan plan = everything;
    plan.predicted_step_seconds = compute;
    plan.candidates = 1;
    return finish(std::move(plan));
  }

  // Orders in which the budget left is filled with resident units: the least compute per
  // byte first (the streamed ones hide their copies under their own compute), the most
  // first, the first used first (a resident prefix), the last used first, both ends of the
  // step first (the ring is then free across the step's boundary).
  std::vector<std::size_t> by_cost(n_units);
  std::iota(by_cost.begin(), by_cost.end(), std::size_t{0});
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](std::size_t a, std::size_t b) {
    return in.compute_seconds[a] * static_cast<double>(in.bytes[b]) <
           in.compute_seconds[b] * static_cast<double>(in.bytes[a]);
  });
  std::vector<std::size_t> by_use;
  std::vector<bool> seen(n_units, false);
  for (const std::size_t u : in.order) {
    if (!seen[u]) by_use.push_back(u);
    seen[u] = true;
  }
  std::vector<std::size_t> by_edge;  // nearest the step's boundary first: first, last, ...
  for (std::size_t i = 0, j = by_use.size(); i < j;) {
    by_edge.push_back(by_use[i++]);
    if (i < j) by_edge.push_back(by_use[--j]);
  }
  const std::vector<std::vector<std::size_t>> fills = {by_cost,
                                                       {by_cost.rbegin(), by_cost.rend()},
                                                       by_use,
                                                       {by_use.rbegin(), by_use.rend()},
                                                       by_edge};
  std::vector<std::size_t> bounds;
  for (std::size_t u = 0; u < n_units; ++u) {
    if (!kept(u)) bounds.push_back(align_up(in.bytes[u], in.alignment));
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());

  UnitPlan best;
  bool found = false;
  std::size_t candidates = 0;
  for (const std::size_t bound : bounds) {
    // Units over the bound, kept, or used other than once a step stay resident.
    std::vector<bool> forced(n_units, false);
    std::size_t forced_bytes = 0;
    for (std::size_t u = 0; u < n_units; ++u) {
      const std::size_t size = align_up(in.bytes[u], in.alignment);
      if (kept(u) || size > bound) {
        forced[u] = true;
        forced_bytes += size;
      }
    }
    if (forced_bytes + bound > in.budget) continue;
    for (const std::size_t ring : ring_sizes(bound, in.budget - forced_bytes, in.alignment)) {
      for (const std::vector<std::size_t>& fill : fills) {
        std::vector<bool> resident = forced;
        std::size_t room = in.budget - forced_bytes - ring;
        for (const std::size_t u : fill) {
          const std::size_t size = align_up(in.bytes[u], in.alignment);
          if (resident[u] || size > room) continue;
          resident[u] = true;
          room -= size;
        }
        // Placements from 0, then from where the last one ended (a step's placement that
        // continues the previous step's, so the first copies of a step do not wait for the
        // last units of the step before), a few times.
        std::size_t phase = 0;
        for (int tries = 0; tries < 4; ++tries) {
          std::size_t end = 0;
          UnitPlan plan = lay_out(in, resident, ring, phase, &end);
          plan.predicted_step_seconds = simulate_unit_plan(in, plan);
          ++candidates;
          const bool better =
              !found || plan.predicted_step_seconds < best.predicted_step_seconds * (1 - 1e-9) ||
              (plan.predicted_step_seconds <= best.predicted_step_seconds * (1 + 1e-9) &&
               plan.streamed_bytes < best.streamed_bytes);
          if (better) {
            best = std::move(plan);
            found = true;
          }
          if (end == phase) break;  // the placement repeats itself
          phase = end;
        }
      }
    }
  }
  if (!found) {
    std::size_t kept_bytes = 0;
    for (std::size_t u = 0; u < n_units; ++u) {
      if (kept(u)) kept_bytes += align_up(in.bytes[u], in.alignment);
    }
    throw InvalidArgument(
        "plan_units: the budget " + format_bytes(in.budget) + " cannot hold the units kept " +
        "resident (" + format_bytes(kept_bytes) + ": used other than once a step, or kept) " +
        "and a ring for one of the others (units over the ring's size stay resident too)");
  }
  best.candidates = candidates;
  return finish(std::move(best));
}

}  // namespace sdalloc
