// Connection setup of the shm provider: each side prepares its end (its
// inbound block, request socket, link), the handshake exchanges one message
// each way (Hello, private data and descriptors), and the queue pair's
// constructor maps what the peer sent. The data path is in shm_qp*.cpp.
#include "providers/shm/shm_handshake.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>

#include "core/address.hpp"
#include "core/log.hpp"
#include "providers/shm/shm_asymmetric_fence.hpp"
#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_cq.hpp"
#include "providers/shm/shm_qp.hpp"
#include "providers/shm/shm_small_copy.hpp"
#include "providers/shm/shm_srq.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

Error setup_error(const char* what, const std::string& peer, int err,
                  const std::string& detail = {}) {
  return Error(what, "shm", peer, err, detail);
}

}  // namespace

LocalEnd& LocalEnd::operator=(LocalEnd&& other) noexcept {
  if (this != &other) {
    if (block != nullptr) ::munmap(block, block_bytes);
    block_fd = std::move(other.block_fd);
    block = std::exchange(other.block, nullptr);
    block_bytes = other.block_bytes;
    ring_size = other.ring_size;
    peer_request_end = std::move(other.peer_request_end);
    link = std::move(other.link);
    qp_num = other.qp_num;
    srq = other.srq;
    payload_rx = std::move(other.payload_rx);
    peer_payload_end = std::move(other.peer_payload_end);
  }
  return *this;
}

LocalEnd::~LocalEnd() {
  if (block != nullptr) ::munmap(block, block_bytes);
}

LocalEnd prepare_local_end(ShmContext& context, const QpOptions& options,
                           bool other_user) {
  if (options.send_cq == nullptr || options.recv_cq == nullptr) {
    throw setup_error("create_qp", "", EINVAL, "send_cq and recv_cq are required");
  }
  if (options.max_send_wr == 0 || options.max_recv_wr == 0) {
    throw setup_error("create_qp", "", EINVAL, "max_send_wr and max_recv_wr must be > 0");
  }
  LocalEnd local;
  if (options.srq != nullptr) {
    local.srq = dynamic_cast<ShmSrq*>(options.srq);
    if (local.srq == nullptr || &local.srq->context() != &context) {
      throw setup_error(
          "create_qp", "", EINVAL,
          "the shared receive queue belongs to another context or provider");
    }
    // Every sender of an SRQ writes its shared block: one of another user
    // could redirect the others' payloads.
    if (other_user) {
      throw setup_error("create_qp", "", EPERM,
                        "a peer of another user cannot use a shared receive queue");
    }
  }
  local.qp_num = context.next_qp_num();
  const uint32_t ring = std::bit_ceil(options.max_recv_wr);
  local.block_bytes = InboundBlock::bytes_for(ring);
  local.block_fd = create_sealed_memfd("rdmakit-shm-qp", local.block_bytes);
  if (!local.block_fd) throw setup_error("memfd_create(qp)", "", errno);
  void* mem = map_fd(local.block_fd.get(), local.block_bytes, true);
  if (mem == nullptr) throw setup_error("mmap(qp)", "", errno);
  local.block = new (mem) InboundBlock();
  local.block->ring_size = ring;
  local.ring_size = ring;
  for (uint32_t i = 0; i < ring; ++i) {
    RecvSlot* slot = new (&local.block->slots()[i]) RecvSlot();
    // With an SRQ the ring only carries completions: every slot starts as a
    // credit, renewed as the completion in it is polled.
    if (local.srq != nullptr) slot->post_seq.store(i + 1, std::memory_order_relaxed);
  }

  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    throw setup_error("socketpair", "", errno);
  }
  local.link = std::make_shared<Link>();
  local.link->serve_socket.reset(pair[0]);
  local.peer_request_end.reset(pair[1]);
  if (other_user || context.peer_policy().ptrace_restricted()) {
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
      throw setup_error("socketpair(payload)", "", errno);
    }
    local.payload_rx.reset(pair[0]);
    local.peer_payload_end.reset(pair[1]);
    // The largest SEND that fits is what the kernel lets one message be
    // (net.core.wmem_max caps this).
    const int bytes = kPayloadSocketBytes;
    (void)::setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  }
  return local;
}

