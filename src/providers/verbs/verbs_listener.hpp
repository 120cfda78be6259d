#pragma once
// The verbs listener: connection requests and their handshakes, kept pending
// across accept() calls so that a client that never finishes its handshake
// costs a slot, not the time of the clients behind it.
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/deadline.hpp"
#include "core/handshake_backlog.hpp"
#include "providers/verbs/verbs_cm.hpp"
#include "providers/verbs/verbs_cq.hpp"
#include "providers/verbs/verbs_handshake.hpp"
#include "providers/verbs/verbs_qp.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

// How long a request waits, unanswered, while an earlier handshake answered
// with the same reply and QP options is still in flight. A reply may name a
// resource of one connection (a stream's ring): answering two requests with
// it and returning one leaves the other a reply meant for somebody else. A
// handshake still open after this long is taken for a stalled peer, and the
// request is answered anyway.
inline constexpr std::chrono::milliseconds kAnswerHold{1000};

// One connection request and its handshake, from CONNECT_REQUEST to the
// accept() that returns it.
struct PendingHandshake {
  enum class Stage : uint8_t {
    kRequested,  // not answered yet (held while an earlier one holds its reply)
    kAnswered,   // REP sent, waiting for the peer's RTU (ESTABLISHED)
    kReading,    // established, READing the rest of the connect private data
    kDone,       // complete: the next accept() with the same reply returns it
  };
  // Destroyed after parts (members are destroyed in reverse): the QP before
  // its id, as a failed accept() always did.
  CmIdHandle id;
  std::string peer;
  Stage stage = Stage::kRequested;
  core::Clock::time_point arrived;   // of the CONNECT_REQUEST
  core::Clock::time_point answered;  // of our REP
  uint64_t done_order = 0;           // completions are returned in this order
  uint8_t initiator_depth = 0;       // of the request
  uint8_t responder_resources = 0;
  Handshake hello;
  bool overflow = false;
  uint64_t overflow_addr = 0;
  uint32_t overflow_rkey = 0;
  // What the answering accept() passed: only an accept() that passes the
  // same returns this connection.
  QpOptions options;
  std::vector<std::byte> reply;
  VerbsQp::Parts parts;
  Negotiated negotiated{};
};

class VerbsListener final : public Listener {
 public:
  VerbsListener(std::shared_ptr<Device> device, EventChannelHandle channel, CmIdHandle id,
                std::string host, uint16_t port)
      : device_(std::move(device)),
        channel_(std::move(channel)),
        id_(std::move(id)),
        host_(std::move(host)),
        port_(port) {}

  // Returns the first connection whose handshake completed within `timeout`
  // (ETIMEDOUT when none has). Handshakes run across calls; one that fails
  // or exceeds kHandshakeTimeout is dropped, logged, and reported by the
  // call that sees it (ECONNABORTED, or EPROTO/ENODEV for a bad request)
  // unless that call has a connection to return.
  std::unique_ptr<QueuePair> accept(const QpOptions& options,
                                    std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override;
  std::string address() const override {
    return core::HostPort{host_, port_}.to_string();
  }
  uint16_t port() const override { return port_; }

 private:
  using Pending = std::unique_ptr<PendingHandshake>;

  // Reads the queued rdma_cm events and moves the handshakes they concern;
  // stops at the first that completes one, so that it is returned first.
  void take_events();
  void on_request(CmEvent& event);
  void on_established(PendingHandshake& p);
  // Answers requests whose reply no other handshake in flight holds (or only
  // a stalled one); failures are recorded.
  void answer_requests(const QpOptions& options, std::span<const std::byte> reply);
  void answer(PendingHandshake& p, const QpOptions& options,
              std::span<const std::byte> reply);
  void poll_reads();
  void expire();
  // The completed handshake returned next, or null.
  std::unique_ptr<QueuePair> take_done(const QpOptions& options,
                                       std::span<const std::byte> reply);
  // Drops pending_[i] (its id's destruction rejects or disconnects the peer),
  // logging why; the first failure of a call is what it reports.
  void fail(size_t i, int err, const std::string& why);
  size_t find(const rdma_cm_id* id) const;
  // Milliseconds until the next handshake deadline or answer-hold end.
  int next_timer_ms() const;

  std::shared_ptr<Device> device_;
  EventChannelHandle channel_;  // the listener's and every pending id's
  CmIdHandle id_;
  std::string host_;
  uint16_t port_;
  std::mutex mu_;  // accept() may run in several threads
  // Destroyed before channel_ and id_: rdma_destroy_id writes to the channel.
  // Answered or not; a new request beyond its bound drops the oldest.
  core::HandshakeBacklog<Pending> pending_;
  uint64_t next_done_order_ = 0;
  // The first failure not reported yet (dropped when a connection is returned:
  // it was logged).
  std::optional<Error> failure_;
};

}  // namespace rdmakit::verbs
