#pragma once
// Path confinement: every path a peer names is opened beneath a directory fd
// and may not leave it ("..", absolute paths, symlinks pointing outside).
// openat2(RESOLVE_BENEATH) is used when the kernel has it (5.6+); otherwise
// each component is opened with O_NOFOLLOW after a lexical check (stricter:
// no symlink in any component, the last included), and the reason is logged
// once. RDMAKIT_CP_NO_OPENAT2=1 forces the fallback (tests).
#include <string>
#include <string_view>
#include <utility>

namespace rdmakit::cp {

// True if openat2 with RESOLVE_BENEATH works here (probed once).
bool have_openat2();
// "openat2(RESOLVE_BENEATH)" or the fallback with its reason.
const char* confinement_method();

// A relative path a peer may name: not empty, not absolute, no "." or ".."
// component, no empty component. Returns the reason it is refused, or "".
std::string check_relative(std::string_view path);

// Opens `path` (relative, checked) beneath dirfd. flags are open(2) flags;
// O_NOFOLLOW applies to the last component. Returns fd or -errno (-EXDEV
// when the path would leave dirfd).
int open_beneath(int dirfd, const std::string& path, int flags, unsigned mode = 0);

// "a/b/c" -> {"a/b", "c"}; "c" -> {".", "c"}.
std::pair<std::string, std::string> split_parent(const std::string& path);

}  // namespace rdmakit::cp
