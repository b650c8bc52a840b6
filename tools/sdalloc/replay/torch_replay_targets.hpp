// tools/sdalloc/replay/torch_replay_targets.hpp - PyTorch's allocator as `sdalloc replay` runs it.
//
// Two in-process allocators (replay_target.hpp) built on TorchCachingModel
// (torch_caching_model.hpp), so a replay shows beside sdalloc's pools what PyTorch itself
// would hold for the trace:
//   torch-native      the native caching allocator: segments from host memory
//                     (HostResource), capped by --capacity (LimitResource), measured by a
//                     StatsResource under the model.
//   torch-expandable  the same with expandable_segments:True: host pages
//                     (HostVirtualMemory, --capacity its physical limit) mapped into one
//                     range per stream and pool; what it holds is the pages mapped.
// Both hand out real memory (--touch writes it).
#pragma once

#include <memory>

#include "replay/replay_target.hpp"

namespace sdalloc::replay {

std::unique_ptr<ReplayTarget> make_torch_native_target(const TargetSettings& settings);
std::unique_ptr<ReplayTarget> make_torch_expandable_target(const TargetSettings& settings);

}  // namespace sdalloc::replay
