// Compatibility forwarder: this header moved to <sdalloc/resources/limit_resource.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/limit_resource.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/resources/limit_resource.hpp>  // IWYU pragma: export
