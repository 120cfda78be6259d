#pragma once
// The relay protocol between a process that carries a connection and one
// that holds a copy of it (relay.hpp): one fixed-size message each way on an
// abstract unix socket per owner, descriptors passed with SCM_RIGHTS; a
// request names the connection by the descriptor itself. After a grant the
// request's socket stays open as the relay's wake and give-back channel:
// 'w' (first use), 'S' (stop sending; answered 'A'), 'G' + the 8-byte count
// of bytes received and never read (the owner re-reads them from what it
// sent: an asker cannot make it read bytes it did not send).
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>

namespace rdmakit::preload::relay_wire {

constexpr uint32_t kMagic = 0x31524b52;  // "RKR1"
constexpr size_t kBuf = size_t{64} * 1024;
// How long a request may take to arrive once its asker connected (it
// waits in the server's poll set, so a slow asker holds nothing up).
constexpr int kRequestWaitMs = 5000;
constexpr int kReplyWaitMs = 2000;
constexpr size_t kMaxRelays = 1024;
// What an owner keeps of the bytes it last sent to each awake relay: more
// than its relay socket can hold unread (kRelaySocketBuffer).
constexpr size_t kHistory = size_t{1024} * 1024;
constexpr int kRelaySocketBuffer = 256 * 1024;
// How long a relayed process that lets go waits for its owner to stop.
constexpr int kStopWaitMs = 500;
// How often parked connections are checked for remaining holders.
constexpr int kReviewMs = 200;

enum Status : uint32_t { kNotMine = 0, kNewRelay = 1, kAlreadyRelayed = 2, kFull = 3 };
constexpr uint32_t kDormant = 1;  // a request's status field: a dormant relay

struct Message {
  uint32_t magic = kMagic;
  uint32_t status = 0;
};

// The owner's relay socket (abstract).
sockaddr_un relay_address(pid_t pid, socklen_t* len);
// One datagram-like write of `len` bytes with up to two descriptors, and
// its reading within wait_ms: every descriptor that came with it is placed
// high (close-on-exec) and returned in fds (the rest closed), -1 where none
// came. False unless exactly `len` bytes came, all descriptors included.
bool send_with_fds(int s, const void* buf, size_t len, const int* fds, int nfds);
bool recv_with_fds(int s, void* buf, size_t len, int* fds, int max_fds, int wait_ms);
// One relay message with up to two descriptors.
bool send_message(int s, const Message& m, const int* fds, int nfds);
// Receives one message within wait_ms; every descriptor that came with it
// is placed high (close-on-exec) and returned in fds (the rest closed), -1
// where none came.
bool recv_message(int s, Message* m, int* fds, int max_fds, int wait_ms);

}  // namespace rdmakit::preload::relay_wire
