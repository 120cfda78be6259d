#pragma once
// The object behind every Channel: its queue pair, registered memory, credit
// counters, pending operations and pull inbox. The public Channel holds no
// state; each one is a ChannelCore (one object per channel, made with the
// endpoint, so an operation costs no allocation and no indirection beyond the
// Channel itself). Channel's member functions, in channel*.cpp, reach the
// state through core(); the Worker, the Engine and the Client use the public
// members below.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <rdmakit/detail/conditional_lock.hpp>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <span>
#include <string>
#include <vector>

#include "engine.hpp"
#include "wire.hpp"

namespace rdmakit::session::detail {

// A channel's lock. Where library threads share the channel (poller and
// worker thread modes) it is a mutex; in ThreadMode::kApplication the channel
// has one owner at a time (the thread that drives progress(), as the core's
// QPs there are single-owner), so locking is a predictable branch and no
// atomic instruction on the data path.
using DatapathMutex = rdmakit::detail::ConditionalMutex;

// What a channel lends a Message: a receive slot and what arrived in it.
struct Delivery {
  Channel* channel = nullptr;
  const std::byte* data = nullptr;
  size_t size = 0;
  uint32_t slot = 0;
  uint32_t imm = 0;
  uint32_t written = 0;
  bool notification = false;
};

}  // namespace rdmakit::session::detail

namespace rdmakit::session {
// Inline: on_recv builds one Message per delivery.
inline Message::Message(const detail::Delivery& lent) noexcept
    : channel_(lent.channel),
      data_(lent.data),
      size_(lent.size),
      slot_(lent.slot),
      imm_(lent.imm),
      written_(lent.written),
      notification_(lent.notification) {}
}  // namespace rdmakit::session

namespace rdmakit::session::detail {

class ChannelCore final : public Channel {
 public:
  // A pending operation: one slot of the table indexed by its wr_id.
  struct Pending {
    uint8_t kind = 0;  // WrKind
    bool busy = false;
    Opcode opcode = Opcode::kSend;
    OpCallback done;
    Buffer buffer;  // zero-copy SEND: returned on completion
  };

  // Lays out the receive ring (recv_depth slots of max_message, from the
  // endpoint's session options) and points the credit counter into the
  // endpoint's control block. Nothing is posted yet.
  ChannelCore(Endpoint* endpoint, uint32_t index, std::string name);
  ~ChannelCore();
  ChannelCore(const ChannelCore&) = delete;
  ChannelCore& operator=(const ChannelCore&) = delete;

  // Connection setup (channel.cpp): the connected QP and the peer's depth
  // and message size, which size the send ring and the pending table; then
  // the first RECVs, before the peer may send.
  void attach(std::unique_ptr<QueuePair> qp, uint32_t peer_depth,
              uint32_t peer_max_message);
  bool post_initial_recvs(std::string* why);
  // The server learns the channel names from the client's buffer table.
  void rename(std::string name) { name_ = std::move(name); }

  // Control messages (buffer table, goodbye; channel_messages.cpp): a credit
  // if one is free, never waiting. wr_id (if given) receives the id of the
  // posted SEND.
  bool send_control(MsgKind kind, std::span<const std::byte> payload,
                    uint64_t* wr_id = nullptr);
  // The endpoint's heartbeat counter, written into the peer's control block
  // (the worker's tick, on channel 0; channel.cpp).
  void post_heartbeat();

  // The completion side (worker thread): a RECV delivered to the handler or
  // the inbox (channel_messages.cpp), a pending operation taken by its index
  // (channel.cpp).
  void on_recv(const Completion& c);
  bool take_pending(uint32_t index, Pending* out);
  // Returns a Message's receive slot (Message::release).
  void repost(uint32_t slot) noexcept;

  // Teardown (channel.cpp).
  void fail_all_pending(const DisconnectInfo& info);
  void mark_closed();
  void release_memory();

 private:
  // Channel's member functions (channel*.cpp) are the post paths over this
  // state.
  friend class rdmakit::session::Channel;

  // Shared by every post path (channel.cpp).
  uint64_t wr_id_for(WrKind kind, uint32_t index) const noexcept {
    return make_wr_id(endpoint_->slot_, endpoint_->generation_, index_, kind, index);
  }
  std::chrono::milliseconds op_timeout() const noexcept {
    return endpoint_->engine_->options().op_timeout;
  }
  OpResult fail(Errc code, const char* what, const std::string& why) const;
  OpResult closed_result(const char* what) const;
  // Selective signaling: true if this WR must be signaled (every
  // kSignalEvery-th of a run of unsignaled ones). Under mu_.
  bool signal_due() const noexcept { return unsignaled_ + 1 >= kSignalEvery; }
  OpResult post_locked(SendWr& wr, uint8_t kind, OpCallback& done, Buffer* buffer);
  OpResult post_retrying(std::unique_lock<DatapathMutex>& lock, SendWr& wr, uint8_t kind,
                         OpCallback& done, Buffer* buffer);
  void progress_or_pause(uint32_t spins);

  // Messages (channel_messages.cpp).
  OpResult wait_credit(std::unique_lock<DatapathMutex>& lock);
  // Both sends start here: a message the peer can take, on an open channel,
  // with a credit for it. Takes lock (deferred by the caller); on success it
  // stays held for the post.
  OpResult begin_send(size_t size, std::unique_lock<DatapathMutex>& lock);
  void count_sent() noexcept {
    ++sent_;
    if (++next_slot_ == peer_depth_) next_slot_ = 0;
  }
  OpResult recv_progressing(Message* out, std::chrono::milliseconds timeout);
  Message pop_inbox() noexcept;
  void report_credits_locked() noexcept;

  // One-sided operations (channel_onesided.cpp).
  OpResult one_sided(Opcode opcode, std::string_view remote, uint64_t offset, Local local,
                     size_t length, uint32_t imm, OpCallback done);
  OpResult one_sided(Opcode opcode, const RemoteBuffer& remote, uint64_t offset,
                     Local local, size_t length, uint32_t imm, OpCallback done);

  // The *_sync() wrappers (channel_sync.cpp).
  OpResult sync(const std::function<OpResult(OpCallback)>& start);
  OpResult sync_progressing(const std::function<OpResult(OpCallback)>& start);

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

  mutable DatapathMutex mu_;  // everything below, and posting
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

// The state of a Channel (every Channel is a ChannelCore).
inline ChannelCore& core(Channel& ch) noexcept { return static_cast<ChannelCore&>(ch); }
inline const ChannelCore& core(const Channel& ch) noexcept {
  return static_cast<const ChannelCore&>(ch);
}

}  // namespace rdmakit::session::detail
