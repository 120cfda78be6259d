// A process of the client's host that is not the client: it leaves a
// cross-host offer (src/preload/remote.cpp) for the connection a plain client
// (made here too, not preloaded) is about to open to a preloaded server,
// and plays the rest of the rendezvous honestly: stream, both nonces,
// commit. What it cannot do is write the client's in-band proof on that
// connection, so the server must refuse the stream and serve the plain
// client over kernel TCP.
//   rendezvous_forger SERVER_IP PORT CLIENT_IP PORT_OFFSET late|early
// late: the plain client speaks only after the acceptor's 40-byte token
// (written before the server can know the client is plain; docs/preload.md,
// "Trust model"): the server must refuse at the client's proof. early: the
// plain client speaks at once and the server accepts late, so its bytes are
// there before the proof: the server must refuse without writing a token.
// Exit 0 when the stream gave the forger no byte and the plain client got
// exactly its echo (after the token in the late case).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/stream/stream.hpp>
#include <string>

#include "rendezvous_records.hpp"

namespace {

using namespace std::chrono_literals;

using rdmakit::preload::test::Hello;
using rdmakit::preload::test::kMagic;
using rdmakit::preload::test::kVersion;
using rdmakit::preload::test::Offer;
using rdmakit::preload::test::Tuple;
struct Answer {
  uint32_t magic, status;
  std::array<uint8_t, 16> nonce;
};
struct Final {
  uint32_t magic = kMagic;
  uint32_t status = 0;
  uint32_t early_bytes = 0;
  uint32_t pad = 0;
};
static_assert(sizeof(Offer) == 72 && sizeof(Answer) == 24 && sizeof(Final) == 16);

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rendezvous_forger: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

void read_all(int fd, void* buf, size_t len, const char* what) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < len) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1) die(std::string("timed out reading ") + what);
    const ssize_t n = recv(fd, p + got, len - got, 0);
    if (n <= 0) die(std::string("reading ") + what);
    got += static_cast<size_t>(n);
  }
}

void write_all(int fd, const void* buf, size_t len, const char* what) {
  if (send(fd, buf, len, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) die(what);
}

sockaddr_in address(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) die(std::string("address ") + ip);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(
        stderr,
        "usage: rendezvous_forger SERVER_IP PORT CLIENT_IP PORT_OFFSET late|early\n");
    return 2;
  }
  const bool early = std::strcmp(argv[5], "early") == 0;
  const int port = std::atoi(argv[2]);
  sockaddr_in server = address(argv[1], port);
  sockaddr_in rdv_addr = address(argv[1], port + std::atoi(argv[4]));
  sockaddr_in here = address(argv[3], 0);

  // The plain client's socket: its port is known before it connects.
  const int victim = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t hl = sizeof here;
  if (victim < 0 || bind(victim, reinterpret_cast<sockaddr*>(&here), sizeof here) != 0 ||
      getsockname(victim, reinterpret_cast<sockaddr*>(&here), &hl) != 0) {
    die("plain client socket");
  }

  const int rdv = socket(AF_INET, SOCK_STREAM, 0);
  if (rdv < 0 ||
      connect(rdv, reinterpret_cast<sockaddr*>(&rdv_addr), sizeof rdv_addr) != 0) {
    die("connect to the rendezvous");
  }
  Hello hello{};
  read_all(rdv, &hello, sizeof hello, "the hello");
  if (hello.magic != kMagic || hello.version != kVersion)
    die("not an rdmakit rendezvous");

  rdmakit::stream::EngineOptions options;
  options.provider = rdmakit::ProviderKind::kTcp;
  auto engine = rdmakit::stream::Engine::create(options);
  auto listener = engine->listen(std::string(argv[3]) + ":0");
  Offer offer;
  std::memcpy(offer.tuple.client_addr, &here.sin_addr, 4);
  std::memcpy(offer.tuple.server_addr, &server.sin_addr, 4);
  offer.tuple.client_port = here.sin_port;
  offer.tuple.server_port = server.sin_port;
  if (getrandom(offer.nonce.data(), offer.nonce.size(), 0) != 16) die("getrandom");
  offer.stream_port = listener->port();
  write_all(rdv, &offer, sizeof offer, "the offer");
  Hello stored{};
  read_all(rdv, &stored, sizeof stored, "stored");
  if (stored.status != 0) die("the offer was not stored");

  const std::string request = "bytes of a plain client\n";
  if (connect(victim, reinterpret_cast<sockaddr*>(&server), sizeof server) != 0) {
    die("plain client connect");
  }
  if (early) write_all(victim, request.data(), request.size(), "plain client request");

  Answer answer{};
  read_all(rdv, &answer, sizeof answer, "the answer");
  if (answer.status != 0) die("the server did not answer the offer");
  Final please;
  please.status = 3;  // kProofPlease
  write_all(rdv, &please, sizeof please, "the proof request");
  std::string got;
  if (early) {
    // Refused: the server hangs up on the rendezvous and writes no token.
    char b = 0;
    pollfd pfd{rdv, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1 || recv(rdv, &b, 1, 0) != 0) {
      die("the server did not hang up on the forged rendezvous");
    }
    std::printf("forger: refused before the proof\n");
  } else {
    // The plain client gets the acceptor's token first, then speaks.
    got.resize(40);
    read_all(victim, got.data(), got.size(), "the acceptor's token");
    write_all(victim, request.data(), request.size(), "plain client request");
    auto s = listener->accept(10s);
    if (s->write(answer.nonce.data(), answer.nonce.size()) != 16)
      die("stream nonce write");
    std::array<uint8_t, 16> nc{};
    if (s->read(nc.data(), nc.size(), rdmakit::stream::Stream::kWaitAll) != 16 ||
        nc != offer.nonce) {
      die("stream nonce read");
    }
    Final fin;
    write_all(rdv, &fin, sizeof fin, "the commit");
    std::printf("forger: offer stored, answered, stream nonces exchanged, committed\n");
    // The server must not use the stream: no byte ever arrives on it.
    s->set_timeouts(10s, 10s);
    char b[64];
    const ssize_t r = s->read(b, sizeof b);
    if (r > 0) {
      std::fprintf(stderr,
                   "rendezvous_forger: the server sent %zd bytes on the forged stream\n",
                   r);
      return 1;
    }
    std::printf("forger: the stream closed without a byte (%s)\n",
                r == 0 ? "end of stream" : std::strerror(static_cast<int>(-r)));
  }

  // The plain client: the acceptor's token (late), then exactly its echo.
  const size_t token = got.size();
  const size_t want = token + request.size();
  char buf[256];
  while (got.size() < want) {
    pollfd pfd{victim, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1) break;
    const ssize_t n = recv(victim, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  // Anything more within a moment would be bytes that do not belong.
  pollfd more{victim, POLLIN, 0};
  if (poll(&more, 1, 200) == 1 && recv(victim, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    got.push_back('+');
  }
  if (got.size() != want || (!early && got.compare(0, 4, "RXKT") != 0) ||
      got.substr(token) != request) {
    std::fprintf(stderr, "rendezvous_forger: the plain client got %zu bytes, not %s\n",
                 got.size(), early ? "exactly its echo" : "token + echo");
    return 1;
  }
  std::printf("forger: the plain client got %s over TCP\n",
              early ? "exactly its echo" : "the acceptor's token, then its echo");
  close(victim);
  close(rdv);
  return 0;
}
