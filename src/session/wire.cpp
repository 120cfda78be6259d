#include "wire.hpp"

#include <cstring>
#include <rdmakit/detail/hello_frame.hpp>

namespace rdmakit::session::detail {
namespace {

// Every handshake message (hello, reply, buffer table) starts with it.
constexpr rdmakit::detail::HelloFrame<uint16_t> kFrame{
    kMagic, kVersion, rdmakit::detail::HelloFrame<uint16_t>::kPrefix,
    rdmakit::detail::HelloSize::kAtLeast};

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    append(&v, sizeof(T));
  }
  void put_frame() {
    std::byte prefix[kFrame.kPrefix];
    kFrame.put(prefix);
    append(prefix, sizeof prefix);
  }
  void put_string(const std::string& s) {
    put(static_cast<uint8_t>(s.size()));
    append(s.data(), s.size());
  }
  void put_region(const RemoteRegion& r) {
    std::byte blob[RemoteRegion::kSerializedSize];
    r.serialize(std::span<std::byte, RemoteRegion::kSerializedSize>(blob));
    append(blob, sizeof blob);
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  // Out of line: GCC 12 at -O3 reports false out-of-bounds writes for small
  // vector inserts inlined into encode() (-Wstringop-overflow).
  [[gnu::noinline]] void append(const void* p, size_t n) {
    const size_t old = out_.size();
    out_.resize(old + n);
    if (n != 0) std::memcpy(out_.data() + old, p, n);
  }

  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  std::span<const std::byte> rest() const noexcept { return in_.subspan(pos_); }
  void skip(size_t n) noexcept { pos_ += n; }
  template <typename T>
  bool get(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string* s, size_t max) {
    uint8_t n = 0;
    if (!get(&n) || n > max || in_.size() - pos_ < n) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool get_region(RemoteRegion* r) {
    if (in_.size() - pos_ < RemoteRegion::kSerializedSize) return false;
    auto parsed =
        RemoteRegion::deserialize(in_.subspan(pos_, RemoteRegion::kSerializedSize));
    if (!parsed) return false;
    *r = *parsed;
    pos_ += RemoteRegion::kSerializedSize;
    return true;
  }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

bool check_magic(Reader& r, std::string* why) {
  const auto check = kFrame.check(r.rest());
  if (check.fault == rdmakit::detail::HelloFault::kMagic) {
    *why = "not a session handshake (bad magic)";
    return false;
  }
  if (!check) {
    *why = "session protocol version " + std::to_string(check.version) + ", expected " +
           std::to_string(kVersion);
    return false;
  }
  r.skip(kFrame.kPrefix);
  return true;
}

}  // namespace

std::vector<std::byte> encode(const Hello& h) {
  Writer w;
  w.put_frame();
  w.put(h.endpoint_id);
  w.put(h.channel);
  w.put(h.channels);
  w.put(h.depth);
  w.put(h.max_message);
  return w.take();
}

std::optional<Hello> decode_hello(std::span<const std::byte> in, std::string* why) {
  Reader r(in);
  if (!check_magic(r, why)) return std::nullopt;
  Hello h;
  if (!r.get(&h.endpoint_id) || !r.get(&h.channel) || !r.get(&h.channels) ||
      !r.get(&h.depth) || !r.get(&h.max_message)) {
    *why = "truncated or malformed session hello";
    return std::nullopt;
  }
  if (h.channels == 0 || h.channels > kMaxChannels || h.channel >= h.channels ||
      h.depth == 0 || h.depth > kMaxDepth || h.max_message == 0 ||
      h.max_message > (64u << 20)) {
    *why = "session hello out of range (channels " + std::to_string(h.channels) +
           ", depth " + std::to_string(h.depth) + ", max_message " +
           std::to_string(h.max_message) + ")";
    return std::nullopt;
  }
  return h;
}

std::vector<std::byte> encode(const Reply& reply) {
  Writer w;
  w.put_frame();
  w.put(reply.depth);
  w.put(reply.max_message);
  w.put(reply.channel_port);
  return w.take();
}

std::optional<Reply> decode_reply(std::span<const std::byte> in, std::string* why) {
  Reader r(in);
  if (!check_magic(r, why)) return std::nullopt;
  Reply reply;
  if (!r.get(&reply.depth) || !r.get(&reply.max_message) || !r.get(&reply.channel_port) ||
      reply.depth == 0 || reply.depth > kMaxDepth || reply.max_message == 0) {
    *why = "malformed session reply";
    return std::nullopt;
  }
  return reply;
}

std::vector<std::byte> encode(const Table& t) {
  Writer w;
  w.put_frame();
  w.put_region(t.ctrl);
  w.put(static_cast<uint8_t>(t.channel_names.size()));
  for (const auto& name : t.channel_names) w.put_string(name);
  w.put(static_cast<uint16_t>(t.buffers.size()));
  for (const auto& [name, region] : t.buffers) {
    w.put_string(name);
    w.put_region(region);
  }
  return w.take();
}

std::optional<Table> decode_table(std::span<const std::byte> in, std::string* why) {
  Reader r(in);
  if (!check_magic(r, why)) return std::nullopt;
  Table t;
  uint16_t n = 0;
  uint8_t channels = 0;
  if (!r.get_region(&t.ctrl) || t.ctrl.length < kCtrlSize || !r.get(&channels) ||
      channels > kMaxChannels) {
    *why = "malformed buffer table";
    return std::nullopt;
  }
  for (uint8_t i = 0; i < channels; ++i) {
    std::string name;
    if (!r.get_string(&name, kMaxChannelName)) {
      *why = "malformed channel name " + std::to_string(i) + " in the buffer table";
      return std::nullopt;
    }
    t.channel_names.push_back(std::move(name));
  }
  if (!r.get(&n)) {
    *why = "malformed buffer table";
    return std::nullopt;
  }
  for (uint16_t i = 0; i < n; ++i) {
    std::string name;
    RemoteRegion region;
    if (!r.get_string(&name, kMaxBufferName) || !r.get_region(&region)) {
      *why = "malformed buffer table entry " + std::to_string(i);
      return std::nullopt;
    }
    t.buffers.emplace_back(std::move(name), region);
  }
  return t;
}

}  // namespace rdmakit::session::detail
