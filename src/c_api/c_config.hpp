// c_config.hpp - sdalloc_pool_config_t and PoolConf, one to the other (internal).
//
// The C struct is the C spelling of the option table's rows (src/config/pool_conf.hpp): each
// meaningful field is one row's value, its default PoolConf{}'s (tests/c_api checks that
// every row has a field and that a setting survives the trip through the struct). Retired
// fields are accepted and ignored with a warning; the mode field comes last, and a caller
// whose struct ends before it gets mode:pool (what the versions without it built), or
// mode:planned where it set `planned`.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/core/memory_backend.hpp"
#include "sdalloc/sdalloc.h"

namespace sdalloc::c_api_detail {

// The defaults, every byte set (padding zero), struct_size = sizeof.
sdalloc_pool_config_t config_defaults();
// The settings a caller's struct asks for; `given` is the caller's struct_size (the fields
// past it keep their defaults, `mode` excepted: see above). One line per retired field set
// to another value than its default goes to `warnings`. Throws InvalidArgument for an
// unknown mode or resource, or `planned` beside a mode other than planned.
PoolConf pool_conf_of(const sdalloc_pool_config_t& config, std::size_t given,
                      std::vector<std::string>& warnings);
// The C struct of a PoolConf (the inverse of pool_conf_of for the fields it sets).
sdalloc_pool_config_t config_of(const PoolConf& conf);
// The C name of a mode.
sdalloc_pool_mode_t c_mode_of(PoolMode mode);
// The host memory a config names (resource).
MemoryBackend backend_of(const sdalloc_pool_config_t& config);

}  // namespace sdalloc::c_api_detail
