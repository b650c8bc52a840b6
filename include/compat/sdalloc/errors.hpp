// Compatibility forwarder: this header moved to <sdalloc/core/errors.hpp> (the layered layout of
// docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/errors.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/errors.hpp>  // IWYU pragma: export
