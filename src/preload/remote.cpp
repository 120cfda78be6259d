#include "remote.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "fd_place.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "rules.hpp"
#include "state.hpp"

namespace rdmakit::preload {

using namespace wire;  // NOLINT(google-build-using-namespace)

// Read once. RDMAKIT_PRELOAD_REMOTE_PROVIDER=tcp carries the streams on the
// tcp provider without any RDMA device (tests of the rendezvous across
// network namespaces); =off disables cross-host upgrades.
const RemoteConfig& remote_config() {
  static const RemoteConfig cfg = [] {
    RemoteConfig c;
    const char* p = std::getenv("RDMAKIT_PRELOAD_REMOTE_PROVIDER");
    const std::string prov = p != nullptr ? p : "verbs";
    if (prov == "off" || prov == "0") {
      c.provider = ProviderKind::kAuto;
      c.problem = "cross-host upgrades are off (RDMAKIT_PRELOAD_REMOTE_PROVIDER=off)";
    } else if (prov == "tcp") {
      c.provider = ProviderKind::kTcp;
    } else if (prov != "verbs") {
      c.provider = ProviderKind::kAuto;
      c.problem =
          "RDMAKIT_PRELOAD_REMOTE_PROVIDER='" + prov + "' is not verbs, tcp or off";
    }
    if (const char* o = std::getenv("RDMAKIT_PRELOAD_REMOTE_PORT_OFFSET")) {
      const int v = std::atoi(o);
      if (v > 0 && v < 65536) c.port_offset = v;
    }
    // Fails closed: a secret that is configured but unusable turns
    // cross-host upgrades off rather than running them unauthenticated.
    try {
      c.secret = auth::Secret::resolve("");
    } catch (const std::exception& e) {
      c.problem = std::string("shared secret unusable (") + e.what() +
                  "): cross-host upgrades are off";
      return c;
    }
    if (c.provider == ProviderKind::kVerbs) {
      try {
        const RdmaDeviceList devs = list_devices();
        if (!devs.verbs_built) {
          c.problem = "this build has no verbs provider";
        } else if (devs.auto_choice != ProviderKind::kVerbs) {
          c.problem = "no usable RDMA device on this host (" + devs.auto_reason + ")";
        }
      } catch (const std::exception& e) {
        c.problem = std::string("RDMA devices: ") + e.what();
      }
    }
    return c;
  }();
  return cfg;
}

uint16_t rendezvous_port(uint16_t port) {
  int p = port + remote_config().port_offset;
  if (p > 65535) p = 1024 + (p - 65536) % (65536 - 1024);
  return static_cast<uint16_t>(p);
}

// Budget for learning whether the peer host is rdmakit-enabled: a plain
// host refuses the rendezvous port at once; a firewall that drops it must
// not cost every connection the whole upgrade budget (a quarter of it, at
// least a second).
std::chrono::milliseconds probe_budget() {
  const std::chrono::milliseconds t = config().timeout;
  return std::max(t / 4, std::min(t, std::chrono::milliseconds(1000)));
}

// An address of a tuple as the stream API takes it ("10.0.0.1", "[fd00::1]").
std::string ip_text(int family, const uint8_t* addr) {
  char buf[INET6_ADDRSTRLEN] = "?";
  (void)inet_ntop(family, addr, buf, sizeof buf);
  if (family != AF_INET6) return buf;
  std::string bracketed(1, '[');
  bracketed.append(buf);
  bracketed.push_back(']');
  return bracketed;
}

size_t addr_len(int family) { return family == AF_INET6 ? 16 : 4; }

namespace {

using std::chrono::milliseconds;

constexpr const char* kNotHere = "peer is not on this host; ";

// Peers found not rdmakit-enabled are not probed again for a while: a
// program that opens many connections to a plain server (or one behind a
// firewall that drops the rendezvous port) pays the probe once, not per
// connection. Bounded: the oldest entry makes room.
constexpr auto kRemember = std::chrono::seconds(10);
constexpr size_t kRememberMax = 64;
struct NotEnabled {
  std::array<uint8_t, 16> addr{};  // IPv4 in the first 4 bytes
  uint16_t port = 0;
  Clock::time_point until;
  std::string reason;
};
std::mutex g_cache_mu;
std::vector<NotEnabled>* g_not_enabled = nullptr;  // under g_cache_mu; lives to exit

using AddrKey = std::array<uint8_t, 16>;

bool remembered(const AddrKey& addr, uint16_t port, std::string* reason) {
  std::lock_guard lock(g_cache_mu);
  if (g_not_enabled == nullptr) return false;
  const auto now = Clock::now();
  for (const auto& e : *g_not_enabled) {
    if (e.addr == addr && e.port == port && e.until > now) {
      *reason = e.reason + " (remembered for up to 10 s)";
      return true;
    }
  }
  return false;
}

void remember(const AddrKey& addr, uint16_t port, const std::string& reason) {
  std::lock_guard lock(g_cache_mu);
  if (g_not_enabled == nullptr) g_not_enabled = new std::vector<NotEnabled>();  // NOLINT
  auto& v = *g_not_enabled;
  const auto now = Clock::now();
  std::erase_if(v, [&](const NotEnabled& e) {
    return e.until <= now || (e.addr == addr && e.port == port);
  });
  if (v.size() >= kRememberMax) v.erase(v.begin());
  v.push_back(NotEnabled{addr, port, now + kRemember, reason});
}

// Client side of the shared-secret exchange, right after the hello: ""
// when both sides agree (no secret on either, or both proved the same one;
// *proof is then the client's proof, sent before the offer), else why this
// connection stays on kernel TCP. Nothing the peer sent steers anything
// before its proof is checked.
std::string authenticate(int us, const Hello& hello, const std::string& at,
                         Clock::time_point end, AuthClient* proof) {
  const RemoteConfig& rc = remote_config();
  const bool peer_auth = (hello.flags & kHelloAuth) != 0;
  if (!rc.secret) {
    if (!peer_auth) return {};
    return "the rendezvous at " + at +
           " requires the shared secret and none is configured here (RDMAKIT_SECRET, "
           "RDMAKIT_SECRET_FILE)";
  }
  if (!peer_auth) {
    return "the rendezvous at " + at +
           " does not authenticate (no shared secret there) and one is configured "
           "here: refused";
  }
  AuthNonce mine;
  mine.client_nonce = auth::fresh_nonce();
  AuthServer theirs;
  if (!io_all(us, &mine, sizeof mine, true, end) ||
      !io_all(us, &theirs, sizeof theirs, false, end)) {
    return "the rendezvous at " + at + " went away during the shared-secret exchange";
  }
  if (!rc.secret->verify(auth::Role::kServer, kAuthLabel, mine.client_nonce,
                         theirs.server_nonce, theirs.proof)) {
    return "the rendezvous at " + at +
           " could not prove the shared secret (a different secret, or not the rdmakit "
           "peer): refused";
  }
  proof->proof = rc.secret->prove(auth::Role::kClient, kAuthLabel, mine.client_nonce,
                                  theirs.server_nonce);
  return {};
}

}  // namespace

PendingOfferPtr prepare_remote(int fd, const sockaddr_storage& peer,
                               std::string* reason) {
  const InternalScope internal;
  const RemoteConfig& rc = remote_config();
  if (!rc.problem.empty()) {
    *reason = kNotHere + rc.problem;
    return nullptr;
  }
  auto p = PendingOfferPtr(new PendingOffer());
  p->remote = true;
  Tuple& t = p->tuple;
  const int family = put(peer, t.server_addr, &t.server_port);
  if (family == AF_INET6) {
    const auto* p6 = reinterpret_cast<const sockaddr_in6*>(&peer);  // NOLINT
    if (IN6_IS_ADDR_LINKLOCAL(&p6->sin6_addr)) {
      // The stream address would need the interface (fe80::1%eth0).
      *reason = std::string(kNotHere) + "IPv6 link-local peers are not upgraded";
      return nullptr;
    }
  }
  const std::string server = ip_text(family, t.server_addr);
  const uint16_t rport = rendezvous_port(ntohs(t.server_port));
  sockaddr_storage rs{};
  socklen_t rs_len = 0;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&rs);  // NOLINT
    in->sin_family = AF_INET;
    in->sin_port = htons(rport);
    std::memcpy(&in->sin_addr, t.server_addr, 4);
    rs_len = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&rs);  // NOLINT
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(rport);
    std::memcpy(&in6->sin6_addr, t.server_addr, 16);
    rs_len = sizeof *in6;
  }
  AddrKey addr_key{};
  std::memcpy(addr_key.data(), t.server_addr, addr_len(family));
  if (remembered(addr_key, rport, reason)) return nullptr;
  const auto probe_end = Clock::now() + probe_budget();
  const int us =
      place_high(real().socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (us < 0) {
    *reason = std::string(kNotHere) + "rendezvous socket: " + std::strerror(errno);
    return nullptr;
  }
  p->usock = us;
  const std::string at = server + ":" + std::to_string(rport);
  if (real().connect(us, reinterpret_cast<sockaddr*>(&rs), rs_len) != 0) {  // NOLINT
    int err = errno;
    if (err == EINPROGRESS) {
      pollfd pfd{us, POLLOUT, 0};
      if (poll_through_signals(&pfd, 1, remaining_ms(probe_end)) <= 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t el = sizeof err;
        (void)real().getsockopt(us, SOL_SOCKET, SO_ERROR, &err, &el);
      }
    }
    if (err != 0) {
      *reason = std::string(kNotHere) + "no rdmakit rendezvous at " + at + " (" +
                std::strerror(err) + "; peer not rdmakit-enabled)";
      remember(addr_key, rport, *reason);
      return nullptr;
    }
  }
  // The server speaks first: nothing is sent to a port that is not an
  // rdmakit rendezvous.
  Hello hello;
  if (!io_all(us, &hello, sizeof hello, false, probe_end) || hello.magic != kMagic ||
      hello.version != kVersion || hello.status != 0 ||
      (hello.flags & ~kHelloAuth) != 0) {
    *reason = std::string(kNotHere) + "no rdmakit rendezvous answered at " + at +
              " (peer not rdmakit-enabled)";
    remember(addr_key, rport, *reason);
    return nullptr;
  }
  AuthClient proof;
  if (std::string why = authenticate(us, hello, at, probe_end, &proof); !why.empty()) {
    *reason = kNotHere + why;
    return nullptr;
  }
  // The kernel connection will leave from the address the rendezvous
  // connection left from (same destination, same route); bind it now so
  // the offer names its exact 4-tuple.
  sockaddr_storage here{};
  socklen_t hl = sizeof here;
  (void)real().getsockname(us, reinterpret_cast<sockaddr*>(&here), &hl);  // NOLINT
  uint8_t here_addr[16] = {};
  uint16_t unused_port = 0;
  (void)put(here, here_addr, &unused_port);
  in_addr v4{};
  in6_addr v6{};  // here's address as an AF_INET6 socket names it
  if (family == AF_INET) {
    std::memcpy(&v4, here_addr, 4);
    v6.s6_addr[10] = 0xff;  // v4-mapped
    v6.s6_addr[11] = 0xff;
    std::memcpy(&v6.s6_addr[12], here_addr, 4);
  } else {
    std::memcpy(&v6, here_addr, 16);
  }
  sockaddr_storage local{};
  if (std::string failed = bind_unbound(fd, v4, v6, &local); !failed.empty()) {
    *reason = kNotHere + failed;
    return nullptr;
  }
  uint8_t scratch[16];
  uint16_t client_port = 0;
  (void)put(local, scratch, &client_port);
  t.family = static_cast<uint8_t>(family);
  std::memcpy(t.client_addr, here_addr, addr_len(family));
  t.client_port = client_port;
  std::string why;
  stream::Engine* eng = engine(&why, rc.provider);
  if (eng == nullptr) {
    *reason = kNotHere + why;
    return nullptr;
  }
  try {
    p->listener = eng->listen(ip_text(t.family, t.client_addr) + ":0");
  } catch (const std::exception& e) {
    *reason = std::string(kNotHere) + "stream listener: " + e.what();
    return nullptr;
  }
  p->offer.tuple = t;
  p->offer.stream_port = p->listener->port();
  if (getrandom(p->offer.client_nonce.data(), kNonce, 0) !=
      static_cast<ssize_t>(kNonce)) {
    *reason = std::string(kNotHere) + "getrandom failed";
    return nullptr;
  }
  const auto deadline = Clock::now() + config().timeout;
  Hello stored;
  if ((rc.secret && !io_all(us, &proof, sizeof proof, true, deadline)) ||
      !io_all(us, &p->offer, sizeof p->offer, true, deadline) ||
      !io_all(us, &stored, sizeof stored, false, deadline) || stored.magic != kMagic) {
    *reason = std::string(kNotHere) + "rendezvous at " + at +
              " went away before storing the offer";
    return nullptr;
  }
  if (stored.status == kDeniedByRules) {
    *reason = std::string(kNotHere) +
              "the peer's allow/deny rules keep this connection on kernel TCP";
    return nullptr;
  }
  if (stored.status == kAuthRefused) {
    *reason = std::string(kNotHere) +
              "the peer's rendezvous refused our proof of the shared secret (a different "
              "secret there)";
    return nullptr;
  }
  if (stored.status != 0) {
    *reason = std::string(kNotHere) + "the peer refused the offer (status " +
              std::to_string(stored.status) + ")";
    return nullptr;
  }
  return p;
}

