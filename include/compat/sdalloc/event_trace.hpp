// Compatibility forwarder: this header moved to <sdalloc/trace/event_trace.hpp> (the layered layout
// of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/event_trace.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/trace/event_trace.hpp>  // IWYU pragma: export
