// tools/sdalloc/replay/html_report.cpp - the HTML report of `sdalloc replay` (html_report.hpp).
//
// The page is built as one string, section by section: head and style, title, results
// table, plots, size histogram. Plots are SVG in a fixed 960 x 300 coordinate box that
// the browser scales to the page width; every allocator's plot shares one byte scale, so
// their heights compare at a glance.
#include "replay/html_report.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::replay {
namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * kKiB;
constexpr double kGiB = 1024.0 * kMiB;

// printf into a std::string; every format used here is short.
template <typename... Args>
std::string printf_string(const char* format, Args... args) {
  char buffer[128];
  const int length = std::snprintf(buffer, sizeof buffer, format, args...);
  if (length < 0) return {};
  return {buffer, std::min(static_cast<std::size_t>(length), sizeof buffer - 1)};
}

// "512 B", "3.4 KiB", "812.5 MiB", "2.11 GiB": the report compares peaks of a few GiB.
std::string human_bytes(std::uint64_t bytes) { return format_size(bytes, 2); }

// 2^k bytes exactly, in the largest binary unit that divides it: "64 B", "4 KiB", "2 GiB".
// k is at most 64 (the upper end of the top bucket), which no 64-bit count can hold.
std::string power_of_two_bytes(unsigned k) {
  return k < 64 ? format_exact_size(std::uint64_t{1} << k) : "16 EiB";
}

// "0.412 s" for a pass time; "412.0 ms" below a second.
std::string human_seconds(double seconds) {
  if (seconds < 1.0) return printf_string("%.1f ms", seconds * 1e3);
  return printf_string("%.3f s", seconds);
}

// A pass time cell: every pass when there are few, else their range and median.
std::string pass_times(const std::vector<double>& seconds) {
  if (seconds.empty()) return "-";
  if (seconds.size() <= 4) {
    std::string text;
    for (const double s : seconds) text += (text.empty() ? "" : ", ") + human_seconds(s);
    return text;
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  return "min " + human_seconds(sorted.front()) + ", median " +
         human_seconds(sorted[sorted.size() / 2]) + ", max " + human_seconds(sorted.back()) + " (" +
         std::to_string(sorted.size()) + " passes)";
}

// A "nice" tick step (1, 2, 2.5 or 5 times a power of ten) near range / target_ticks.
double nice_step(double range, int target_ticks) {
  const double raw = range / target_ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  double nice = 10;
  if (fraction <= 1) {
    nice = 1;
  } else if (fraction <= 2) {
    nice = 2;
  } else if (fraction <= 2.5) {
    nice = 2.5;
  } else if (fraction <= 5) {
    nice = 5;
  }
  return nice * magnitude;
}

// The byte axis shared by every plot: its top, tick step and the unit of its labels.
struct ByteAxis {
  double top = 0;   // bytes at the top of the plot
  double step = 0;  // bytes between ticks
  double unit = 1;  // bytes per label unit
  const char* unit_name = "B";
};

ByteAxis byte_axis(double max_bytes) {
  ByteAxis axis;
  if (max_bytes <= 0) max_bytes = kMiB;
  if (max_bytes >= kGiB) {
    axis.unit = kGiB, axis.unit_name = "GiB";
  } else if (max_bytes >= kMiB) {
    axis.unit = kMiB, axis.unit_name = "MiB";
  } else if (max_bytes >= kKiB) {
    axis.unit = kKiB, axis.unit_name = "KiB";
  }
  axis.step = nice_step(max_bytes / axis.unit, 5) * axis.unit;
  axis.top = std::ceil(max_bytes / axis.step) * axis.step;
  return axis;
}

// The SVG box every plot is drawn in, and the plot area inside its margins.
constexpr double kSvgWidth = 960;
constexpr double kSvgHeight = 300;
constexpr double kLeft = 72;
constexpr double kRight = 16;
constexpr double kTop = 14;
constexpr double kBottom = 42;
constexpr double kPlotWidth = kSvgWidth - kLeft - kRight;
constexpr double kPlotHeight = kSvgHeight - kTop - kBottom;

struct PlotScale {
  ByteAxis bytes;
  double last_event = 1;  // the event at the right edge
  double x(double event) const { return kLeft + kPlotWidth * event / last_event; }
  double y(double byte_count) const { return kTop + kPlotHeight * (1 - byte_count / bytes.top); }
};

std::string coordinate(double value) { return printf_string("%.1f", value); }

// One attribute of an element. `value` is HTML already: escaped where it came from input.
struct Attribute {
  const char* name;
  std::string value;
};
using Attributes = std::initializer_list<Attribute>;

// Appends <name a="v" ...>; with `empty`, the self-closing <name a="v" .../> of SVG.
void start_tag(std::string& out, const char* name, Attributes attributes, bool empty = false) {
  out += '<';
  out += name;
  for (const Attribute& attribute : attributes) {
    out += ' ';
    out += attribute.name;
    out += R"(=")";
    out += attribute.value;
    out += '"';
  }
  out += empty ? "/>" : ">";
}

