// sdalloc_run_probe - the program `sdalloc run`'s tests run under each allocator.
//
//     sdalloc_run_probe [--mib N] [--log FILE] [--fail-under NAME] [--stdout TEXT]
//                       [--stderr TEXT] [--abort]
//
// Allocates N MiB with malloc and writes every 4 KiB page (so peak RSS covers them), appends
// one line "<allocator> <SDALLOC_PRELOAD_CONF or ->" to FILE (the allocator: sdalloc-<mode> when
// SDALLOC_PRELOAD_CONF names a mode, else the preloaded library found by a symbol only it defines),
// writes the TEXTs on stdout and stderr, and exits 7 when the allocator is NAME (or aborts with
// --abort).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::string allocator_name() {
  const char* conf = std::getenv("SDALLOC_PRELOAD_CONF");
  if (conf != nullptr && std::strncmp(conf, "mode:", 5) == 0) {
    const std::string mode(conf + 5, std::strcspn(conf + 5, ","));
    return "sdalloc-" + mode;
  }
  if (::dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  if (::dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  if (::dlsym(RTLD_DEFAULT, "mi_malloc") != nullptr) return "mimalloc";
  return "glibc";
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 0;
  const char* log = nullptr;
  const char* fail_under = nullptr;
  const char* message = nullptr;
  const char* out_message = nullptr;
  bool abort_now = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--mib" && has_value) {
      mib = std::strtol(argv[++i], nullptr, 10);
    } else if (arg == "--log" && has_value) {
      log = argv[++i];
    } else if (arg == "--fail-under" && has_value) {
      fail_under = argv[++i];
    } else if (arg == "--stdout" && has_value) {
      out_message = argv[++i];
    } else if (arg == "--stderr" && has_value) {
      message = argv[++i];
    } else if (arg == "--abort") {
      abort_now = true;
    } else {
      std::fprintf(stderr, "sdalloc_run_probe: bad argument %s\n", arg.c_str());
      return 2;
    }
  }
  const std::size_t bytes = std::size_t(mib) << 20;
  auto* block = static_cast<volatile char*>(std::malloc(bytes));
  if (bytes != 0 && block == nullptr) return 3;
  for (std::size_t at = 0; at < bytes; at += 4096) block[at] = char(at >> 12);
  const std::string name = allocator_name();
  if (log != nullptr) {
    std::FILE* out = std::fopen(log, "a");
    if (out == nullptr) return 4;
    const char* conf = std::getenv("SDALLOC_PRELOAD_CONF");
    std::fprintf(out, "%s %s\n", name.c_str(), conf != nullptr ? conf : "-");
    std::fclose(out);
  }
  std::free(const_cast<char*>(block));
  if (out_message != nullptr) std::printf("%s\n", out_message);
  if (message != nullptr) std::fprintf(stderr, "%s\n", message);
  if (abort_now) std::abort();
  return fail_under != nullptr && name == fail_under ? 7 : 0;
}
