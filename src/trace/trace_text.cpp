// trace_text.cpp - reading a whole trace file through zlib, which reads gzip and plain
// files alike, and TraceFormatError, the error every trace reader throws.
#include "sdalloc/trace/trace_text.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

namespace sdalloc {

TraceFormatError::TraceFormatError(const std::string& source_name, std::size_t line_number,
                                   const std::string& problem)
    : InvalidArgument(line_number == 0
                          ? source_name + ": " + problem
                          : source_name + ":" + std::to_string(line_number) + ": " + problem),
      source(source_name),
      line(line_number) {}

namespace {

std::string read_all(gzFile file, const std::string& source) {
  std::string bytes;
  std::array<char, 1 << 18> chunk;
  for (;;) {
    const int n = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n > 0) {
      bytes.append(chunk.data(), static_cast<std::size_t>(n));
      continue;
    }
    int code = Z_OK;
    const char* error_text = gzerror(file, &code);
    const std::string message = error_text != nullptr ? error_text : "";  // gzclose frees it
    // A truncated gzip stream shows as Z_BUF_ERROR from gzerror or gzclose, while gzread
    // just returns what it had: check both, or a cut-off file would read as a short trace.
    const int close_code = gzclose(file);
    if (n < 0 || code != Z_OK || close_code != Z_OK) {
      const auto line = static_cast<std::size_t>(std::count(bytes.begin(), bytes.end(), '\n')) + 1;
      throw TraceFormatError(
          source, line,
          code == Z_BUF_ERROR || close_code == Z_BUF_ERROR
              ? std::string("compressed data ends unexpectedly (truncated gzip file)")
              : "cannot decompress: " +
                    (code != Z_OK && !message.empty() ? message : "read error"));
    }
    return bytes;
  }
}

}  // namespace

TraceText read_trace_text(const std::string& path) {
  TraceText text;
  const bool from_stdin = path == "-";
  text.source = from_stdin ? "<stdin>" : path;
  gzFile file = nullptr;
  errno = 0;
  if (from_stdin) {
    // gzclose closes the descriptor it was given; keep standard input open for others.
    const int fd = ::dup(STDIN_FILENO);
    if (fd >= 0) file = gzdopen(fd, "rb");
    if (file == nullptr && fd >= 0) ::close(fd);
  } else {
    file = gzopen(path.c_str(), "rb");
  }
  if (file == nullptr) {
    const int error = errno;
    throw TraceFormatError(
        text.source, 0,
        std::string("cannot open: ") + (error != 0 ? std::strerror(error) : "out of memory"));
  }
  gzbuffer(file, 1 << 18);
  text.bytes = read_all(file, text.source);
  return text;
}

}  // namespace sdalloc
