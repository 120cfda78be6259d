#pragma once
// A channel: one queue pair of an endpoint. Messages (SEND/RECV with credit
// flow control), one-sided WRITE/READ to the peer's named buffers, and
// WRITE_WITH_IMM notifications.
//
// Flow control: the peer posts recv_depth RECVs per channel and tells us, by
// a one-sided WRITE into our memory, how many it has re-posted. A SEND or
// WRITE_WITH_IMM takes one credit; with none left, send() waits for one (up
// to op_timeout) instead of overrunning the peer, so a burst never ends in
// RNR. Credit returns consume no RECV, so they cannot deadlock.
#include <chrono>
#include <cstdint>
#include <functional>
#include <rdmakit/export.hpp>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/buffer_pool.hpp>
#include <rdmakit/session/options.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace rdmakit::session {

class Channel;
class Endpoint;
namespace detail {
// The object behind every Channel and what it lends a Message: both are
// defined in src/session/, not part of the API.
class ChannelCore;
struct Delivery;
}  // namespace detail

// A received message or notification. Its buffer is lent by the channel and
// re-posted (and the credit returned) when the Message is destroyed, so keep
// it only as long as needed. Handlers may move it out to keep it longer.
class RDMAKIT_API Message {
 public:
  Message() = default;
  // Made only by the channel that lends the buffer (defined, inline, with
  // detail::Delivery in src/session/channel_core.hpp).
  inline explicit Message(const detail::Delivery& lent) noexcept;
  Message(Message&& other) noexcept { *this = std::move(other); }
  Message& operator=(Message&& other) noexcept;
  ~Message() { release(); }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;

  explicit operator bool() const noexcept { return channel_ != nullptr; }
  std::span<const std::byte> data() const noexcept { return {data_, size_}; }
  std::string_view text() const noexcept {
    return {reinterpret_cast<const char*>(data_), size_};
  }
  // A WRITE_WITH_IMM notification: no payload; imm() and written() describe it.
  bool is_notification() const noexcept { return notification_; }
  uint32_t imm() const noexcept { return imm_; }
  uint32_t written() const noexcept { return written_; }
  Channel* channel() const noexcept { return channel_; }
  void release() noexcept;

 private:
  Channel* channel_ = nullptr;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint32_t slot_ = 0;
  uint32_t imm_ = 0;
  uint32_t written_ = 0;
  bool notification_ = false;
};

// Local registered memory for WRITE/READ: a pool Buffer or a region of the
// session's context.
struct Local {
  std::byte* addr = nullptr;
  size_t length = 0;
  uint32_t lkey = 0;
  static Local of(const Buffer& buffer) noexcept {
    return {buffer.data(), buffer.capacity(), buffer.lkey()};
  }
  static Local of(const MemoryRegion& mr) noexcept {
    return {mr.data(), mr.length(), mr.lkey()};
  }
};

using OpCallback = std::function<void(const OpResult&)>;

// One WRITE of a batch (Channel::write_batch).
struct WriteSegment {
  uint64_t offset = 0;  // in the remote buffer
  Local src;
  size_t length = 0;
};

// A peer's named buffer resolved once (Channel::remote()), for WRITE/READ
// without a name lookup per operation. Cheap to copy; valid as long as the
// endpoint. Empty (false) if the peer exposes no buffer of that name.
class RemoteBuffer {
 public:
  RemoteBuffer() = default;
  // The handle of one entry of Endpoint::remote_buffers() (what remote() finds
  // by name); valid as long as the entry.
  explicit RemoteBuffer(const std::pair<std::string, RemoteRegion>& entry) noexcept
      : region_(entry.second), name_(&entry.first) {}
  explicit operator bool() const noexcept { return name_ != nullptr; }
  std::string_view name() const noexcept {
    return name_ != nullptr ? std::string_view(*name_) : std::string_view();
  }
  uint64_t length() const noexcept { return region_.length; }
  const RemoteRegion& region() const noexcept { return region_; }

 private:
  RemoteRegion region_{};
  const std::string* name_ = nullptr;
};

// Every Channel is a detail::ChannelCore (src/session/channel_core.hpp),
// made and destroyed by its Endpoint: this class holds no state of its own.
class RDMAKIT_API Channel {
 public:
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& name() const noexcept;
  uint32_t index() const noexcept;
  Endpoint& endpoint() const noexcept;
  // Largest message the peer accepts.
  uint32_t max_message() const noexcept;

  // Copies `message` into a registered send slot (small ones go INLINE).
  OpResult send(std::span<const std::byte> message);
  OpResult send(std::string_view text) {
    return send(std::as_bytes(std::span(text.data(), text.size())));
  }
  // Zero copy: sends buffer.size() bytes from the pool buffer, which is
  // returned to its pool when the SEND completes.
  OpResult send(Buffer&& buffer);

  // Pull delivery (when no on_message handler is set): waits up to timeout
  // for the next message. kTimeout if none, kClosed once disconnected.
  OpResult recv(Message* out, std::chrono::milliseconds timeout);

  // One-sided operations on the peer's buffer `remote` (a name the peer
  // exposed) at `offset`. `done` runs on the progress thread when the work
  // request completes (also with an error if the endpoint goes down first).
  // The return value reports what failed before anything was posted.
  //
  // Without `done`, WRITE/READ/WRITE_WITH_IMM are selectively signaled: no
  // completion is reported for them unless they fail (the endpoint then
  // closes). As in verbs RC, the completion of a later operation on the same
  // channel implies theirs, so a stream of WRITEs needs a callback only on
  // every n-th (and the last) one.
  OpResult write(std::string_view remote, uint64_t offset, Local src, size_t length,
                 OpCallback done = {});
  OpResult read(std::string_view remote, uint64_t offset, Local dst, size_t length,
                OpCallback done = {});
  // WRITE, then a notification with `imm` at the peer (takes one credit).
  OpResult write_with_imm(std::string_view remote, uint64_t offset, Local src,
                          size_t length, uint32_t imm, OpCallback done = {});
  // The same on a buffer resolved once with remote(): no name lookup.
  RemoteBuffer remote(std::string_view name) const noexcept;
  // As remote(), with an error naming the buffers the peer does expose.
  OpResult resolve(std::string_view name, RemoteBuffer* out) const;
  OpResult write(const RemoteBuffer& remote, uint64_t offset, Local src, size_t length,
                 OpCallback done = {});
  OpResult read(const RemoteBuffer& remote, uint64_t offset, Local dst, size_t length,
                OpCallback done = {});
  OpResult write_with_imm(const RemoteBuffer& remote, uint64_t offset, Local src,
                          size_t length, uint32_t imm, OpCallback done = {});
  // One WRITE per segment, posted as one list (one doorbell; on tcp the
  // frames leave in one sendmsg instead of one each). `done`, if any, runs
  // when the last one completes, which implies the others (in order on the
  // channel); the rest are selectively signaled. Every range is checked
  // before anything is posted.
  OpResult write_batch(const RemoteBuffer& remote, std::span<const WriteSegment> segments,
                       OpCallback done = {});
  // The same, waiting up to op_timeout for the completion.
  OpResult write_sync(std::string_view remote, uint64_t offset, Local src, size_t length);
  OpResult read_sync(std::string_view remote, uint64_t offset, Local dst, size_t length);
  OpResult write_with_imm_sync(std::string_view remote, uint64_t offset, Local src,
                               size_t length, uint32_t imm);

  // Credits left (sends possible before the peer re-posts).
  uint32_t credits() const noexcept;

 protected:
  Channel() = default;
  ~Channel() = default;
};

}  // namespace rdmakit::session
