#include "itemize.hpp"

#include "report.hpp"

namespace rdmakit::cp {

std::string item_code(ItemSide side, Kind kind, uint16_t bits) {
  std::string code(11, '.');
  const bool moves = (bits & kItemTransfer) != 0;
  switch (kind) {
    case Kind::kFile:
      code[0] = moves ? (side == ItemSide::kPush ? '<' : '>') : '.';
      code[1] = 'f';
      break;
    case Kind::kHardlink:
      code[0] = 'h';
      code[1] = 'f';
      break;
    case Kind::kDir:
      code[0] = (bits & kItemNew) ? 'c' : '.';
      code[1] = 'd';
      break;
    case Kind::kSymlink:
      code[0] = (bits & (kItemNew | kItemChecksum)) ? 'c' : '.';
      code[1] = 'L';
      break;
  }
  if (bits & kItemNew) {
    code.replace(2, 9, 9, '+');
    return code;
  }
  if (bits & kItemChecksum) code[2] = 'c';
  if (bits & kItemSize) code[3] = 's';
  if (bits & kItemTime) code[4] = 't';
  if (bits & kItemPerms) code[5] = 'p';
  if (bits & kItemOwner) code[6] = 'o';
  if (bits & kItemGroup) code[7] = 'g';
  if (bits & kItemAcl) code[9] = 'a';
  if (bits & kItemXattr) code[10] = 'x';
  return code;
}

std::string item_line(ItemSide side, Kind kind, uint16_t bits, const std::string& path,
                      const std::string& link) {
  std::string line = item_code(side, kind, bits);
  line.append(" ").append(printable(path));
  if (kind == Kind::kDir) line.append("/");
  if (kind == Kind::kSymlink) line.append(" -> ").append(printable(link));
  if (kind == Kind::kHardlink) line.append(" => ").append(printable(link));
  return line;
}

std::string deleting_line(const std::string& path, bool is_dir) {
  std::string line = "*deleting   " + printable(path);
  if (is_dir) line.push_back('/');
  return line;
}

}  // namespace rdmakit::cp
