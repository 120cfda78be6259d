#pragma once
// Options, modes and results shared by the session layer's classes.
#include <chrono>
#include <cstdint>
#include <rdmakit/export.hpp>
#include <rdmakit/rdmakit.hpp>
#include <string>
#include <vector>

namespace rdmakit::session {

// Who runs the progress loop (polls completions, runs handlers).
enum class ThreadMode : uint8_t {
  kPollerPerEndpoint,  // one library thread per endpoint, with its own CQ
  kSharedWorkers,      // a pool of ThreadOptions::workers threads; endpoints
                       // are spread over them, each worker's CQ shared by its
                       // endpoints
  kApplication,        // no library threads on the data path: the application
                       // calls progress() (or waits on fd())
};

// How the progress loop waits when there is nothing to do.
enum class EventMode : uint8_t {
  kBusyPoll,  // spin on poll(): lowest latency, burns a core
  kBlocking,  // CompletionQueue::wait(): spin briefly, then sleep in the kernel
  kEpollFd,   // an fd for epoll with the arm rule (library threads use it too)
};

RDMAKIT_API const char* thread_mode_name(ThreadMode mode) noexcept;
RDMAKIT_API const char* event_mode_name(EventMode mode) noexcept;
// "poller" / "workers" / "app" and "busy" / "blocking" / "epoll"; throw Error
// on anything else.
RDMAKIT_API ThreadMode parse_thread_mode(const std::string& name);
RDMAKIT_API EventMode parse_event_mode(const std::string& name);

struct SessionOptions {
  ProviderKind provider = ProviderKind::kAuto;
  ThreadMode thread_mode = ThreadMode::kPollerPerEndpoint;
  EventMode event_mode = EventMode::kBlocking;
  uint32_t workers = 2;  // kSharedWorkers only
  // Channels of every endpoint, one QP each, created at connect time. The
  // client's list is used; the server accepts what the client asks for.
  std::vector<std::string> channels = {"default"};
  // Largest message payload this side receives (at least 2048: the table of
  // exposed buffers travels as a message).
  uint32_t max_message = 4096;
  uint32_t recv_depth = 64;     // RECVs per channel = credits the peer gets
  uint32_t max_endpoints = 64;  // per worker CQ (shared modes)
  // Liveness: each side WRITEs a heartbeat into the peer every `heartbeat`;
  // a peer whose heartbeat stopped for `liveness` is disconnected (kPeerSilent).
  std::chrono::milliseconds heartbeat{100};
  std::chrono::milliseconds liveness{2000};
  // The transport's own bound for a dead peer (QpOptions::peer_timeout).
  std::chrono::milliseconds peer_timeout{2000};
  // How long send() waits for a credit, and *_sync() for a completion.
  std::chrono::milliseconds op_timeout{5000};
  // Client: total time connect() keeps retrying a refused connection or a
  // handshake cut short (reset, aborted).
  std::chrono::milliseconds connect_timeout{5000};
};

// Why an endpoint went away.
enum class DisconnectReason : uint8_t {
  kLocalClose,      // this side called close() or destroyed the session
  kPeerClosed,      // the peer closed cleanly (goodbye message)
  kTransportError,  // a work request failed (peer killed, link cut, ...)
  kPeerSilent,      // no heartbeat within SessionOptions::liveness
};
RDMAKIT_API const char* disconnect_reason_name(DisconnectReason reason) noexcept;

struct DisconnectInfo {
  DisconnectReason reason = DisconnectReason::kLocalClose;
  std::string detail;  // what failed, status name, provider and peer
};

// Outcome of a data-path operation. detail is only filled on failure.
enum class Errc : uint8_t {
  kOk = 0,
  kTransport,     // the work request completed with an error (status)
  kNoSuchBuffer,  // the peer exposes no buffer of that name
  kOutOfRange,    // offset + length outside the remote or local buffer
  kTooLarge,      // message larger than the peer's max_message
  kNoCredit,      // the peer did not return a credit within op_timeout
  kClosed,        // the endpoint is disconnected
  kQueueFull,     // too many outstanding requests on the channel
  kTimeout,       // *_sync(): no completion within op_timeout
  kInvalid,       // bad argument (empty buffer, local memory not registered)
};
RDMAKIT_API const char* errc_name(Errc code) noexcept;

struct OpResult {
  Errc code = Errc::kOk;
  Status status = Status::kSuccess;
  std::string detail;
  [[nodiscard]] bool ok() const noexcept { return code == Errc::kOk; }
};

}  // namespace rdmakit::session
