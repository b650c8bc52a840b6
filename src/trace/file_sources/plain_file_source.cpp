// plain_file_source.cpp - files and standard input read as they are, for a build without
// zlib (SDALLOC_WITH_ZLIB=OFF, or zlib not found; gzip_file_source.cpp is the one with it).
// A gzip-compressed input is recognised by its magic bytes (1f 8b) and refused with a
// message that says why, rather than parsed as garbage text.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trace/text_lines.hpp"

namespace sdalloc::detail {
namespace {

class PlainFileSource final : public ByteSource {
 public:
  // `owned`: the descriptor is this source's to close (not standard input's own).
  PlainFileSource(int fd, bool owned) : fd_(fd), owned_(owned) {}
  PlainFileSource(const PlainFileSource&) = delete;
  PlainFileSource& operator=(const PlainFileSource&) = delete;
  ~PlainFileSource() override {
    if (owned_) ::close(fd_);
  }

  std::size_t read(char* data, std::size_t size, std::string& problem) override {
    std::size_t got = 0;
    while (got < size) {
      const ssize_t n = ::read(fd_, data + got, size - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        problem = std::string("read error: ") + std::strerror(errno);
        return 0;
      }
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (first_read_) {
      first_read_ = false;
      if (got >= 2 && static_cast<unsigned char>(data[0]) == 0x1f &&
          static_cast<unsigned char>(data[1]) == 0x8b) {
        problem =
            "gzip-compressed input, but this sdalloc was built without zlib "
            "(SDALLOC_WITH_ZLIB=OFF or zlib not found): decompress it first (gunzip)";
        return 0;
      }
    }
    return got;
  }

 private:
  int fd_;
  bool owned_;
  bool first_read_ = true;
};

}  // namespace

std::unique_ptr<ByteSource> open_byte_source(const std::string& path, std::string& source) {
  const bool from_stdin = path == "-";
  source = from_stdin ? "<stdin>" : path;
  if (from_stdin) return std::make_unique<PlainFileSource>(STDIN_FILENO, /*owned=*/false);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw TraceFormatError(source, 0, std::string("cannot open: ") + std::strerror(errno));
  }
  try {
    return std::make_unique<PlainFileSource>(fd, /*owned=*/true);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

}  // namespace sdalloc::detail
