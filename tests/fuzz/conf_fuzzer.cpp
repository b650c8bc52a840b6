// conf_fuzzer.cpp - libFuzzer target: the SDALLOC_CONF parser (the PyTorch shim's option
// table over config/option_table.hpp) and the size parser, on arbitrary text.
//
// Every input is accepted or refused with an InvalidArgument. What is accepted prints
// (format_shim_config) as text that parses back to settings that print the same; a size that
// parses prints (size_text) as text that parses back to the same number of bytes.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "config/option_table.hpp"
#include "torch_shim/shim_config.hpp"

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const sdalloc::torch_shim::ShimConfig config = sdalloc::torch_shim::parse_shim_config(text);
    const std::string printed = sdalloc::torch_shim::format_shim_config(config);
    const sdalloc::torch_shim::ShimConfig back = sdalloc::torch_shim::parse_shim_config(printed);
    require(sdalloc::torch_shim::format_shim_config(back) == printed,
            "format_shim_config then parse_shim_config changed the settings");
  } catch (const sdalloc::InvalidArgument&) {
  }
  try {
    const std::size_t bytes = sdalloc::config::parse_size(text);
    require(sdalloc::config::parse_size(sdalloc::config::size_text(bytes)) == bytes,
            "size_text then parse_size changed the size");
  } catch (const sdalloc::InvalidArgument&) {
  }
  return 0;
}
