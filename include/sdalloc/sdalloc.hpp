// sdalloc/sdalloc.hpp - the whole C++ API in one include.
#pragma once

#include "sdalloc/caching_pool.hpp"
#include "sdalloc/errors.hpp"
#include "sdalloc/event_trace.hpp"
#include "sdalloc/host_resource.hpp"
#include "sdalloc/limit_resource.hpp"
#include "sdalloc/pool_stats.hpp"
#include "sdalloc/rmm_log.hpp"
#include "sdalloc/resource.hpp"
#include "sdalloc/stats_resource.hpp"
#include "sdalloc/stream.hpp"
#include "sdalloc/stream_events.hpp"
#include "sdalloc/tensor.hpp"
#include "sdalloc/trace_input.hpp"
#include "sdalloc/trace_resource.hpp"
#include "sdalloc/trace_text.hpp"
#include "sdalloc/version.hpp"