int send_handshake(int sock, ShmContext& context, const LocalEnd& local,
                   const QpOptions& options, std::span<const std::byte> private_data,
                   bool accepted) {
  Hello hello;
  hello.ring_size = local.ring_size;
  hello.qp_num = local.qp_num;
  hello.accepted = accepted ? 1 : 0;
  hello.private_len = static_cast<uint16_t>(private_data.size());
  hello.srq_ring_size = local.srq != nullptr ? local.srq->ring_size() : 0;
  hello.fence_on_arm = asymmetric_fence_available() ? 1 : 0;
  hello.payload_socket = local.payload_rx ? 1 : 0;
  if (!private_data.empty()) {
    std::memcpy(hello.private_data, private_data.data(), private_data.size());
  }
  auto* recv_cq = static_cast<ShmCq*>(options.recv_cq);
  // A payload socket is offered exactly to peers that may not hold our
  // eventfd: another user (or Yama, where it does no harm).
  const int wake = local.payload_rx ? recv_cq->peer_wake_socket() : recv_cq->wake_fd();
  int fds[kHelloMaxFds] = {context.table_fd(), local.block_fd.get(), wake,
                           local.peer_request_end.get()};
  size_t nfds = kHelloFds;
  if (local.srq != nullptr) fds[nfds++] = local.srq->block_fd();
  if (local.payload_rx) fds[nfds++] = local.peer_payload_end.get();
  return send_with_fds(sock, &hello, sizeof hello, {fds, nfds});
}

void send_refusal(int sock, RejectReason reason) {
  Hello hello;
  hello.accepted = 0;
  hello.reject_reason = static_cast<uint32_t>(reason);
  (void)send_with_fds(sock, &hello, sizeof hello, {}, true);
}

PeerEnd receive_handshake(int sock, const char* operation, const std::string& peer,
                          const PeerCred& cred, const ShmContext& context,
                          std::chrono::milliseconds timeout) {
  Hello hello;
  Fd fds[kHelloMaxFds];
  size_t nfds = 0;
  ssize_t got = recv_with_fds(sock, &hello, sizeof hello, fds, &nfds, timeout);
  // A peer that closed with our Hello unread resets us, but what it sent
  // before (a refusal) is still queued: the reset is reported once.
  if (got == -ECONNRESET) {
    got = recv_with_fds(sock, &hello, sizeof hello, fds, &nfds,
                        std::chrono::milliseconds(0));
    if (got == 0 || got == -ETIMEDOUT) got = -ECONNRESET;
  }
  if (got < 0) throw setup_error(operation, peer, static_cast<int>(-got), "handshake");
  if (got == 0)
    throw setup_error(operation, peer, ECONNRESET, "peer closed during handshake");
  if (const auto check = kHelloFrame.check(
          {reinterpret_cast<const std::byte*>(&hello), static_cast<size_t>(got)});
      !check) {
    throw setup_error(operation, peer, EPROTO,
                      std::string("malformed handshake (") + check.why() + ")");
  }
  const PeerPolicy& policy = context.peer_policy();
  if (hello.accepted == 0) {
    if (hello.reject_reason == static_cast<uint32_t>(RejectReason::kUserNotAdmitted)) {
      throw setup_error(
          operation, peer, EACCES,
          fmt::format("the listener (pid {}, uid {}) does not admit processes of our uid "
                      "{}; it must allow them (ContextOptions::shm.allowed_uids or "
                      "RDMAKIT_SHM_ALLOW_UIDS={} on the listener's side)",
                      cred.pid, cred.uid, policy.self(), policy.self()));
    }
    throw setup_error(operation, peer, ECONNREFUSED, "rejected");
  }
  const size_t want = kHelloFds + (hello.srq_ring_size != 0 ? 1 : 0) +
                      (hello.payload_socket != 0 ? 1 : 0);
  if (nfds != want ||
      (hello.srq_ring_size != 0 && !std::has_single_bit(hello.srq_ring_size)) ||
      hello.private_len > Context::kMaxPrivateData || hello.ring_size == 0 ||
      !std::has_single_bit(hello.ring_size)) {
    throw setup_error(operation, peer, EPROTO, "malformed handshake");
  }
  PeerEnd end;
  end.table_fd = std::move(fds[0]);
  end.block_fd = std::move(fds[1]);
  end.cq_event = std::move(fds[2]);
  end.request_socket = std::move(fds[3]);
  size_t next = kHelloFds;
  end.cred = cred;
  end.other_user = cred.uid != policy.self();
  end.ring_size = hello.ring_size;
  end.fence_on_arm = hello.fence_on_arm != 0;
  if (hello.srq_ring_size != 0) {
    end.srq_fd = std::move(fds[next++]);
    end.srq_ring_size = hello.srq_ring_size;
  }
  if (hello.payload_socket != 0) end.payload_socket = std::move(fds[next++]);
  // From another user, every descriptor we write to or read from must be a
  // socket, used with MSG_DONTWAIT: an eventfd or a pipe it also holds could
  // be made to block us.
  if (end.other_user &&
      (hello.payload_socket == 0 || !is_socket(end.cq_event.get()) ||
       !is_socket(end.request_socket.get()) || !is_socket(end.payload_socket.get()))) {
    throw setup_error(operation, peer, EPROTO,
                      "a peer of another user must hand over sockets only");
  }
  end.address = peer;
  end.private_data.assign(
      reinterpret_cast<const std::byte*>(hello.private_data),
      reinterpret_cast<const std::byte*>(hello.private_data) + hello.private_len);
  return end;
}

