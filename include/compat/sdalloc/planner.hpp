// Compatibility forwarder: this header moved to <sdalloc/planner/planner.hpp> (the layered layout
// of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/planner.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/planner/planner.hpp>  // IWYU pragma: export
