#pragma once
// What both upgrade rendezvous (same host: unix sockets, rendezvous.cpp;
// other hosts: TCP, remote.cpp) exchange, and the helpers they share.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rdmakit/auth.hpp"
#include "rdmakit/stream/stream.hpp"

namespace rdmakit::preload::wire {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x31504b52;  // "RKP1"
// 2: in-band proof between hosts (Token); 3: early bytes (Final::early_bytes)
constexpr uint32_t kVersion = 3;
constexpr size_t kNonce = 16;
constexpr uint32_t kDeniedByRules = 2;  // Answer status: the server's rules say TCP
// Answer status: the server's process passes the connection to a program
// that will not carry it (an exec without this library).
constexpr uint32_t kNotCarried = 5;
// Answer status: the server's program reads the connection where the
// library does not see it (stdio, a raw system call).
constexpr uint32_t kUsedOutside = 6;
using Nonce = std::array<uint8_t, kNonce>;

// The TCP connection as both sides name it: client end, server end.
struct Tuple {
  uint8_t family = 0;
  uint8_t pad[3] = {};
  uint8_t client_addr[16] = {};
  uint8_t server_addr[16] = {};
  uint16_t client_port = 0;  // network order
  uint16_t server_port = 0;
};

// A stable name for the connection (FNV-1a over the tuple).
uint64_t tuple_hash(const Tuple& t);

// Same host, between users: the server's first message on a client's
// offer, sent with its own end of the kernel connection (SCM_RIGHTS) as the
// proof that it holds that end. The client checks that the descriptor's
// addresses mirror its own and closes it.
// status kDeniedByRules instead: the server's rules keep the connection on
// kernel TCP, and no descriptor comes.
struct OwnerProof {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t status = 0;
  uint32_t pad = 0;
  Tuple tuple;
};

struct Offer {  // client -> server, on the rendezvous socket
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  Tuple tuple;
  Nonce client_nonce{};
  uint16_t stream_port = 0;  // the client's stream listener
  uint8_t pad[6] = {};
};

struct Answer {  // server -> client: 0 = go ahead, else refused
  uint32_t magic = kMagic;
  uint32_t status = 0;
  Nonce server_nonce{};
};

struct Final {  // client -> server: both nonces checked, committed
  uint32_t magic = kMagic;
  uint32_t status = 0;
  // Same host: the client's first bytes that went to kernel TCP before the
  // server took the offer up (early bytes). The client writes them again
  // first on the stream; the server drops them from its kernel socket.
  uint32_t early_bytes = 0;
  uint32_t pad = 0;
};
// The most early bytes a client sends (and a server believes).
constexpr uint32_t kMaxEarlyBytes = 64 * 1024;
// Between hosts, server -> client on a rendezvous connection: first when it
// is accepted (before the client sends anything), then once the offer is
// stored (status 0) or refused (kRefused, kDeniedByRules, kAuthRefused).
struct Hello {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t status = 0;
  uint32_t flags = 0;  // the first hello: kHelloAuth or 0; no other bit
};
constexpr uint32_t kRefused = 1;
constexpr uint32_t kAuthRefused = 4;  // the client did not prove the shared secret
constexpr uint32_t kHelloAuth = 1;    // this rendezvous requires the shared secret

// With kHelloAuth, before the offer (rdmakit/auth.hpp's exchange):
//   client -> server  AuthNonce
//   server -> client  AuthServer              client verifies, else stays on TCP
//   client -> server  AuthClient, then Offer  server verifies before reading it
constexpr const char* kAuthLabel = "rdmakit-preload/1";
struct AuthNonce {
  auth::Nonce client_nonce{};
};
struct AuthServer {
  auth::Nonce server_nonce{};
  auth::Proof proof{};
};
struct AuthClient {
  auth::Proof proof{};
};

// Between hosts, client -> server after the answer: "write your proof now".
// The acceptor writes in-band only on this request, so a client that has
// given up (and closed the rendezvous) never finds a token in its stream.
constexpr uint32_t kProofPlease = 3;  // a Final with this status

// Between hosts, the proof that the rendezvous peer is the process that owns
// the kernel connection (docs/preload.md, "Trust model"): written IN-BAND on
// the application's TCP connection, first by the acceptor (after its answer),
// then by the client (with its commit). Only the owner of an end can write
// there, so a process that merely holds the rendezvous port cannot produce
// it. Each side peeks and consumes it only when every byte matches: anything
// else (a plain server's banner) stays in the socket for the application.
constexpr uint32_t kTokenMagic = 0x544b5852;  // "RXKT"
constexpr uint32_t kFromServer = 1;
constexpr uint32_t kFromClient = 2;
struct Token {
  uint32_t magic = kTokenMagic;
  uint32_t direction = 0;  // kFromServer or kFromClient
  Nonce client_nonce{};
  Nonce server_nonce{};
};
static_assert(sizeof(Token) == 40);

// Every field of an offer bounded before any is used (the wire is hostile):
// magic, version, family, zero padding and unused address bytes, non-zero
// ports. "" or what is wrong.
std::string offer_problem(const Offer& offer);

bool loopback(const sockaddr_storage& ss);
// v4-mapped IPv6 (a dual-stack listener's view) is named as IPv4, so both
// ends name the connection alike. Returns the family named.
int put(const sockaddr_storage& ss, uint8_t* addr, uint16_t* port);

// fd's local address. A socket with no port yet is first bound to `v4`
// (an AF_INET socket) or `v6` (AF_INET6), port 0, so that its port is known
// before connect() and an offer can name the connection's 4-tuple.
// "" or the call that failed, with its error.
std::string bind_unbound(int fd, const in_addr& v4, const in6_addr& v6,
                         sockaddr_storage* local);
// Fills the tuple from a connected socket (client or server end); "" or why
// it cannot. *where gets "local=... peer=..." for the log.
std::string socket_tuple(int fd, bool client, Tuple* t, std::string* where,
                         sockaddr_storage* peer_out = nullptr);
// fd is the very connection an offer named (its address can change in
// connect): "" or why not.
std::string check_offered(int fd, const Tuple& offered);
int remaining_ms(Clock::time_point deadline);
// Whole-message I/O on a rendezvous socket, bounded by deadline.
bool io_all(int fd, void* buf, size_t len, bool out, Clock::time_point deadline);
// Reads the peer's proof (our nonce) from the fresh stream and writes
// theirs. No application byte is sent before both are checked.
std::string exchange_nonces(stream::Stream& s, const Nonce& expect, const Nonce& send,
                            Clock::time_point deadline);
// Writes `token` on the kernel connection; "" or why not.
std::string send_token(int kernel_fd, const Token& token, Clock::time_point deadline);
// Waits (bounded) until the kernel connection's first bytes are `token` and
// consumes them; "" or why not. Nothing is consumed unless all of it matches.
std::string take_token(int kernel_fd, const Token& token, Clock::time_point deadline);

// The last steps, common to both rendezvous once the offer is out.
// Client: reads the answer, accepts the server's stream on `listener`,
// checks the nonces, commits. Null and *reason when it stays on TCP.
// kernel_fd >= 0 (between hosts): the acceptor's token must arrive on it
// before anything else, and the client's token follows the commit.
// early: the client's early bytes (same host), written first on the stream
// once committed. tcp_fd: the connection's kernel socket, whose byte counts
// must show nothing moved outside the library (moved_outside) before the
// commit.
std::unique_ptr<stream::Stream> client_commit(int rdv, stream::StreamListener& listener,
                                              const Nonce& client_nonce,
                                              Clock::time_point deadline,
                                              std::string* reason, int tcp_fd,
                                              int kernel_fd = -1,
                                              const std::string& early = {});
// The connect()ed end tcp_fd against the kernel's counts (TCP_INFO): the
// library wrote `sent` bytes on it and read `received`. More means bytes
// moved outside the library (stdio, whose calls inside libc no preload can
// see, or a raw system call): on a stream they would be lost, so the
// connection must stay on kernel TCP. "" when they match (or the kernel
// does not count), else why.
std::string moved_outside(int tcp_fd, uint64_t sent, uint64_t received);
// Server, for an offer it accepts: answers with a fresh nonce, connects a
// stream to `stream_address`, checks the nonces, waits for the commit.
// kernel_fd >= 0 (between hosts): writes the acceptor's token on it after
// the answer, and takes the client's token after the commit.
// early_fd >= 0 (same host): the kernel socket from which the client's early
// bytes, as many as its commit says, are dropped.
std::unique_ptr<stream::Stream> server_commit(int rdv, stream::Engine& engine,
                                              const std::string& stream_address,
                                              const Nonce& client_nonce,
                                              Clock::time_point deadline,
                                              std::string* reason, int kernel_fd = -1,
                                              int early_fd = -1);
// Server, same host: waits for the client's offer on rdv until deadline, or
// only kEarlyOfferWait once the kernel socket shows the client's early
// bytes (its library answers from a thread of its own, early_send.hpp; one
// that does not, stopped or out of threads, leaves the connection on kernel
// TCP rather than stall the server). withdrawn, asked every kWithdrawnTick
// while it waits: the offer will not come (the client's end was settled
// without it).
constexpr std::chrono::milliseconds kWithdrawnTick{20};
bool read_offer(int rdv, int tcp_fd, Offer* offer, Clock::time_point deadline,
                const std::function<bool()>& withdrawn = {});
constexpr auto kEarlyOfferWait = std::chrono::milliseconds(100);
// Why read_offer found no offer, for the log.
std::string no_offer_reason(int tcp_fd);
// Refuses an offer (status != 0), best effort.
void refuse(int rdv, uint32_t status, Clock::time_point deadline);

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

}  // namespace rdmakit::preload::wire

