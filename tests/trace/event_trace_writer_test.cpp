// EventTraceWriter and the one header check: the exact bytes written (the format other
// programs read), that what it writes reads back through every reader, and that the
// header check accepts exactly the two header forms.
#include "sdalloc/trace/event_trace_writer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <ios>
#include <limits>
#include <sstream>
#include <string>

#include "sdalloc/trace/event_trace.hpp"
#include "sdalloc/trace/trace_input.hpp"

namespace sdalloc {
namespace {

TEST(EventTraceWriterTest, WritesTheHeaderWithStreamsAtConstruction) {
  std::ostringstream out;
  EventTraceWriter writer(out);
  EXPECT_TRUE(writer.with_stream());
  EXPECT_EQ(out.str(), "op,id,size,stream\n");
}

TEST(EventTraceWriterTest, WritesAllocAndFreeLinesWithTheirStream) {
  std::ostringstream out;
  EventTraceWriter writer(out);
  writer.allocate(0, 4096, 0);
  writer.allocate(1, 300, 7);
  writer.free(0, 4096, 0);
  EXPECT_EQ(out.str(), "op,id,size,stream\na,0,4096,0\na,1,300,7\nf,0,4096,0\n");
}

TEST(EventTraceWriterTest, WithoutStreamsLeavesTheColumnOut) {
  std::ostringstream out;
  EventTraceWriter writer(out, false);
  writer.allocate(3, 64, 5);  // the stream is dropped, not written
  writer.write(TraceEvent{TraceEvent::Op::kFree, 3, 64, 0});
  EXPECT_EQ(out.str(), "op,id,size\na,3,64\nf,3,64\n");
}

TEST(EventTraceWriterTest, WritesTheLargestNumbersInFull) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::ostringstream out;
  EventTraceWriter writer(out);
  writer.allocate(kMax, kMax, kMax);
  const std::string max = std::to_string(kMax);
  EXPECT_EQ(out.str(), "op,id,size,stream\na," + max + "," + max + "," + max + "\n");
}

TEST(EventTraceWriterTest, WritesDecimalWhateverTheStreamFlags) {
  std::ostringstream out;
  out << std::hex << std::showbase;
  EventTraceWriter writer(out);
  writer.allocate(255, 4096, 16);
  EXPECT_EQ(out.str(), "op,id,size,stream\na,255,4096,16\n");
}

TEST(EventTraceWriterTest, AFailedStreamShowsInItsState) {
  std::ostringstream out;
  out.setstate(std::ios::badbit);
  EventTraceWriter writer(out);
  writer.allocate(0, 1, 0);
  EXPECT_TRUE(out.bad());
  EXPECT_EQ(out.str(), "");
}

TEST(EventTraceWriterTest, WhatItWritesReadsBackAsTheSameEvents) {
  std::ostringstream out;
  EventTraceWriter writer(out);
  writer.allocate(0, 4096, 0);
  writer.allocate(1, 512, 2);
  writer.free(1, 512, 2);
  std::istringstream in(out.str());
  const EventTrace trace = parse_event_trace(in, "w.csv");
  ASSERT_EQ(trace.events.size(), 3u);
  EXPECT_EQ(trace.events[1].op, TraceEvent::Op::kAlloc);
  EXPECT_EQ(trace.events[1].size, 512u);
  EXPECT_EQ(trace.events[1].stream, 2u);
  EXPECT_EQ(trace.events[2].op, TraceEvent::Op::kFree);
  EXPECT_EQ(detect_trace_format(out.str(), "w.csv"), TraceFormat::kEventTrace);
}

TEST(EventTraceWriterTest, WriteEventTraceUsesTheStreamColumnOnlyWhenNeeded) {
  EventTrace trace;
  trace.events = {{TraceEvent::Op::kAlloc, 0, 8, 0}, {TraceEvent::Op::kFree, 0, 8, 0}};
  std::ostringstream plain;
  write_event_trace(trace, plain);
  EXPECT_EQ(plain.str(), "op,id,size\na,0,8\nf,0,8\n");
  trace.events[1].stream = 1;
  std::ostringstream with_stream;
  write_event_trace(trace, with_stream);
  EXPECT_EQ(with_stream.str(), "op,id,size,stream\na,0,8,0\nf,0,8,1\n");
}

TEST(EventTraceHeaderTest, AcceptsExactlyTheTwoHeaderForms) {
  EXPECT_EQ(event_trace_header_fields("op,id,size"), 3u);
  EXPECT_EQ(event_trace_header_fields("op,id,size,stream"), 4u);
  EXPECT_EQ(event_trace_header_fields(kEventTraceHeader), 3u);
  EXPECT_EQ(event_trace_header_fields(kEventTraceHeaderWithStream), 4u);
}

TEST(EventTraceHeaderTest, RejectsAnythingElse) {
  EXPECT_EQ(event_trace_header_fields(""), 0u);
  EXPECT_EQ(event_trace_header_fields("op,id"), 0u);
  EXPECT_EQ(event_trace_header_fields("op,id,size,"), 0u);
  EXPECT_EQ(event_trace_header_fields("op,id,size,stream,extra"), 0u);
  EXPECT_EQ(event_trace_header_fields("OP,ID,SIZE"), 0u);
  EXPECT_EQ(event_trace_header_fields("op,id,size\r"), 0u);  // callers strip the line end
  EXPECT_EQ(event_trace_header_fields(" op,id,size"), 0u);
  EXPECT_EQ(event_trace_header_fields("Thread,Time,Action,Pointer,Size,Stream"), 0u);
}

}  // namespace
}  // namespace sdalloc
