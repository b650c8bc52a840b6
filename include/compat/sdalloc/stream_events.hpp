// Compatibility forwarder: this header moved to <sdalloc/core/stream_events.hpp> (the layered
// layout of docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/stream_events.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/stream_events.hpp>  // IWYU pragma: export
