// Compatibility forwarder: this header moved to <sdalloc/trace/rmm_log.hpp> (the layered layout of
// docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/rmm_log.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/trace/rmm_log.hpp>  // IWYU pragma: export
