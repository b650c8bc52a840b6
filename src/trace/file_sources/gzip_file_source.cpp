// gzip_file_source.cpp - files and standard input through zlib's gz* functions, which read
// gzip-compressed and plain bytes alike (the build with zlib; plain_file_source.cpp is the
// one without). A truncated gzip stream is an error, never a short trace.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "trace/text_lines.hpp"

namespace sdalloc::detail {
namespace {

constexpr std::size_t kBuffer = std::size_t{1} << 18;  // zlib's input buffer

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(gzFile file) : file_(file) {}
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;
  ~GzipSource() override {
    if (file_ != nullptr) gzclose(file_);
  }

  std::size_t read(char* data, std::size_t size, std::string& problem) override {
    if (file_ == nullptr) return 0;
    const int n = gzread(file_, data, static_cast<unsigned>(std::min<std::size_t>(size, INT_MAX)));
    if (n > 0) return static_cast<std::size_t>(n);
    int code = Z_OK;
    const char* error_text = gzerror(file_, &code);
    const std::string message = error_text != nullptr ? error_text : "";  // gzclose frees it
    // A truncated gzip stream shows as Z_BUF_ERROR from gzerror or gzclose, while gzread
    // just returns what it had: check both, or a cut-off file would read as a short trace.
    const int close_code = gzclose(file_);
    file_ = nullptr;
    if (n < 0 || code != Z_OK || close_code != Z_OK) {
      problem =
          code == Z_BUF_ERROR || close_code == Z_BUF_ERROR
              ? std::string("compressed data ends unexpectedly (truncated gzip file)")
              : "cannot decompress: " + (code != Z_OK && !message.empty() ? message : "read error");
    }
    return 0;
  }

 private:
  gzFile file_;
};

}  // namespace

std::unique_ptr<ByteSource> open_byte_source(const std::string& path, std::string& source) {
  const bool from_stdin = path == "-";
  source = from_stdin ? "<stdin>" : path;
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
        source, 0,
        std::string("cannot open: ") + (error != 0 ? std::strerror(error) : "out of memory"));
  }
  gzbuffer(file, static_cast<unsigned>(kBuffer));
  return std::make_unique<GzipSource>(file);
}

}  // namespace sdalloc::detail