std::unique_ptr<QueuePair> connect_queue_pair(ShmContext& context,
                                              const std::string& address,
                                              const QpOptions& options,
                                              std::span<const std::byte> private_data,
                                              std::chrono::milliseconds timeout) {
  const auto target = core::parse_host_port(address, "connect", "shm");
  if (private_data.size() > Context::kMaxPrivateData) {
    throw setup_error("connect", address, EINVAL, "private data larger than 192 bytes");
  }
  Fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) throw setup_error("connect", address, errno, "socket");
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(target.port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    const int err = errno;
    throw setup_error("connect", address, err,
                      err == ECONNREFUSED
                          ? "no shm listener on that port (same host only)"
                          : "connect");
  }
  // The listener's identity, from the kernel: an abstract name can be taken
  // by anyone first, so a listener of another user gets nothing from us.
  PeerCred cred;
  if (!peer_cred(sock.get(), &cred))
    throw setup_error("connect", address, errno, "SO_PEERCRED");
  const PeerPolicy& policy = context.peer_policy();
  if (!policy.admits(cred.uid)) {
    throw setup_error("connect", address, EACCES,
                      policy.refusal(cred.uid, cred.pid, "shm listener on this port") +
                          "; another user may have taken the port's name");
  }
  LocalEnd local = prepare_local_end(context, options, cred.uid != policy.self());
  if (int rc = send_handshake(sock.get(), context, local, options, private_data, true);
      rc != 0) {
    // A listener that refused us sent why before it hung up: say that.
    try {
      (void)receive_handshake(sock.get(), "connect", address, cred, context,
                              std::chrono::milliseconds(0));
    } catch (const Error& refusal) {
      if (refusal.sys_errno() == EACCES || refusal.sys_errno() == ECONNREFUSED) throw;
    }
    throw setup_error("connect", address, -rc, "sending handshake");
  }
  PeerEnd peer =
      receive_handshake(sock.get(), "connect", address, cred, context, timeout);
  return std::make_unique<ShmQp>(context, options, std::move(local), std::move(peer));
}

// ------------------------------------------------------------- construction

ShmQp::ShmQp(ShmContext& context, const QpOptions& options, LocalEnd local, PeerEnd peer)
    : QueuePair(local.qp_num, options, peer.address, peer.private_data),
      context_(context),
      local_(std::move(local)),
      peer_(std::move(peer)),
      send_cq_(static_cast<ShmCq*>(options.send_cq)),
      recv_cq_(static_cast<ShmCq*>(options.recv_cq)) {
  try {
    set_up();
  } catch (...) {
    unmap_peer();
    throw;
  }
}

