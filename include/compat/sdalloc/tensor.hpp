// Compatibility forwarder: this header moved to <sdalloc/core/tensor.hpp> (the layered layout of
// docs/architecture.md). It is installed for one release so that existing
// `#include <sdalloc/tensor.hpp>` lines keep building; include the new path.
#pragma once
#include <sdalloc/core/tensor.hpp>  // IWYU pragma: export
