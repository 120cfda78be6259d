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
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/buffer_pool.hpp>
#include <rdmakit/session/options.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmakit::session {

class Channel;
class Endpoint;
namespace detail {
class Worker;
class Engine;
struct EndpointSetup;

// A channel's lock. Where library threads share the channel (poller and
// worker thread modes) it is a mutex; in ThreadMode::kApplication the channel
// has one owner at a time (the thread that drives progress(), as the core's
// QPs there are single-owner), so locking is a predictable branch and no
// atomic instruction on the data path.
class DatapathMutex {
 public:
  void lock() {
    if (shared_) mu_.lock();
  }
  void unlock() {
    if (shared_) mu_.unlock();
  }
  bool try_lock() { return !shared_ || mu_.try_lock(); }
  // Set once, before the channel carries traffic.
  void set_shared(bool shared) noexcept { shared_ = shared; }
  bool shared() const noexcept { return shared_; }

 private:
  std::mutex mu_;
  bool shared_ = true;
};
}  // namespace detail

// A received message or notification. Its buffer is lent by the channel and
// re-posted (and the credit returned) when the Message is destroyed, so keep
// it only as long as needed. Handlers may move it out to keep it longer.
class Message {
 public:
  Message() = default;
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
  friend class Channel;
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
  explicit operator bool() const noexcept { return name_ != nullptr; }
  std::string_view name() const noexcept {
    return name_ != nullptr ? std::string_view(*name_) : std::string_view();
  }
  uint64_t length() const noexcept { return region_.length; }
  const RemoteRegion& region() const noexcept { return region_; }

 private:
  friend class Channel;
  RemoteRegion region_{};
  const std::string* name_ = nullptr;
};

class Channel {
 public:
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& name() const noexcept { return name_; }
  uint32_t index() const noexcept { return index_; }
  Endpoint& endpoint() const noexcept { return *endpoint_; }
  // Largest message the peer accepts.
  uint32_t max_message() const noexcept { return peer_max_message_; }

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

 private:
  friend class Endpoint;
  friend class Message;
  friend class detail::Worker;
  friend class detail::Engine;
  friend struct detail::EndpointSetup;
  Channel(Endpoint* endpoint, uint32_t index, std::string name);

  struct Pending {
    uint8_t kind = 0;  // WrKind
    bool busy = false;
    Opcode opcode = Opcode::kSend;
    OpCallback done;
    Buffer buffer;  // zero-copy SEND: returned on completion
  };

  OpResult one_sided(Opcode opcode, std::string_view remote, uint64_t offset, Local local,
                     size_t length, uint32_t imm, OpCallback done);
  OpResult one_sided(Opcode opcode, const RemoteBuffer& remote, uint64_t offset,
                     Local local, size_t length, uint32_t imm, OpCallback done);
  // Selective signaling: true if this WR must be signaled (every
  // kSignalEvery-th of a run of unsignaled ones). Under mu_.
  bool signal_due() noexcept;
  OpResult sync(const std::function<OpResult(OpCallback)>& start);
  OpResult sync_progressing(const std::function<OpResult(OpCallback)>& start);
  OpResult recv_progressing(Message* out, std::chrono::milliseconds timeout);
  OpResult wait_credit(std::unique_lock<detail::DatapathMutex>& lock);
  OpResult post_locked(SendWr& wr, uint8_t kind, OpCallback& done, Buffer* buffer);
  OpResult post_retrying(std::unique_lock<detail::DatapathMutex>& lock, SendWr& wr,
                         uint8_t kind, OpCallback& done, Buffer* buffer);
  Message pop_inbox() noexcept;
  void progress_or_pause(uint32_t spins);
  OpResult closed_result(const char* what) const;
  OpResult fail(Errc code, const char* what, const std::string& why) const;
  void repost(uint32_t slot) noexcept;
  void report_credits_locked() noexcept;
  void count_sent() noexcept {
    ++sent_;
    if (++next_slot_ == peer_depth_) next_slot_ = 0;
  }
  // Worker side.
  void on_recv(const Completion& c);
  bool take_pending(uint32_t index, Pending* out);
  void fail_all_pending(const DisconnectInfo& info);
  void mark_closed();
  void release_memory();

  Endpoint* endpoint_;
  uint32_t index_;
  std::string name_;
  bool handler_mode_ = false;  // Handlers::on_message set
  bool app_progress_ = false;  // kApplication: recv()/sync progress themselves
  // kApplication: the destination of the recv() polling for the next message,
  // which on_recv fills directly while the inbox is empty (no inbox pass).
  Message* waiting_ = nullptr;

  std::unique_ptr<QueuePair> qp_;
  std::unique_ptr<MemoryRegion> recv_mr_;
  std::unique_ptr<MemoryRegion> send_mr_;
  uint32_t slot_size_ = 0;  // header + max_message, ours
  uint32_t depth_ = 0;      // our RECVs
  uint32_t peer_depth_ = 0;
  uint32_t peer_max_message_ = 0;

  mutable detail::DatapathMutex mu_;  // everything below, and posting
  bool closed_ = false;
  uint64_t sent_ = 0;       // SENDs + WRITE_WITH_IMMs posted (credits used)
  uint32_t next_slot_ = 0;  // sent_ % peer_depth_, kept without a division
  uint64_t reposted_ = 0;   // our RECVs re-posted after delivery
  uint64_t reported_ = 0;   // re-posts the peer has been told about
  const uint64_t* peer_reposted_ = nullptr;  // in our control block, written by the peer
  std::vector<Pending> pending_;
  uint32_t next_pending_ = 0;
  uint32_t send_slot_ = 0;
  uint32_t unsignaled_ = 0;  // WRs posted unsignaled since the last signaled one

  // Taken only where library threads share the channel (mu_.shared()); the
  // condition variable serves pull receivers on other threads than progress.
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Message> inbox_;  // ring of depth_
  size_t inbox_head_ = 0;
  size_t inbox_count_ = 0;
  bool inbox_closed_ = false;

  // *_sync() without library threads: each waiting call (nested ones too,
  // from handlers) is a frame on its caller's stack, linked here; a
  // completion finds its frame by number. No allocation per call.
  struct SyncFrame;
  SyncFrame* sync_top_ = nullptr;
  uint64_t sync_issued_ = 0;
};

}  // namespace rdmakit::session
