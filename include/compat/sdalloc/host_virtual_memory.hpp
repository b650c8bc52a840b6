// Compatibility forwarder: this header moved to <sdalloc/resources/host_virtual_memory.hpp> (the
// layered layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/host_virtual_memory.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/resources/host_virtual_memory.hpp>  // IWYU pragma: export
