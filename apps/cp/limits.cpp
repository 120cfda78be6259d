#include "limits.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>

namespace rdmakit::cp {

bool parse_size(const std::string& text, uint64_t* out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  uint64_t v = 0;
  size_t i = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  unsigned shift = 0;
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
    const std::string rest = text.substr(i + 1);  // "16G", "16GB", "16GiB"
    if (!rest.empty() && rest != "B" && rest != "iB") return false;
  } else if (i != text.size()) {
    return false;
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

bool fits_free_space(int fd, uint64_t need, std::string* why) {
  if (need == 0) return true;
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) != 0 || vfs.f_frsize == 0) return true;
  const uint64_t unit = vfs.f_frsize;
  // Saturating products: a filesystem reporting absurd counts cannot wrap.
  auto bytes = [unit](uint64_t blocks) {
    return blocks > UINT64_MAX / unit ? UINT64_MAX : blocks * unit;
  };
  const uint64_t total = bytes(vfs.f_blocks);
  const uint64_t avail = bytes(vfs.f_bavail);
  const uint64_t margin = std::min<uint64_t>(total / 100, uint64_t{256} << 20);
  if (avail >= margin && need <= avail - margin) return true;
  *why = "no space left on device: " + std::to_string(need) + " bytes declared, " +
         std::to_string(avail > margin ? avail - margin : 0) +
         " bytes free beyond the reserve of " + std::to_string(margin);
  return false;
}

}  // namespace rdmakit::cp
