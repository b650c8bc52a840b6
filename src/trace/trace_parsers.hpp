// trace_parsers.hpp - the format parsers over lines already opened (internal), so
// read_trace_input can tell the format from the first bytes and parse the same stream on.
#pragma once

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/rmm_log.hpp"
#include "trace/text_lines.hpp"

namespace sdalloc::detail {

// The trace's source is lines.source(); errors are TraceFormatErrors on the line at hand.
EventTrace parse_event_lines(TextLines& lines);
RmmLog parse_rmm_lines(TextLines& lines);

}  // namespace sdalloc::detail
