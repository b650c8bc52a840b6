// Compatibility forwarder: this header moved to <sdalloc/core/virtual_memory.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/virtual_memory.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/virtual_memory.hpp>  // IWYU pragma: export