// Appends <name attributes>content</name>; `content` is HTML already.
void element(std::string& out, const char* name, Attributes attributes,
             const std::string& content) {
  start_tag(out, name, attributes);
  out += content;
  out += "</";
  out += name;
  out += '>';
}

void line(std::string& out, const char* css_class, double x1, double y1, double x2, double y2) {
  start_tag(out, "line",
            {{"class", css_class},
             {"x1", coordinate(x1)},
             {"y1", coordinate(y1)},
             {"x2", coordinate(x2)},
             {"y2", coordinate(y2)}},
            true);
}

void text(std::string& out, const char* css_class, double x, double y, const std::string& content) {
  element(out, "text", {{"class", css_class}, {"x", coordinate(x)}, {"y", coordinate(y)}}, content);
}

void append_axes(std::string& out, const PlotScale& scale) {
  const double bottom = kTop + kPlotHeight;
  const double right = kLeft + kPlotWidth;
  out += R"(<g class="grid">)";
  for (double tick = 0; tick <= scale.bytes.top * (1 + 1e-9); tick += scale.bytes.step) {
    line(out, "level", kLeft, scale.y(tick), right, scale.y(tick));
    text(out, "ylabel", kLeft - 8, scale.y(tick),
         printf_string("%g %s", tick / scale.bytes.unit, scale.bytes.unit_name));
  }
  const double event_step = std::max(1.0, std::round(nice_step(scale.last_event, 8)));
  for (double tick = 0; tick <= scale.last_event; tick += event_step) {
    line(out, "tick", scale.x(tick), bottom, scale.x(tick), bottom + 5);
    text(out, "xlabel", scale.x(tick), bottom + 18, printf_string("%.0f", tick));
  }
  out += "</g>";
  start_tag(out, "rect",
            {{"class", "frame"},
             {"x", coordinate(kLeft)},
             {"y", coordinate(kTop)},
             {"width", coordinate(kPlotWidth)},
             {"height", coordinate(kPlotHeight)}},
            true);
  text(out, "axisname", kLeft + kPlotWidth / 2, kSvgHeight - 4, "event");
}

// Dashed lines where each pass after the first begins, labelled when there is room.
void append_pass_boundaries(std::string& out, const ReplayRun& run, const PlotScale& scale) {
  if (run.passes < 2 || run.events == 0) return;
  const double pass_width = scale.x(static_cast<double>(run.events)) - kLeft;
  for (int pass = 0; pass < run.passes; ++pass) {
    const double x = scale.x(static_cast<double>(run.events) * pass);
    if (pass > 0) line(out, "pass", x, kTop, x, kTop + kPlotHeight);
    if (pass_width >= 56)
      text(out, "passlabel", x + 5, kTop + 14, "pass " + std::to_string(pass + 1));
  }
}

