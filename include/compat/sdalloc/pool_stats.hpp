// Compatibility forwarder: this header moved to <sdalloc/core/pool_stats.hpp> (the layered layout
// of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/pool_stats.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/pool_stats.hpp>  // IWYU pragma: export
