// Extended attributes and POSIX ACLs (metadata.hpp): read, apply, wire form.
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "metadata.hpp"

namespace rdmakit::cp {
namespace {

constexpr std::string_view kAclAccess = "system.posix_acl_access";
constexpr std::string_view kAclDefault = "system.posix_acl_default";
constexpr std::string_view kSelinux = "security.selinux";

// kPrivileged: trusted.* and security.*, which need CAP_SYS_ADMIN to copy.
enum class Ns : uint8_t { kUser, kPrivileged, kAcl, kOther };

bool has_prefix(std::string_view s, std::string_view p) {
  return s.size() > p.size() && s.substr(0, p.size()) == p;  // a name after the prefix
}

Ns namespace_of(std::string_view n) {
  if (has_prefix(n, "user.")) return Ns::kUser;
  if (has_prefix(n, "trusted.") || has_prefix(n, "security.")) return Ns::kPrivileged;
  if (n == kAclAccess || n == kAclDefault) return Ns::kAcl;
  return Ns::kOther;
}

// May the selection carry this name at all (whoever applies it)?
bool allowed(std::string_view n, XattrSelect sel) {
  switch (namespace_of(n)) {
    case Ns::kUser: return sel.xattrs;
    case Ns::kPrivileged: return sel.xattrs && sel.privileged;
    case Ns::kAcl: return sel.acls;
    case Ns::kOther: return false;
  }
  return false;
}

// Does this process read (and so own, for removal) the name? Without
// CAP_SYS_ADMIN trusted.* is invisible and security.* not ours to copy.
bool selected(std::string_view n, XattrSelect sel, bool admin) {
  return allowed(n, sel) && (namespace_of(n) != Ns::kPrivileged || admin);
}

std::string err_text(int e) { return std::strerror(e); }

// What a failed set or remove most likely means, for the user.
std::string hint(std::string_view n, int e) {
  std::string s = err_text(e);
  const Ns ns = namespace_of(n);
  if ((e == EPERM || e == EACCES) && ns == Ns::kUser)
    s += " (user.* needs write access, and Linux keeps it on regular files and "
         "directories only)";
  else if ((e == EPERM || e == EACCES) && ns == Ns::kPrivileged)
    s += " (needs CAP_SYS_ADMIN, or the security module refuses it)";
  else if (e == EACCES && n == kAclDefault)
    s += " (default ACLs exist on directories only)";
  else if (e == EPERM && ns == Ns::kAcl)
    s += " (ACLs are set by the file's owner or with CAP_FOWNER)";
  else if (e == ENOTSUP && ns == Ns::kAcl)  // also the kernel's answer to a bad header
    s += " (no ACLs on this filesystem or kind of file, or not a valid ACL)";
  else if (e == ENOTSUP)
    s += " (not supported by the filesystem for this kind of file)";
  else if (e == EINVAL && ns == Ns::kAcl)
    s += " (not a valid ACL)";
  return s;
}

// The object the calls go to: an fd, or a path whose last component is not
// followed. An O_PATH fd (f*xattr refuses it) goes through /proc/self/fd.
struct Obj {
  int fd = -1;
  std::string path;
  bool follow = false;

