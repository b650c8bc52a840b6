// text_lines.hpp - the lines of a text trace, one at a time, with their numbers (internal).
//
// Every text reader walks its input the same way: split at '\n', drop a trailing '\r'
// (CRLF files), and know the 1-based number of the line at hand for its error messages.
// The input is never held whole: a file (plain or gzip, through zlib), a stream or a text in
// memory is read a chunk at a time into a buffer that holds the line at hand and the rest of
// its chunk, so memory is bounded by the longest line plus two chunks. A line longer than
// TraceLimits::max_line_bytes, more input than TraceLimits::max_bytes, a read error or a
// truncated gzip stream is a TraceFormatError on the line reached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <string_view>

#include "sdalloc/trace/trace_text.hpp"

namespace sdalloc::detail {

// Where the bytes come from. read() stores up to `size` bytes at `data` and answers how many,
// 0 at the end; on a failure it answers 0 and sets `problem` (TextLines adds the line).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::size_t read(char* data, std::size_t size, std::string& problem) = 0;
};

// A file, plain or gzip (zlib tells them apart; a build without zlib refuses gzip with a
// message saying so), or standard input for "-"; sets `source` to
// the name errors use ("<stdin>" for "-"). Throws "<source>: cannot open: <reason>" (line 0).
std::unique_ptr<ByteSource> open_byte_source(const std::string& path, std::string& source);

class TextLines {
 public:
  // A file, plain or gzip; "-" is standard input (named "<stdin>"), which stays open. Throws
  // the TraceFormatError "<path>: cannot open: <reason>" (line 0).
  static TextLines open(const std::string& path, const TraceLimits& limits);
  // A stream the caller keeps open while the lines are read.
  TextLines(std::string source, std::istream& in, const TraceLimits& limits);
  // A text in memory, which the caller keeps alive while the lines are read.
  TextLines(std::string source, std::string_view text, const TraceLimits& limits);

  const std::string& source() const { return source_; }

  // The next line, without its line end; false at the end of the input. The view is valid
  // until the next call.
  bool next(std::string_view& line);
  // 1-based number of the line next() returned last; 0 before the first.
  std::size_t number() const { return number_; }
  // The input not yet returned as lines, at least `size` bytes of it unless it ends first
  // (what a format is told from). Valid until the next call.
  std::string_view peek(std::size_t size);

  // Throws TraceFormatError(source, line at hand (1 before the first), problem).
  [[noreturn]] void fail(const std::string& problem) const;

 private:
  TextLines(std::string source, std::unique_ptr<ByteSource> bytes, const TraceLimits& limits);
  std::string_view held() const { return {buffer_.data(), filled_}; }
  // Reads one more chunk behind what is held; false at the end of the input.
  bool read_more();
  // The line the reader is in: after the last line returned, counting the lines held.
  std::size_t line_reached() const;

  std::string source_;
  std::unique_ptr<ByteSource> bytes_;
  TraceLimits limits_;
  std::string buffer_;             // held input: [pos_, filled_) not yet returned
  std::size_t next_chunk_ = 4096;  // bytes the next read asks for (doubling, see read_more)
  std::size_t filled_ = 0;
  std::size_t pos_ = 0;
  std::size_t scanned_ = 0;  // [pos_, scanned_) holds no '\n'
  std::uint64_t total_ = 0;  // bytes read so far
  bool at_end_ = false;
  std::size_t number_ = 0;
};

}  // namespace sdalloc::detail
