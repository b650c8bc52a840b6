// libsdalloc_fake_preload.so - stands in for sdalloc's drop-in library in `sdalloc run`'s tests.
//
// It replaces no allocator: its constructor only writes the report the drop-in writes, to the
// path after "report:" in SDALLOC_PRELOAD_CONF: {"mode": <mode:>, "peak_live_bytes": 1 MiB,
// "peak_reserved_bytes": 2 MiB, "pool_allocations": 10, "system_allocations": 2}. With
// SDALLOC_FAKE_BROKEN_REPORT set it writes a report that is not JSON.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// The value of "key:" in a comma-separated SDALLOC_PRELOAD_CONF, "" when absent.
std::string conf_value(const char* conf, const char* key) {
  const std::string text = conf;
  const std::string prefix = std::string(key) + ":";
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (text.compare(start, prefix.size(), prefix) == 0) {
      return text.substr(start + prefix.size(), comma - start - prefix.size());
    }
    start = comma + 1;
  }
  return "";
}

__attribute__((constructor)) void write_report() {
  const char* conf = std::getenv("SDALLOC_PRELOAD_CONF");
  if (conf == nullptr) return;
  const std::string path = conf_value(conf, "report");
  if (path.empty()) return;
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) return;
  if (std::getenv("SDALLOC_FAKE_BROKEN_REPORT") != nullptr) {
    std::fputs("{\"mode\": ", out);
  } else {
    std::fprintf(out,
                 "{\"mode\": \"%s\", \"peak_live_bytes\": 1048576, \"peak_reserved_bytes\": "
                 "2097152, \"pool_allocations\": 10, \"system_allocations\": 2}\n",
                 conf_value(conf, "mode").c_str());
  }
  std::fclose(out);
}

}  // namespace
