// Compatibility forwarder: this header moved to <sdalloc/resources/host_resource.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/host_resource.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/resources/host_resource.hpp>  // IWYU pragma: export
