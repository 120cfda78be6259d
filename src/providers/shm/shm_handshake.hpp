#pragma once
// Connection setup of the shm provider: what each side prepares before the
// handshake, what the handshake delivers from the peer, and the calls that
// exchange them (shm_handshake.cpp).
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_link.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/queue_pair.hpp"

namespace rdmakit::shm {

class ShmCq;
class ShmContext;
class ShmSrq;

// The send buffer asked for a payload socket: the largest SEND that takes
// that path (the kernel caps it at net.core.wmem_max).
inline constexpr int kPayloadSocketBytes = 4 << 20;

// What one side prepares before the handshake.
// Owns the mapping of its block: a connect or accept that fails after
// preparing it leaves nothing mapped.
struct LocalEnd {
  LocalEnd() = default;
  LocalEnd(LocalEnd&& other) noexcept { *this = std::move(other); }
  LocalEnd& operator=(LocalEnd&& other) noexcept;
  LocalEnd(const LocalEnd&) = delete;
  LocalEnd& operator=(const LocalEnd&) = delete;
  ~LocalEnd();

  Fd block_fd;
  InboundBlock* block = nullptr;
  size_t block_bytes = 0;
  // Our own copy: the block is writable by the peer, so sizes are never read
  // back from it.
  uint32_t ring_size = 0;
  Fd peer_request_end;  // handed to the peer
  std::shared_ptr<Link> link;
  uint32_t qp_num = 0;
  ShmSrq* srq = nullptr;  // our receives come from this SRQ
  // With a payload socket: we read SEND payloads from payload_rx; the peer
  // gets peer_payload_end.
  Fd payload_rx;
  Fd peer_payload_end;
};

// What the handshake delivered from the peer.
struct PeerEnd {
  Fd table_fd;
  Fd block_fd;
  Fd cq_event;
  Fd request_socket;  // our requests -> the peer's progress thread
  Fd payload_socket;  // our SEND payloads -> the peer (when it offered one)
  // From SO_PEERCRED: the process that connected (or listened).
  PeerCred cred;
  bool other_user = false;  // cred.uid is not ours
  uint32_t ring_size = 0;
  Fd srq_fd;  // the peer receives through this SRQ (else empty)
  uint32_t srq_ring_size = 0;
  bool fence_on_arm = false;  // the peer's CQs run heavy_fence() when arming
  std::string address;
  std::vector<std::byte> private_data;
};

// other_user: the peer runs as another uid; it gets a payload socket and
// may not use a shared receive queue of ours.
LocalEnd prepare_local_end(ShmContext& context, const QpOptions& options,
                           bool other_user);
// Builds the Hello and the four descriptors that go with it.
int send_handshake(int sock, ShmContext& context, const LocalEnd& local,
                   const QpOptions& options, std::span<const std::byte> private_data,
                   bool accepted);
// Refuses a peer before any descriptor is exchanged (best effort, never
// blocks).
void send_refusal(int sock, RejectReason reason);
// Receives and validates a Hello from the peer whose credentials are cred;
// throws Error naming operation and peer.
PeerEnd receive_handshake(int sock, const char* operation, const std::string& peer,
                          const PeerCred& cred, const ShmContext& context,
                          std::chrono::milliseconds timeout);

std::unique_ptr<QueuePair> connect_queue_pair(ShmContext& context,
                                              const std::string& address,
                                              const QpOptions& options,
                                              std::span<const std::byte> private_data,
                                              std::chrono::milliseconds timeout);
}  // namespace rdmakit::shm