void ShmQp::set_up() {
  srq_ = local_.srq;
  peer_gone_ = &local_.link->peer_gone;
  // Our process must be registered too: the peer's barrier reaches only
  // CPUs running registered processes.
  light_publish_ = peer_.fence_on_arm && asymmetric_fence_available();
  auto fail = [&](const char* what, int err) {
    return setup_error(what, peer_.address, err);
  };
  peer_block_bytes_ = InboundBlock::bytes_for(peer_.ring_size);
  if (peer_.srq_ring_size != 0)
    peer_srq_bytes_ = SrqBlock::bytes_for(peer_.srq_ring_size);
  // Memory the peer could shrink under our mappings would fault (SIGBUS).
  if (!sealed_and_sized(peer_.table_fd.get(), sizeof(RegionTable)) ||
      !sealed_and_sized(peer_.block_fd.get(), peer_block_bytes_) ||
      (peer_srq_bytes_ != 0 && !sealed_and_sized(peer_.srq_fd.get(), peer_srq_bytes_))) {
    throw setup_error("handshake", peer_.address, EPROTO,
                      "the peer's shared memory is not sealed against resizing or is "
                      "smaller than announced");
  }
  peer_wake_ = context_.share_peer_wake(std::move(peer_.cq_event));
  peer_table_ref_ = context_.map_peer_table(peer_.table_fd.get());
  if (!peer_table_ref_) throw fail("mmap(peer region table)", errno);
  peer_table_ = peer_table_ref_.get();
  void* block = map_fd(peer_.block_fd.get(), peer_block_bytes_, true);
  if (block == nullptr) throw fail("mmap(peer queue)", errno);
  peer_block_ = static_cast<InboundBlock*>(block);
  if (peer_table_->magic != kLayoutMagic || peer_block_->magic != kLayoutMagic ||
      peer_block_->ring_size != peer_.ring_size) {
    throw fail("handshake", EPROTO);
  }
  if (peer_.srq_ring_size != 0) {
    void* srq = map_fd(peer_.srq_fd.get(), peer_srq_bytes_, true);
    if (srq == nullptr) throw fail("mmap(peer shared receive queue)", errno);
    peer_srq_ = static_cast<SrqBlock*>(srq);
    if (peer_srq_->magic != kLayoutMagic || peer_srq_->ring_size != peer_.srq_ring_size) {
      throw fail("handshake", EPROTO);
    }
  }

  peer_ring_mask_ = peer_.ring_size - 1;
  small_send_allowed_ = peer_srq_ == nullptr;

  const uint64_t sq_size = std::bit_ceil(options_.max_send_wr);
  sq_storage_ = std::make_unique_for_overwrite<std::byte[]>(sq_size * sizeof(SqEntry));
  sq_ = reinterpret_cast<SqEntry*>(sq_storage_.get());
  sq_mask_ = sq_size - 1;
  if (options_.max_inline < 8) options_.max_inline = 8;
  // An inline SEND past max_inline is the general path's kInlineTooLarge.
  small_send_max_ = std::min<uint32_t>(kSlotInline, options_.max_inline);
  inline_data_ =
      std::make_unique_for_overwrite<std::byte[]>(sq_size * options_.max_inline);
  rq_.resize(local_.ring_size);
  rq_mask_ = local_.ring_size - 1;
  mappings_ = std::make_unique<Mapping[]>(kInitialMappings);
  mapping_mask_ = kInitialMappings - 1;

  local_.link->other_user = peer_.other_user;
  local_.link->send_cq_wake = send_cq_->shared_wake();
  local_.link->recv_cq_wake = recv_cq_->shared_wake();
  // The progress thread watches the link from here on; a failure below
  // removes it again, and no CQ keeps a pointer to a QP that never was.
  context_.progress().add_link(local_.link);
  try {
    send_cq_->attach_send(this, options_.max_send_wr);
    try {
      recv_cq_->attach_recv(this, options_.max_recv_wr);
    } catch (...) {
      send_cq_->detach(this);
      throw;
    }
  } catch (...) {
    context_.progress().remove_link(local_.link);
    throw;
  }
  // Our copy of the peer's request end must close, so the peer's death (or
  // ours) is seen as a hang-up by the other side's progress thread.
  local_.peer_request_end.reset();
  local_.peer_payload_end.reset();
  // Mapped, checked and (ours) handed over: the mappings stay, the
  // descriptors are not needed again and would count against the process's
  // open-file limit per connection.
  local_.block_fd.reset();
  peer_.table_fd.reset();
  peer_.block_fd.reset();
  peer_.srq_fd.reset();
}

void ShmQp::unmap_peer() noexcept {
  peer_table_ref_.reset();
  if (peer_block_ != nullptr) ::munmap(peer_block_, peer_block_bytes_);
  if (peer_srq_ != nullptr) ::munmap(peer_srq_, peer_srq_bytes_);
  peer_table_ = nullptr;
  peer_block_ = nullptr;
  peer_srq_ = nullptr;
}

ShmQp::~ShmQp() {
  local_.block->owner_state.store(kSideClosed, std::memory_order_seq_cst);
  peer_block_->sender_state.store(kSideClosed, std::memory_order_seq_cst);
  wake_peer();
  context_.progress().remove_link(local_.link);
  send_cq_->detach(this);
  recv_cq_->detach(this);
  if (srq_ != nullptr) {
    // SRQ entries senders claimed for completions nobody will poll now go
    // back to the SRQ: they held its capacity for good.
    for (uint64_t i = rq_polled_; i - rq_polled_ <= rq_mask_; ++i) {
      RecvSlot& slot = local_.block->slots()[i & rq_mask_];
      const uint64_t claimed =
          std::atomic_ref<uint64_t>(slot.srq_entry).load(std::memory_order_acquire);
      if (claimed == 0) break;
      const auto entry = static_cast<uint32_t>(claimed - 1);
      if (srq_->valid_claim(claimed) && srq_->claim_is_live(entry)) srq_->release(entry);
    }
  }
  for (uint32_t i = 0; i <= mapping_mask_; ++i) {
    if (mappings_[i].base != nullptr) ::munmap(mappings_[i].base, mappings_[i].bytes);
  }
  unmap_peer();
  // local_ unmaps our own block.
}

}  // namespace rdmakit::shm