// The "x,y x,y ..." points of one series: reserved or live bytes.
std::string series_points(const std::vector<Sample>& points, const PlotScale& scale,
                          bool reserved) {
  std::string text;
  text.reserve(points.size() * 14);
  for (const Sample& sample : points) {
    const auto bytes = static_cast<double>(reserved ? sample.reserved_bytes : sample.live_bytes);
    if (!text.empty()) text += ' ';
    text += coordinate(scale.x(static_cast<double>(sample.event)));
    text += ',';
    text += coordinate(scale.y(bytes));
  }
  return text;
}

void append_plot(std::string& out, const ReplayRun& run, const AllocatorResult& result,
                 const PlotScale& scale) {
  const std::vector<Sample> points = downsample(result.samples, kMaxPlotPoints);
  const std::string name = escape_html(result.allocator);
  start_tag(out, "figure", {{"class", "plot"}, {"id", "plot-" + name}});
  out += "\n<figcaption>";
  element(out, "b", {}, name);
  out += ' ';
  out += escape_html(result.description);
  out += R"(<span class="legend"><span class="key reserved"></span>reserved (peak )";
  out += human_bytes(result.peak_reserved);
  out += R"()<span class="key live"></span>live<span class="key bound"></span>)";
  out += "peak live, the lower bound (";
  out += human_bytes(run.peak_live);
  out += ")</span></figcaption>\n";
  start_tag(out, "svg",
            {{"viewBox", "0 0 " + coordinate(kSvgWidth) + " " + coordinate(kSvgHeight)},
             {"role", "img"},
             {"aria-label", "live and reserved bytes of " + name + " over the events"}});
  append_axes(out, scale);
  append_pass_boundaries(out, run, scale);
  if (points.empty()) {
    text(out, "empty", kLeft + kPlotWidth / 2, kTop + kPlotHeight / 2, "no samples recorded");
  } else {
    // The reserved area: the series closed down to zero bytes at its first and last event.
    const std::string reserved = series_points(points, scale, true);
    const std::string baseline = coordinate(scale.y(0));
    const std::string area_start =
        coordinate(scale.x(static_cast<double>(points.front().event))) + "," + baseline;
    const std::string area_end =
        coordinate(scale.x(static_cast<double>(points.back().event))) + "," + baseline;
    start_tag(
        out, "polygon",
        {{"class", "reserved-area"}, {"points", area_start + " " + reserved + " " + area_end}},
        true);
    start_tag(out, "polyline", {{"class", "reserved"}, {"points", reserved}}, true);
    start_tag(out, "polyline", {{"class", "live"}, {"points", series_points(points, scale, false)}},
              true);
  }
  const double bound = scale.y(static_cast<double>(run.peak_live));
  line(out, "bound", kLeft, bound, kLeft + kPlotWidth, bound);
  out += "</svg>\n";
  if (points.size() < result.samples.size()) {
    element(out, "p", {{"class", "note"}},
            std::to_string(result.samples.size()) + " samples drawn as " +
                std::to_string(points.size()) +
                " groups, each at its highest live and reserved bytes.");
    out += '\n';
  }
  out += "</figure>\n";
}

void append_results_table(std::string& out, const ReplayRun& run) {
  out += R"(<table class="results">
<thead><tr><th>allocator</th><th>description</th><th class="num">peak reserved</th>)"
         R"(<th class="num">ratio</th><th class="num">ns/op</th><th>time per pass</th>)"
         R"(<th class="num">min capacity</th><th>counters</th></tr></thead>
