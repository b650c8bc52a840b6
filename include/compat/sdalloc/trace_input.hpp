// Compatibility forwarder: this header moved to <sdalloc/trace/trace_input.hpp> (the layered layout
// of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/trace_input.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/trace/trace_input.hpp>  // IWYU pragma: export
