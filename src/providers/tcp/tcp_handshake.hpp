#pragma once
// Connection setup of the tcp provider: the handshake (one kHello frame each
// way, with the QP limits and the private data), blocking I/O with a
// deadline on a non-blocking socket, socket tuning, the options check done
// before connecting, and name resolution.
#include <netdb.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "core/address.hpp"
#include "core/deadline.hpp"
#include "providers/tcp/tcp_progress.hpp"
#include "providers/tcp/tcp_wire.hpp"
#include "rdmakit/queue_pair.hpp"

namespace rdmakit::tcp {

// Per accepted client: its handshake (sent right after its connect) and our
// answer must make it within this. Handshakes are served concurrently, at
// most core::kMaxPendingHandshakes at a time per listener (each holds one
// socket and a 268-byte buffer); a full backlog drops its oldest client.
inline constexpr std::chrono::milliseconds kHandshakeTimeout{1000};

int io_all(int fd, std::byte* buf, size_t len, bool write,
           core::Clock::time_point deadline);

void tune_socket(int fd, const QpOptions& o);

std::vector<std::byte> encode_handshake_frame(const QpOptions& o,
                                              std::span<const std::byte> private_data);

// Reads one hello frame; on failure returns errno-ish code and why.
int read_handshake(int fd, core::Clock::time_point deadline, Hello* out,
                   std::vector<std::byte>* private_data, const char** why);

// Checked before any connection is made, so a bad option costs no peer a
// half-open QP. TcpQp's constructor reserves the CQ depths for real.
void check_qp_options(const TcpProgress& progress, const QpOptions& requested,
                      const char* op, const std::string& peer);

addrinfo* resolve(const core::HostPort& hp, bool passive, const char* op,
                  const std::string& address);

}  // namespace rdmakit::tcp