  ssize_t list(char* b, size_t n) const {
    if (fd >= 0) return ::flistxattr(fd, b, n);
    return follow ? ::listxattr(path.c_str(), b, n) : ::llistxattr(path.c_str(), b, n);
  }
  ssize_t get(const char* k, void* v, size_t n) const {
    if (fd >= 0) return ::fgetxattr(fd, k, v, n);
    return follow ? ::getxattr(path.c_str(), k, v, n)
                  : ::lgetxattr(path.c_str(), k, v, n);
  }
  int set(const char* k, const std::string& v) const {
    if (fd >= 0) return ::fsetxattr(fd, k, v.data(), v.size(), 0);
    return follow ? ::setxattr(path.c_str(), k, v.data(), v.size(), 0)
                  : ::lsetxattr(path.c_str(), k, v.data(), v.size(), 0);
  }
  int remove(const char* k) const {
    if (fd >= 0) return ::fremovexattr(fd, k);
    return follow ? ::removexattr(path.c_str(), k) : ::lremovexattr(path.c_str(), k);
  }
};

std::string make_obj(int fd, int dirfd, const char* name, Obj* o) {
  if (fd >= 0) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0) return "fd: " + err_text(errno);
    if ((fl & O_PATH) == 0) {
      o->fd = fd;
      return "";
    }
    o->path = "/proc/self/fd/" + std::to_string(fd);
    o->follow = true;  // the magic link leads to the object itself
    return "";
  }
  if (name == nullptr || *name == '\0') return "no file named";
  if (dirfd == AT_FDCWD) {
    o->path = name;
    return "";
  }
  // Only dirfd is known to be inside the tree: a '/' could lead elsewhere.
  if (std::strchr(name, '/') != nullptr)
    return std::string(name) + ": not one path component";
  o->path = "/proc/self/fd/" + std::to_string(dirfd) + "/" + name;
  return "";
}

// The selected attributes, sorted; `bounded`: refuse more than the wire form
// carries (a sender's clear error instead of the peer's refusal).
std::string read_selected(const Obj& o, XattrSelect sel, bool admin, bool bounded,
                          std::vector<Xattr>* out) {
  out->clear();
  if (!sel.xattrs && !sel.acls) return "";
  // XATTR_LIST_MAX and XATTR_SIZE_MAX are 64 KiB: one call each, no race
  // between asking a size and reading. Kept per thread: a tree has many files.
  thread_local std::string names(64 * 1024, '\0'), value(kMaxXattrValue, '\0');
  const ssize_t n = o.list(names.data(), names.size());
  if (n < 0) return errno == ENOTSUP ? "" : "listxattr: " + err_text(errno);
  size_t total = 0;
  for (size_t at = 0; at < static_cast<size_t>(n);) {
    const char* k = names.data() + at;
    const size_t len = ::strnlen(k, static_cast<size_t>(n) - at);
    at += len + 1;
    if (!selected(std::string_view(k, len), sel, admin)) continue;
    const ssize_t v = o.get(k, value.data(), value.size());
    if (v < 0) {
      if (errno == ENODATA) continue;  // removed since the list
      return std::string(k) + ": " + err_text(errno);
    }
    total += len + static_cast<size_t>(v);
    if (bounded && (out->size() == kMaxXattrs || total > kMaxXattrTotal))
      return "more extended attributes than can be sent (1024, 1 MiB in all)";
    out->push_back({std::string(k, len), value.substr(0, static_cast<size_t>(v))});
  }
  std::sort(out->begin(), out->end(),
            [](const Xattr& a, const Xattr& b) { return a.name < b.name; });
  return "";
}

// Collects failures; a long list is cut (a file's story, not a log).
class Failures {
 public:
  void add(std::string s) {
    if (++count_ <= 4) text_ += (text_.empty() ? "" : "; ") + s;
  }
  std::string text() const {
    if (count_ <= 4) return text_;
    return text_ + "; and " + std::to_string(count_ - 4) + " more";
  }

 private:
  std::string text_;
  size_t count_ = 0;
};

std::string name_problem(std::string_view n) {
  if (n.empty() || n.size() > kMaxXattrName)
    return "attribute name of " + std::to_string(n.size()) + " bytes";
  if (n.find('\0') != std::string_view::npos) return "attribute name with a NUL";
  if (namespace_of(n) == Ns::kOther)
    return "attribute " + std::string(n) + " outside the copied namespaces";
  return "";
}

}  // namespace

std::string read_xattrs(int fd, int dirfd, const char* name, XattrSelect sel,
                        std::vector<Xattr>* out) {
  out->clear();
  Obj o;
  const std::string why = make_obj(fd, dirfd, name, &o);
  if (!why.empty()) return why;
  return read_selected(o, sel, have_capability(CAP_SYS_ADMIN), true, out);
}

