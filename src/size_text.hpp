// size_text.hpp - kept for the sources that include it: format_size() is public now, in
// sdalloc/errors.hpp beside format_bytes().
#pragma once

#include "sdalloc/errors.hpp"
