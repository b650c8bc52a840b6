// text_lines.cpp - the byte sources of a stream and of a text in memory, and the chunked
// line splitter over any source (text_lines.hpp). Files and standard input are opened in
// file_sources/ (through zlib when the build has it, plainly when not).
#include "trace/text_lines.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace sdalloc::detail {
namespace {

// Reads start small and double up to kChunk: a short input (a config line, a fuzzer's
// case, a small trace) never pays for zeroing and faulting in a quarter-megabyte buffer,
// while a long one is read in large chunks after a few reads.
constexpr std::size_t kChunk = std::size_t{1} << 18;

// ---------------------------------------------------------------------------------------
// Byte sources.

class StreamSource final : public ByteSource {
 public:
  explicit StreamSource(std::istream& in) : in_(in) {}
  std::size_t read(char* data, std::size_t size, std::string& problem) override {
    in_.read(data, static_cast<std::streamsize>(size));
    if (in_.bad()) {
      problem = "read error";
      return 0;
    }
    return static_cast<std::size_t>(in_.gcount());
  }

 private:
  std::istream& in_;
};

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::string_view text) : text_(text) {}
  std::size_t read(char* data, std::size_t size, std::string& /*problem*/) override {
    const std::size_t n = std::min(size, text_.size());
    std::memcpy(data, text_.data(), n);
    text_.remove_prefix(n);
    return n;
  }

 private:
  std::string_view text_;
};

std::string long_line(const TraceLimits& limits) {
  return "line is longer than " + std::to_string(limits.max_line_bytes) +
         " bytes, the limit for one line (TraceLimits::max_line_bytes): is this a text trace?";
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Lines.

TextLines TextLines::open(const std::string& path, const TraceLimits& limits) {
  std::string source;
  std::unique_ptr<ByteSource> bytes = open_byte_source(path, source);
  return TextLines(std::move(source), std::move(bytes), limits);
}

TextLines::TextLines(std::string source, std::istream& in, const TraceLimits& limits)
    : TextLines(std::move(source), std::make_unique<StreamSource>(in), limits) {}

TextLines::TextLines(std::string source, std::string_view text, const TraceLimits& limits)
    : TextLines(std::move(source), std::make_unique<MemorySource>(text), limits) {}

TextLines::TextLines(std::string source, std::unique_ptr<ByteSource> bytes,
                     const TraceLimits& limits)
    : source_(std::move(source)), bytes_(std::move(bytes)), limits_(limits) {}

void TextLines::fail(const std::string& problem) const {
  throw TraceFormatError(source_, number_ == 0 ? 1 : number_, problem);
}

std::size_t TextLines::line_reached() const {
  const std::string_view rest = held().substr(pos_);
  return number_ + static_cast<std::size_t>(std::count(rest.begin(), rest.end(), '\n')) + 1;
}

bool TextLines::read_more() {
  if (at_end_) return false;
  if (pos_ > 0) {  // keep only what is not yet returned, at the front
    std::memmove(buffer_.data(), buffer_.data() + pos_, filled_ - pos_);
    filled_ -= pos_;
    scanned_ -= pos_;
    pos_ = 0;
  }
  const std::size_t chunk = next_chunk_;
  next_chunk_ = std::min(kChunk, next_chunk_ * 2);
  if (buffer_.size() < filled_ + chunk) buffer_.resize(filled_ + chunk);
  std::string problem;
  const std::size_t n = bytes_->read(buffer_.data() + filled_, chunk, problem);
  if (!problem.empty()) throw TraceFormatError(source_, line_reached(), problem);
  if (n == 0) {
    at_end_ = true;
    return false;
  }
  total_ += n;
  filled_ += n;
  if (total_ > limits_.max_bytes) {
    throw TraceFormatError(source_, line_reached(),
                           "the input is longer than " + std::to_string(limits_.max_bytes) +
                               " bytes, the limit for one trace (TraceLimits::max_bytes)");
  }
  return true;
}

std::string_view TextLines::peek(std::size_t size) {
  while (filled_ - pos_ < size && read_more()) {
  }
  return held().substr(pos_, std::min(size, filled_ - pos_));
}

bool TextLines::next(std::string_view& line) {
  std::size_t end = std::string_view::npos;
  for (;;) {
    end = held().find('\n', scanned_);
    if (end != std::string_view::npos) break;
    scanned_ = filled_;
    if (filled_ - pos_ > limits_.max_line_bytes) {
      throw TraceFormatError(source_, number_ + 1, long_line(limits_));
    }
    if (!read_more()) break;
  }
  if (end == std::string_view::npos && pos_ >= filled_) return false;
  const std::size_t stop = end == std::string_view::npos ? filled_ : end;
  if (stop - pos_ > limits_.max_line_bytes) {
    throw TraceFormatError(source_, number_ + 1, long_line(limits_));
  }
  line = held().substr(pos_, stop - pos_);
  pos_ = end == std::string_view::npos ? filled_ : end + 1;
  scanned_ = pos_;
  ++number_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return true;
}

}  // namespace sdalloc::detail
