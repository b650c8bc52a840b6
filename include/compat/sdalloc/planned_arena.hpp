// Compatibility forwarder: this header moved to <sdalloc/policies/planned_arena.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/planned_arena.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/policies/planned_arena.hpp>  // IWYU pragma: export