std::string apply_xattrs(int fd, int dirfd, const char* name, XattrSelect sel,
                         const std::vector<Xattr>& want) {
  Obj o;
  std::string why = make_obj(fd, dirfd, name, &o);
  if (!why.empty()) return why;
  const bool admin = have_capability(CAP_SYS_ADMIN);
  std::vector<Xattr> have;
  why = read_selected(o, sel, admin, false, &have);
  if (!why.empty()) return why;
  std::vector<std::string_view> wanted;  // sorted, to look names up
  for (const auto& w : want) wanted.push_back(w.name);
  std::sort(wanted.begin(), wanted.end());
  Failures fail;
  // Removals first: they free room the new values may need (ext4 keeps
  // them in one block).
  for (const auto& h : have) {
    if (h.name == kSelinux || std::binary_search(wanted.begin(), wanted.end(), h.name))
      continue;
    if (o.remove(h.name.c_str()) != 0 && errno != ENODATA)
      fail.add("remove " + h.name + ": " + hint(h.name, errno));
  }
  for (const auto& w : want) {
    // A NUL would cut the name short in the syscall: another attribute.
    std::string bad = name_problem(w.name);
    if (bad.empty() && !allowed(w.name, sel)) bad = w.name + ": not selected (-X/-A)";
    if (!bad.empty()) {
      fail.add(bad);
      continue;
    }
    const auto h =
        std::lower_bound(have.begin(), have.end(), w.name,
                         [](const Xattr& a, const std::string& n) { return a.name < n; });
    if (h != have.end() && h->name == w.name && h->value == w.value)
      continue;  // no needless ctime change
    if (o.set(w.name.c_str(), w.value) != 0)
      fail.add("set " + w.name + ": " + hint(w.name, errno));
  }
  return fail.text();
}

void encode_xattrs(const std::vector<Xattr>& in, std::vector<std::byte>* out) {
  using namespace metadata_wire;
  put_u32(out, static_cast<uint32_t>(in.size()));
  for (const auto& x : in) {
    put_str(out, x.name);
    put_str(out, x.value);
  }
}

bool decode_xattrs(std::span<const std::byte> in, size_t* consumed,
                   std::vector<Xattr>* out, std::string* why) {
  out->clear();
  auto refuse = [&](std::string s) {
    out->clear();
    *why = std::move(s);
    return false;
  };
  metadata_wire::Cursor c(in);
  uint32_t count = 0;
  if (!c.u32(&count)) return refuse("truncated attribute list");
  if (count > kMaxXattrs)
    return refuse(std::to_string(count) + " attributes (at most 1024)");
  out->reserve(count);
  size_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Xattr x;
    uint32_t len = 0;
    if (!c.u32(&len)) return refuse("truncated attribute list");
    if (len == 0 || len > kMaxXattrName)
      return refuse("attribute name of " + std::to_string(len) + " bytes");
    if (!c.bytes(len, &x.name)) return refuse("truncated attribute list");
    if (std::string bad = name_problem(x.name); !bad.empty()) return refuse(bad);
    if (!c.u32(&len)) return refuse("truncated attribute list");
    if (len > kMaxXattrValue)
      return refuse(x.name + ": value of " + std::to_string(len) + " bytes");
    total += x.name.size() + len;
    if (total > kMaxXattrTotal) return refuse("attributes over 1 MiB in all");
    if (!c.bytes(len, &x.value)) return refuse("truncated attribute list");
    out->push_back(std::move(x));
  }
  std::sort(out->begin(), out->end(),
            [](const Xattr& a, const Xattr& b) { return a.name < b.name; });
  for (size_t i = 1; i < out->size(); ++i)
    if ((*out)[i].name == (*out)[i - 1].name)
      return refuse("attribute " + (*out)[i].name + " twice");
  *consumed = c.pos();
  return true;
}

}  // namespace rdmakit::cp
