// Compatibility forwarder: this header moved to <sdalloc/core/stream.hpp> (the layered layout of
// docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/stream.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/stream.hpp>  // IWYU pragma: export
