// Compatibility forwarder: this header moved to <sdalloc/core/resource.hpp> (the layered layout of
// docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/resource.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/resource.hpp>  // IWYU pragma: export
