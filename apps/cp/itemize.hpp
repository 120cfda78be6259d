#pragma once
// rsync's itemized changes (-i, its %i): "YXcstpoguax NAME", one line per
// entry that changes, and "*deleting   NAME" per deletion. Y is '<' (sent to
// the remote side), '>' (received), 'c' (created here: directory, symlink),
// 'h' (hard link) or '.' (attributes only); X the kind (f, d, L); then one
// letter per changed attribute, '+' x 9 for a new entry.
#include <cstdint>
#include <string>

#include "protocol.hpp"

namespace rdmakit::cp {

// Which way content moves from the client's point of view.
enum class ItemSide : uint8_t { kPush, kPull };

// The 11-character change string.
std::string item_code(ItemSide side, Kind kind, uint16_t bits);

// The whole line as rsync prints it: code, name (directories end in '/'),
// " -> target" for a symlink, " => first" for a hard link.
std::string item_line(ItemSide side, Kind kind, uint16_t bits, const std::string& path,
                      const std::string& link);

// "*deleting   NAME" (NAME ends in '/' for a directory).
std::string deleting_line(const std::string& path, bool is_dir);

}  // namespace rdmakit::cp
