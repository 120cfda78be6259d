// An offer flood against a preloaded server's cross-host rendezvous
// (src/preload/remote_serve.cpp): COUNT rendezvous connections, each from
// one of the SOURCE addresses in turn, each leaving a well-formed offer for
// a connection that never comes (distinct client ports), all held open for
// HOLD_MS. Against a rendezvous that requires the shared secret it plays the
// exchange with a proof it cannot know (random bytes). It needs nothing of
// rdmakit: any process (another Unix user) can do this.
//   rendezvous_flood SERVER_IP RDV_PORT APP_PORT COUNT HOLD_MS SOURCE[,SOURCE...]
// Prints "flooded: ..." once every offer is out (the test waits for it),
// then, after HOLD_MS, how many held connections the server closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous_records.hpp"

namespace {

using rdmakit::preload::test::Hello;
using rdmakit::preload::test::kMagic;
using rdmakit::preload::test::kVersion;
using rdmakit::preload::test::Offer;
using rdmakit::preload::test::Tuple;

sockaddr_in address(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    std::fprintf(stderr, "rendezvous_flood: bad address %s\n", ip.c_str());
    std::exit(2);
  }
  return a;
}

// Bounded: 2 s per message at most.
bool read_all(int fd, void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < len) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 2000) != 1) return false;
    const ssize_t n = recv(fd, p + got, len - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t len) {
  return send(fd, buf, len, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: rendezvous_flood SERVER_IP RDV_PORT APP_PORT COUNT HOLD_MS "
                 "SOURCE[,SOURCE...]\n");
    return 2;
  }
  const sockaddr_in server = address(argv[1], std::atoi(argv[3]));
  const sockaddr_in rdv = address(argv[1], std::atoi(argv[2]));
  const int count = std::atoi(argv[4]);
  const int hold_ms = std::atoi(argv[5]);
  std::vector<sockaddr_in> sources;
  std::stringstream list(argv[6]);
  for (std::string ip; std::getline(list, ip, ',');) sources.push_back(address(ip, 0));
  if (count <= 0 || count > 5000 || sources.empty()) return 2;

  std::vector<int> held;
  int stored = 0, refused = 0, closed = 0, auth = 0;
  for (int i = 0; i < count; ++i) {
    sockaddr_in here = sources[static_cast<size_t>(i) % sources.size()];
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      std::perror("rendezvous_flood: socket");
      return 1;
    }
    timeval tv{2, 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect
    Hello hello{};
    if (bind(fd, reinterpret_cast<sockaddr*>(&here), sizeof here) != 0 ||
        connect(fd, reinterpret_cast<const sockaddr*>(&rdv), sizeof rdv) != 0 ||
        !read_all(fd, &hello, sizeof hello) || hello.magic != kMagic) {
      ++closed;
      close(fd);
      continue;
    }
    if ((hello.flags & 1) != 0) {
      // The shared-secret exchange with a proof we cannot know.
      ++auth;
      std::array<uint8_t, 32> nonce{};
      std::array<uint8_t, 64> theirs{};
      std::array<uint8_t, 32> proof{};
      (void)getrandom(nonce.data(), nonce.size(), 0);
      (void)getrandom(proof.data(), proof.size(), 0);
      if (!write_all(fd, nonce.data(), nonce.size()) ||
          !read_all(fd, theirs.data(), theirs.size()) ||
          !write_all(fd, proof.data(), proof.size())) {
        ++closed;
        close(fd);
        continue;
      }
    }
    socklen_t hl = sizeof here;
    (void)getsockname(fd, reinterpret_cast<sockaddr*>(&here), &hl);
    Offer offer;
    std::memcpy(offer.tuple.client_addr, &here.sin_addr, 4);
    std::memcpy(offer.tuple.server_addr, &server.sin_addr, 4);
    offer.tuple.client_port = htons(static_cast<uint16_t>(20000 + i));
    offer.tuple.server_port = server.sin_port;
    (void)getrandom(offer.nonce.data(), offer.nonce.size(), 0);
    offer.stream_port = htons(static_cast<uint16_t>(40000 + i % 1000));
    Hello answer{};
    if (!write_all(fd, &offer, sizeof offer) || !read_all(fd, &answer, sizeof answer)) {
      ++closed;
      close(fd);
      continue;
    }
    if (answer.status == 0) {
      ++stored;
      held.push_back(fd);
    } else {
      ++refused;
      close(fd);
    }
  }
  std::printf(
      "flooded: %d offers, stored %d, refused %d, closed %d, secret exchanges %d\n",
      count, stored, refused, closed, auth);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  int gone = 0;
  for (const int fd : held) {
    char b = 0;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 0) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) <= 0) ++gone;
    close(fd);
  }
  std::printf("held %zu, closed by the server %d\n", held.size(), gone);
  return 0;
}
