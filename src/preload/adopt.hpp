#pragma once
// Taking over an fd for an upgraded connection, and the log and statistics
// of each connection decision (docs/preload.md, "What happens to a
// connection").
#include <sys/socket.h>

#include <string>
#include <vector>

#include "rendezvous.hpp"

namespace rdmakit::preload {

struct Ends {
  std::string local;
  std::string peer;
};
Ends ends_of(int fd);
// "local=A peer=B" for the log.
std::string describe(int fd);

// A connection kept on kernel TCP: counted, logged by the caller, and
// listed by rdmakit-stat (no byte counts) until its fd is closed. peer:
// when the kernel has none yet (a connect in progress).
void publish_fallback(int fd, const char* side, const std::string& reason,
                      const sockaddr* peer = nullptr);

// The upgraded connection keeps the application's fd numbers (fd and its
// aliases): the kernel TCP socket moves to a high descriptor
// (close-on-exec), and the stream's readiness socket takes each number, so
// poll/select/epoll on them see the stream's state. marker: the adoption
// marker to remove with the connection ("" none). false: the stream is
// dropped before any byte and the connection stays on kernel TCP (logged).
bool adopt(int fd, const std::vector<int>& aliases, Upgrade& up, const char* side,
           const std::string& where, const std::string& marker = {});

}  // namespace rdmakit::preload
