#pragma once
// A byte count as people read it: the largest binary unit that divides it
// exactly ("8 MiB", "1536 B"), or "unlimited" for UINT64_MAX (an rlimit or a
// device limit without a bound). The library's logs and the tools print the
// same text.
#include <cstdint>
#include <string>

namespace rdmakit::detail {

inline std::string format_bytes(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "unlimited";
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0)
    return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace rdmakit::detail