<tbody>
)";
  for (const AllocatorResult& result : run.results) {
    start_tag(out, "tr", result.ran ? Attributes{} : Attributes{{"class", "failed"}});
    element(out, "td", {{"class", "name"}}, escape_html(result.allocator));
    element(out, "td", {}, escape_html(result.description));
    if (!result.ran) {
      element(out, "td", {{"class", "problem"}, {"colspan", "6"}},
              "did not run: " + escape_html(result.problem));
    } else {
      element(out, "td",
              {{"class", "num"}, {"title", std::to_string(result.peak_reserved) + " bytes"}},
              human_bytes(result.peak_reserved));
      element(out, "td", {{"class", "num"}}, printf_string("%.3f", result.ratio));
      element(out, "td", {{"class", "num"}}, printf_string("%.1f", result.ns_per_op));
      element(out, "td", {{"class", "times"}}, pass_times(result.pass_seconds));
      element(out, "td", {{"class", "num"}},
              result.min_capacity ? human_bytes(*result.min_capacity) : "-");
      element(out, "td", {}, escape_html(result.counters));
    }
    out += "</tr>\n";
  }
  out += "</tbody>\n</table>\n";
}

// "64 B to &lt; 128 B" for the bucket [64, 127]; "0 B" for the bucket of size 0.
std::string bucket_range(const SizeBucket& bucket) {
  if (bucket.upper == 0) return "0 B";
  const auto k = static_cast<unsigned>(std::bit_width(bucket.lower) - 1);
  return power_of_two_bytes(k) + " to &lt; " + power_of_two_bytes(k + 1);
}

// A table cell with a bar `value / most` of the column's width.
void bar_cell(std::string& out, std::uint64_t value, std::uint64_t most, const char* kind) {
  const double percent =
      most == 0 ? 0 : 100.0 * static_cast<double>(value) / static_cast<double>(most);
  out += R"(<td class="bar">)";
  element(out, "span", {{"class", kind}, {"style", printf_string("width:%.1f%%", percent)}}, "");
  out += "</td>";
}

void append_histogram(std::string& out, const EventTrace& trace) {
  const std::vector<SizeBucket> buckets = size_histogram(trace);
  if (buckets.empty()) {
    out += "<p>The trace allocates nothing.</p>\n";
    return;
  }
  std::uint64_t most_count = 0;
  std::uint64_t most_bytes = 0;
  std::uint64_t total_count = 0;
  std::uint64_t total_bytes = 0;
  for (const SizeBucket& bucket : buckets) {
    most_count = std::max(most_count, bucket.count);
    most_bytes = std::max(most_bytes, bucket.bytes);
    total_count += bucket.count;
    total_bytes += bucket.bytes;
  }
  out += R"(<table class="histogram">
<colgroup><col class="range"><col class="count"><col class="bar"><col class="bytes"><col class="bar"></colgroup>
<thead><tr><th>size</th><th class="num">allocations</th><th></th><th class="num">bytes</th><th></th></tr></thead>
<tbody>
)";
  for (const SizeBucket& bucket : buckets) {
    out += "<tr>";
    element(out, "td", {}, bucket_range(bucket));
    element(out, "td", {{"class", "num"}}, std::to_string(bucket.count));
    bar_cell(out, bucket.count, most_count, "count");
    element(out, "td", {{"class", "num"}, {"title", std::to_string(bucket.bytes) + " bytes"}},
            human_bytes(bucket.bytes));
    bar_cell(out, bucket.bytes, most_bytes, "bytes");
    out += "</tr>\n";
  }
  out += "</tbody>\n<tfoot><tr><td>all</td>";
  element(out, "td", {{"class", "num"}}, std::to_string(total_count));
  out += "<td></td>";
  element(out, "td", {{"class", "num"}}, human_bytes(total_bytes));
  out += "<td></td></tr></tfoot>\n</table>\n";
}

// Closes a file nobody checks any more: the error path, after the first failure.
struct CloseFile {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

constexpr const char* kStyle = R"(
:root { color-scheme: light; --ink: #1c2430; --muted: #5b6573; --rule: #dde2e8;
  --reserved: #d9730d; --live: #1f6fd1; --bound: #2a9d55; }
* { box-sizing: border-box; }
body { font: 14px/1.45 "DejaVu Sans", system-ui, sans-serif; color: var(--ink);
  max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 6px; font-weight: 600; }
h1 code { font-size: 18px; background: #f1f3f6; padding: 1px 6px; border-radius: 4px;
  word-break: break-all; }
h2 { font-size: 17px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--rule); }
.meta { color: var(--muted); margin: 0; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--rule); text-align: left;
  vertical-align: top; }
