// Compatibility forwarder: this header moved to <sdalloc/policies/virtual_memory_pool.hpp> (the
// layered layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/virtual_memory_pool.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/policies/virtual_memory_pool.hpp>  // IWYU pragma: export