namespace rdmakit::preload {

// A client's offer between prepare_connect and finish_connect.
struct PendingOffer {
  wire::Tuple tuple;
  wire::Offer offer;
  std::unique_ptr<stream::StreamListener> listener;
  stream::Engine* reserved_on = nullptr;  // counted there until it ends
  pid_t made_by = 0;                      // the process whose engine the listener is on
  bool remote = false;         // rdv is a TCP connection to the peer host's rendezvous
  bool other_user = false;     // same host, a listener of another user: abstract offer
  bool listener_here = false;  // the listener is this process's (mirror.hpp)
  void mark_listener_here() noexcept;
  bool deferred = false;  // settled at the connection's first use (handoff.hpp)
  void mark_deferred() noexcept;
  std::string path;  // same host: the offer socket's path (removed with it)
  int usock = -1;    // same host: listening unix socket; remote: the connection
  // Same host, a listener of this user: the offer on the abstract name too,
  // for an acceptor of another uid (a server that dropped privileges after
  // listen(): nginx's workers, a daemon's service user).
  int other_usock = -1;
  // Same host: bytes the application sent on kernel TCP before the server
  // took the offer up (early_send.hpp), at most wire::kMaxEarlyBytes.
  std::string early;
  ~PendingOffer();
};

}  // namespace rdmakit::preload
