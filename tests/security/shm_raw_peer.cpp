#include "shm_raw_peer.hpp"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace rdmakit::shm::attack {

bool RawPeer::connect(uint16_t port, bool offer_payload_socket) {
  sock.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa),
                static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) !=
      0) {
    error = std::string("connect: ") + std::strerror(errno);
    return false;
  }
  own_table_fd = create_sealed_memfd("attacker-table", sizeof(RegionTable));
  own_table = new (::mmap(nullptr, sizeof(RegionTable), PROT_READ | PROT_WRITE,
                          MAP_SHARED, own_table_fd.get(), 0)) RegionTable();
  const size_t own_bytes = InboundBlock::bytes_for(own_ring);
  own_block_fd = create_sealed_memfd("attacker-block", own_bytes);
  own_block = new (::mmap(nullptr, own_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                          own_block_fd.get(), 0)) InboundBlock();
  own_block->ring_size = own_ring;
  for (uint32_t i = 0; i < own_ring; ++i) new (&own_block->slots()[i]) RecvSlot();
  int wake[2];
  ::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, wake);
  own_event.reset(wake[0]);
  own_event_send.reset(wake[1]);
  int pair[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair);
  own_request_end.reset(pair[0]);
  Fd handed(pair[1]);
  int payload_pair[2] = {-1, -1};
  if (offer_payload_socket)
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, payload_pair);
  own_payload_rx.reset(payload_pair[0]);
  Fd payload_tx(payload_pair[1]);

  Hello mine;
  mine.ring_size = own_ring;
  mine.qp_num = 1;
  mine.payload_socket = offer_payload_socket ? 1 : 0;
  const int fds[5] = {own_table_fd.get(), own_block_fd.get(), own_event.get(),
                      handed.get(), payload_tx.get()};
  if (send_with_fds(sock.get(), &mine, sizeof mine,
                    {fds, offer_payload_socket ? 5u : 4u}) != 0) {
    error = "sending Hello failed";
    return false;
  }
  Fd got[kHelloMaxFds];
  size_t nfds = 0;
  const ssize_t n = recv_with_fds(sock.get(), &hello, sizeof hello, got, &nfds,
                                  std::chrono::milliseconds(5000));
  if (n != static_cast<ssize_t>(sizeof hello) || hello.accepted == 0 || nfds < 4) {
    error = "refused (accepted=" + std::to_string(hello.accepted) +
            ", reason=" + std::to_string(hello.reject_reason) +
            ", descriptors=" + std::to_string(nfds) + ")";
    return false;
  }
  table_fd = std::move(got[0]);
  block_fd = std::move(got[1]);
  cq_event = std::move(got[2]);
  request_socket = std::move(got[3]);
  if (hello.payload_socket != 0) payload_socket = std::move(got[nfds - 1]);
  table = static_cast<const RegionTable*>(
      ::mmap(nullptr, sizeof(RegionTable), PROT_READ, MAP_SHARED, table_fd.get(), 0));
  block_bytes = InboundBlock::bytes_for(hello.ring_size);
  block = static_cast<InboundBlock*>(::mmap(nullptr, block_bytes, PROT_READ | PROT_WRITE,
                                            MAP_SHARED, block_fd.get(), 0));
  if (table == MAP_FAILED || block == MAP_FAILED) {
    error = "mapping the target's table or ring failed";
    return false;
  }
  return true;
}

Fd RawPeer::get_region(uint32_t rkey, bool* writable) {
  Request request{RequestOp::kGetRegion, rkey, 0, 0, 0};
  Reply reply{};
  Fd fd[1];
  size_t nfds = 0;
  *writable = false;
  if (send_with_fds(request_socket.get(), &request, sizeof request, {}) != 0 ||
      recv_with_fds(request_socket.get(), &reply, sizeof reply, fd, &nfds,
                    std::chrono::milliseconds(2000)) !=
          static_cast<ssize_t>(sizeof reply)) {
    return Fd();
  }
  *writable = reply.writable != 0;
  return nfds == 1 ? std::move(fd[0]) : Fd();
}

uint32_t RawPeer::atomic(RequestOp op, uint32_t rkey, uint64_t addr, uint64_t add) {
  Request request{op, rkey, addr, add, 0};
  Reply reply{};
  size_t nfds = 0;
  if (send_with_fds(request_socket.get(), &request, sizeof request, {}) != 0 ||
      recv_with_fds(request_socket.get(), &reply, sizeof reply, {}, &nfds,
                    std::chrono::milliseconds(2000)) !=
          static_cast<ssize_t>(sizeof reply)) {
    return ~0u;
  }
  return reply.status;
}

void RawPeer::publish(uint64_t n, uint32_t byte_len, uint8_t where, uint8_t opcode,
                      uint8_t status) {
  RecvSlot& slot = block->slots()[n & (hello.ring_size - 1)];
  slot.byte_len = byte_len;
  slot.data_inline = where;
  slot.opcode = opcode;
  slot.status = status;
  slot.flags = 0;
  slot.done_seq.store(n + 1, std::memory_order_seq_cst);
  wake_target();
}

void RawPeer::wake_target() {
  const char one = 1;
  [[maybe_unused]] ssize_t w =
      ::send(cq_event.get(), &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace rdmakit::shm::attack