Upgrade finish_remote(PendingOffer& p, int tcp_fd) {
  const InternalScope internal;
  Upgrade up;
  up.path = provider_name(remote_config().provider);
  up.reason = check_offered(tcp_fd, p.tuple);
  if (!up.reason.empty()) return up;
  const auto deadline = Clock::now() + config().timeout;
  try {
    up.stream = client_commit(p.usock, *p.listener, p.offer.client_nonce, deadline,
                              &up.reason, tcp_fd, tcp_fd);
  } catch (const std::exception& e) {
    up.reason = std::string("upgrade failed: ") + e.what();
  }
  return up;
}

Upgrade accept_remote(int tcp_fd, const Tuple& t, const std::string& deny) {
  const InternalScope internal;
  Upgrade up;
  const RemoteConfig& rc = remote_config();
  up.path = provider_name(rc.provider);
  if (!rc.problem.empty()) {
    up.reason = deny.empty() ? kNotHere + rc.problem : deny;
    return up;
  }
  Offer offer;
  int fd = -1;
  if (!take_stored_offer(t, &offer, &fd)) {
    up.reason = deny.empty() ? std::string(kNotHere) +
                                   "no rendezvous offer from the peer (peer not "
                                   "rdmakit-enabled, or the listener has no rendezvous)"
                             : deny;
    return up;
  }
  Fd c(fd);
  const auto deadline = Clock::now() + config().timeout;
  if (!deny.empty()) {
    refuse(c.get(), kDeniedByRules, deadline);
    up.reason = deny + " (offer refused)";
    return up;
  }
  std::string why;
  stream::Engine* eng = engine(&why, rc.provider);
  if (eng == nullptr) {
    refuse(c.get(), 1, deadline);
    up.reason = why;
    return up;
  }
  try {
    // The stream goes to the address the kernel connection came from, not
    // to one the offer could choose.
    up.stream = server_commit(
        c.get(), *eng,
        ip_text(t.family, t.client_addr) + ":" + std::to_string(offer.stream_port),
        offer.client_nonce, deadline, &up.reason, tcp_fd);
  } catch (const std::exception& e) {
    up.reason = std::string("upgrade failed: ") + e.what();
  }
  return up;
}

}  // namespace rdmakit::preload
