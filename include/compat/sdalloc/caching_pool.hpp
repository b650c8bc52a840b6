// Compatibility forwarder: this header moved to <sdalloc/policies/caching_pool.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/caching_pool.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/policies/caching_pool.hpp>  // IWYU pragma: export