th { font-weight: 600; background: #f6f7f9; white-space: nowrap; }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name, td.times { white-space: nowrap; }
td.name { font-weight: 600; }
tr.failed td { background: #fdf2f2; }
td.problem { color: #9b1c1c; }
figure.plot { margin: 14px 0 20px; padding: 10px 14px 6px; border: 1px solid var(--rule);
  border-radius: 6px; }
figcaption { margin-bottom: 4px; }
.legend { float: right; color: var(--muted); font-size: 13px; }
.key { display: inline-block; width: 18px; height: 0; margin: 0 6px 3px 14px;
  vertical-align: middle; border-top: 3px solid; }
.key.reserved { border-color: var(--reserved); }
.key.live { border-color: var(--live); }
.key.bound { border-top: 2px dashed var(--bound); }
svg { display: block; width: 100%; height: auto; }
svg text { font: 12px "DejaVu Sans", system-ui, sans-serif; fill: var(--muted); }
svg .ylabel { text-anchor: end; dominant-baseline: middle; }
svg .xlabel, svg .axisname, svg .empty { text-anchor: middle; }
svg .grid line.level { stroke: #eceff3; stroke-width: 1; }
svg .grid line.tick { stroke: #9aa3ad; }
svg .frame { fill: none; stroke: #9aa3ad; stroke-width: 1; }
svg .pass { stroke: #7b8490; stroke-width: 1; stroke-dasharray: 5 4; }
svg .passlabel { fill: #7b8490; }
svg .reserved-area { fill: var(--reserved); fill-opacity: 0.16; stroke: none; }
svg .reserved { fill: none; stroke: var(--reserved); stroke-width: 1.6; stroke-linejoin: round; }
svg .live { fill: none; stroke: var(--live); stroke-width: 1.3; stroke-linejoin: round; }
svg .bound { stroke: var(--bound); stroke-width: 1.5; stroke-dasharray: 7 4; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0 4px; }
table.histogram { width: 860px; table-layout: fixed; }
col.range { width: 190px; } col.count { width: 110px; } col.bytes { width: 120px; }
col.bar { width: 220px; }
table.histogram td { padding-top: 3px; padding-bottom: 3px; }
td.bar span { display: block; height: 12px; margin-top: 3px; border-radius: 2px; }
td.bar span.count { background: var(--live); }
td.bar span.bytes { background: var(--reserved); }
tfoot td { font-weight: 600; border-bottom: none; }
)";

}  // namespace

std::string escape_html(const std::string& text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&#39;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

std::vector<SizeBucket> size_histogram(const EventTrace& trace) {
  // Bucket 0 holds size 0; bucket k + 1 holds sizes in [2^k, 2^(k+1)).
  std::vector<SizeBucket> buckets(65);
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (i == 0) continue;
    buckets[i].lower = std::uint64_t{1} << (i - 1);
    buckets[i].upper = i == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << i) - 1;
  }
  for (const TraceEvent& event : trace.events) {
    if (event.op != TraceEvent::Op::kAlloc) continue;
    SizeBucket& bucket = buckets[std::bit_width(event.size)];
    ++bucket.count;
    bucket.bytes += event.size;
  }
  const auto used = [](const SizeBucket& bucket) { return bucket.count > 0; };
  const auto first = std::find_if(buckets.begin(), buckets.end(), used);
  if (first == buckets.end()) return {};
  const auto last = std::find_if(buckets.rbegin(), buckets.rend(), used).base();
  return {first, last};
}

std::vector<Sample> downsample(const std::vector<Sample>& samples, std::size_t max_points) {
  max_points = std::max<std::size_t>(max_points, 1);
  if (samples.size() <= max_points) return samples;
  std::vector<Sample> groups;
  groups.reserve(max_points);
  for (std::size_t group = 0; group < max_points; ++group) {
    // Group g takes samples [g * n / m, (g + 1) * n / m): sizes differ by at most one.
    const std::size_t begin = group * samples.size() / max_points;
    const std::size_t end = (group + 1) * samples.size() / max_points;
    Sample merged = samples[end - 1];
    for (std::size_t i = begin; i < end; ++i) {
      merged.live_bytes = std::max(merged.live_bytes, samples[i].live_bytes);
      merged.reserved_bytes = std::max(merged.reserved_bytes, samples[i].reserved_bytes);
    }
    groups.push_back(merged);
  }
  return groups;
}

std::string render_html_report(const ReplayRun& run, const EventTrace& trace) {
  std::string out;
  out.reserve(std::size_t{64} * 1024);
  // The Content-Security-Policy forbids every fetch: the page must stand on its own, and a
  // stray reference shows up as a console error in a browser, not as a network request.
  out += R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="sdalloc replay">
)";
  element(out, "title", {}, "sdalloc replay: " + escape_html(run.trace));
  out += "\n<style>";
  out += kStyle;
  out += "</style>\n</head>\n<body>\n";

  out += "<h1>sdalloc replay: ";
  element(out, "code", {}, escape_html(run.trace));
  out += "</h1>\n";
  element(out, "p", {{"class", "meta"}},
          std::to_string(run.events) + " events per pass (" + std::to_string(run.allocations) +
              " allocations), " + std::to_string(run.passes) +
              (run.passes == 1 ? " pass" : " passes") + ", --touch " + (run.touch ? "on" : "off") +
              ". Peak live bytes, the least any allocator needs: " + human_bytes(run.peak_live) +
              " (" + std::to_string(run.peak_live) + " bytes).");
  out += '\n';

  out += "<h2>Results</h2>\n";
  append_results_table(out, run);

  out += "<h2>Live and reserved bytes over the trace</h2>\n";
  PlotScale scale;
  auto most_bytes = static_cast<double>(run.peak_live);
  double last_event = static_cast<double>(run.events) * std::max(run.passes, 1);
  bool any_ran = false;
  for (const AllocatorResult& result : run.results) {
    if (!result.ran) continue;
    any_ran = true;
    most_bytes = std::max(most_bytes, static_cast<double>(result.peak_reserved));
    for (const Sample& sample : result.samples) {
      most_bytes = std::max({most_bytes, static_cast<double>(sample.reserved_bytes),
                             static_cast<double>(sample.live_bytes)});
      last_event = std::max(last_event, static_cast<double>(sample.event));
    }
  }
  scale.bytes = byte_axis(most_bytes);
  scale.last_event = std::max(last_event, 1.0);
  if (!any_ran) out += "<p>No allocator ran, so there is nothing to plot.</p>\n";
  for (const AllocatorResult& result : run.results) {
    if (result.ran) append_plot(out, run, result, scale);
  }

  out += "<h2>Allocation sizes</h2>\n";
  out += R"(<p class="meta">The trace's allocations in one pass, by size in powers of two.</p>)";
  out += '\n';
  append_histogram(out, trace);
  out += "</body>\n</html>\n";
  return out;
}

void write_html_report(const ReplayRun& run, const EventTrace& trace, const std::string& path) {
  const std::string html = render_html_report(run, trace);
  const auto fail = [&path](int error) {
    throw Error("cannot write HTML report " + path + ": " +
                (error != 0 ? std::strerror(error) : "write failed"));
  };
  errno = 0;
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "wb"));
  if (!file) fail(errno);
  if (std::fwrite(html.data(), 1, html.size(), file.get()) != html.size()) fail(errno);
  // fclose flushes: a full disk often shows only here.
  if (std::fclose(file.release()) != 0) fail(errno);
}

}  // namespace sdalloc::replay
