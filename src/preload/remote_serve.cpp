// The server side of the cross-host rendezvous (docs/preload.md, "Between
// hosts", "Bounds"): one thread per preloaded listener serves its
// rendezvous port. It multiplexes every rendezvous connection (non-blocking,
// each step bounded in time), so a peer that connects and stays silent
// delays no one; every connection it holds, in its handshake or with a
// stored offer, is an entry of the bounded OfferTable.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fd_place.hpp"
#include "libc.hpp"
#include "offer_table.hpp"
#include "process.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "remote.hpp"
#include "rules.hpp"
#include "state.hpp"

namespace rdmakit::preload {

using namespace wire;  // NOLINT(google-build-using-namespace)

namespace {

using std::chrono::milliseconds;

struct RemoteListener {
  int fd = -1;
  uint64_t id = 0;
  uint16_t app_port = 0;
  uint16_t port = 0;
  pid_t owner = 0;
  std::atomic<bool> stop{false};
};

std::mutex g_mu;
std::vector<std::shared_ptr<RemoteListener>>* g_listeners = nullptr;  // under g_mu
OfferTable* g_table = nullptr;                                        // under g_mu
uint64_t g_next_listener = 1;                                         // under g_mu

// Lines a peer can cause at will are rate-limited (under g_mu).
RateLimitedLog g_refusals("refused rendezvous");

// A fork while the rendezvous thread holds g_mu must not leave the child's
// copy locked (a child that closes its copy of a listener takes it).
void lock_for_fork() { g_mu.lock(); }
void unlock_after_fork() { g_mu.unlock(); }

// Writes a whole small message on a fresh, non-blocking rendezvous
// connection (it always fits in the socket buffer); false when it did not.
bool send_now(int fd, const void* msg, size_t len) {
  return real().send(fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(len);
}

size_t need_of(const OfferEntry& e) {
  if (e.step == OfferEntry::kAuthNonce) return sizeof(AuthNonce);
  return (remote_config().secret ? sizeof(AuthClient) : 0) + sizeof(Offer);
}

// Refuses (status to the client, a rate-limited line) and drops the entry.
void refuse_entry(OfferEntry& e, uint32_t status, const std::string& why) {
  Hello no;
  no.status = status;
  (void)send_now(e.fd, &no, sizeof no);
  g_refusals.note("rendezvous " + e.where + ": " + why);
  g_table->drop(e.id);
}

// The whole offer (and the client's proof) has arrived: check it, store it.
void offer_complete(OfferEntry& e, uint16_t app_port) {
  const uint64_t id = e.id;
  size_t at = 0;
  if (const auto& secret = remote_config().secret) {
    AuthClient proof;
    std::memcpy(&proof, e.buf.data(), sizeof proof);
    at = sizeof proof;
    // Nothing of the offer is looked at before the proof is checked.
    if (!secret->verify(auth::Role::kClient, kAuthLabel, e.client_nonce.client_nonce,
                        e.server_nonce, proof.proof)) {
      return refuse_entry(e, kAuthRefused,
                          "the peer did not prove the shared secret: refused (stays on "
                          "kernel TCP)");
    }
  }
  Offer offer;
  std::memcpy(&offer, e.buf.data() + at, sizeof offer);
  if (std::string bad = offer_problem(offer); !bad.empty()) {
    return refuse_entry(e, kRefused, bad + ": refused");
  }
  Tuple rdv;
  std::string where;
  sockaddr_storage peer{};
  if (!socket_tuple(e.fd, false, &rdv, &where, &peer).empty()) {
    return g_table->drop(e.id);
  }
  // The offer must come from the host and address it names, to the address
  // it names: an off-path host cannot leave an offer for someone else's
  // connection (it would have to complete a TCP handshake from that address).
  const Tuple& t = offer.tuple;
  if (t.family != rdv.family ||
      std::memcmp(t.client_addr, rdv.client_addr, addr_len(t.family)) != 0 ||
      std::memcmp(t.server_addr, rdv.server_addr, addr_len(t.family)) != 0 ||
      ntohs(t.server_port) != app_port) {
    return refuse_entry(e, kRefused, "offer names another host or port: refused");
  }
  const std::string deny =
      connection_denied(app_port, reinterpret_cast<sockaddr*>(&peer));  // NOLINT
  if (!deny.empty()) return refuse_entry(e, kDeniedByRules, deny + " (offer refused)");
  // A tuple is one connection at a time: a newer offer replaces a stale one.
  for (const auto& other : g_table->entries()) {
    if (other.id != id && other.step == OfferEntry::kStored &&
        std::memcmp(&other.tuple, &t, sizeof t) == 0) {
      g_table->drop(other.id);  // invalidates e; find it again
      break;
    }
  }
  OfferEntry* me = g_table->find(id);
  if (me == nullptr) return;
  me->tuple = t;
  me->offer = offer;
  me->step = OfferEntry::kStored;
  me->expires = Clock::now() + config().timeout + std::chrono::seconds(1);
  // Sent once the offer is in the table: the client connects in the kernel
  // only after this, so accept() always finds it.
  Hello stored;
  if (!send_now(me->fd, &stored, sizeof stored)) g_table->drop(me->id);
}

// The entry's socket is readable: the next bytes of its step. Under g_mu.
void advance(OfferEntry& e, uint16_t app_port) {
  if (e.step == OfferEntry::kStored) {
    // Its client says nothing until the answer: bytes or EOF now mean it
    // went away (or does not follow the protocol). Reclaimed at once.
    return g_table->drop(e.id);
  }
  const size_t need = need_of(e);
  const ssize_t n = real().recv(e.fd, e.buf.data() + e.have, need - e.have, MSG_DONTWAIT);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    return g_table->drop(e.id);  // the peer went away in its handshake
  }
  e.have += static_cast<size_t>(n);
  if (e.have < need) return;
  e.have = 0;
  if (e.step == OfferEntry::kAuthNonce) {
    std::memcpy(&e.client_nonce, e.buf.data(), sizeof e.client_nonce);
    AuthServer mine;
    mine.server_nonce = auth::fresh_nonce();
    e.server_nonce = mine.server_nonce;
    mine.proof = remote_config().secret->prove(
        auth::Role::kServer, kAuthLabel, e.client_nonce.client_nonce, e.server_nonce);
    e.step = OfferEntry::kOffer;
    if (!send_now(e.fd, &mine, sizeof mine)) g_table->drop(e.id);
    return;
  }
  offer_complete(e, app_port);
}

SourceKey source_of(const sockaddr_storage& ss) {
  SourceKey k{};
  uint16_t port = 0;
  k[0] = static_cast<uint8_t>(put(ss, &k[1], &port));
  return k;
}

// A new rendezvous connection: bounded entry, hello.
void begin(const RemoteListener& l, int c) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t ll = sizeof local;
  socklen_t pl = sizeof peer;
  if (real().getsockname(c, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||  // NOLINT
      real().getpeername(c, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||   // NOLINT
      loopback(peer)) {
    // A loopback client is upgraded by the same-host rendezvous; an offer
    // from there could never be taken up.
    real().close(c);
    return;
  }
  const std::string where =
      "local=" + endpoint(reinterpret_cast<sockaddr*>(&local)) +  // NOLINT
      " peer=" + endpoint(reinterpret_cast<sockaddr*>(&peer));    // NOLINT
  const bool auth = remote_config().secret.has_value();
  std::lock_guard lock(g_mu);
  OfferEntry& e =
      g_table->add(c, source_of(peer), l.id, where, Clock::now() + probe_budget());
  e.step = auth ? OfferEntry::kAuthNonce : OfferEntry::kOffer;
  Hello hello;
  hello.flags = auth ? kHelloAuth : 0;
  if (!send_now(c, &hello, sizeof hello)) g_table->drop(e.id);
}

void serve(const std::shared_ptr<RemoteListener>& l) {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  while (!l->stop.load()) {
    pfds.assign(1, pollfd{l->fd, POLLIN, 0});
    ids.assign(1, 0);
    auto next = Clock::now() + milliseconds(200);  // also notices stop
    {
      std::lock_guard lock(g_mu);
      (void)g_table->purge_expired(Clock::now());
      g_refusals.flush();
      for (const auto& e : g_table->entries()) {
        if (e.owner != l->id) continue;
        pfds.push_back(pollfd{e.fd, POLLIN, 0});
        ids.push_back(e.id);
        next = std::min(next, e.expires);
      }
    }
    const int r = poll(pfds.data(), pfds.size(), std::max(remaining_ms(next), 1));
    if (r <= 0) continue;
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      std::lock_guard lock(g_mu);
      // Gone meanwhile (taken up, evicted, expired): its fd number is not ours.
      if (OfferEntry* e = g_table->find(ids[i]); e != nullptr) advance(*e, l->app_port);
    }
    if (pfds[0].revents == 0) continue;
    // A bounded batch per round, so the entries above keep their turn.
    for (int k = 0; k < 16 && !l->stop.load(); ++k) {
      const int c = place_high(
          real().accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (c < 0) {
        if (errno == EINVAL || errno == EBADF) l->stop = true;
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(milliseconds(10));
        }
        break;
      }
      begin(*l, place_high(c));
    }
  }
  {
    std::lock_guard lock(g_mu);
    g_table->drop_handshakes_of(l->id);
  }
  real().close(l->fd);
}

}  // namespace

bool take_stored_offer(const Tuple& tuple, Offer* offer, int* fd) {
  std::lock_guard lock(g_mu);
  if (g_table == nullptr) return false;
  (void)g_table->purge_expired(Clock::now());
  OfferEntry e;
  if (!g_table->take(tuple, &e)) return false;
  *offer = e.offer;
  *fd = e.fd;
  // Blocking again: the rest of the rendezvous (answer, commit) is bounded
  // by io_all's deadline.
  (void)fcntl(e.fd, F_SETFL, fcntl(e.fd, F_GETFL) & ~O_NONBLOCK);
  return true;
}

void open_remote_listener(int app_fd, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (real().getsockname(app_fd, reinterpret_cast<sockaddr*>(&ss), &len) !=
      0) {  // NOLINT
    return;
  }
  if (loopback(ss)) return;  // no other host can connect
  if (!remote_config().problem.empty()) return;
  const uint16_t rport = rendezvous_port(port);
  if (ss.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(rport);  // NOLINT
  } else {
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(rport);  // NOLINT
  }
  const int fd = place_high(
      real().socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd < 0) return;
  const int one = 1;
  (void)real().setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||  // NOLINT
      real().listen(fd, 128) != 0) {
    log_line(
        "listen port=%u: no cross-host rendezvous on port %u: %s (clients on other "
        "hosts stay on kernel TCP)",
        port, rport, std::strerror(errno));
    real().close(fd);
    return;
  }
  auto l = std::make_shared<RemoteListener>();
  l->fd = fd;
  l->app_port = port;
  l->port = rport;
  l->owner = process_id();
  {
    std::lock_guard lock(g_mu);
    if (g_listeners == nullptr) {
      (void)pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
      g_listeners =
          new std::vector<std::shared_ptr<RemoteListener>>();  // NOLINT: lives to exit
      g_table = new OfferTable(offer_limits());                // NOLINT
    }
    l->id = g_next_listener++;
    g_listeners->push_back(l);
  }
  try {
    rdmakit::detail::start_library_thread([l] { serve(l); }).detach();
  } catch (const std::exception& e) {
    log_line("listen port=%u: no cross-host rendezvous thread: %s", port, e.what());
    close_remote_listener(port);
  }
}

void close_remote_listener(uint16_t port) {
  std::shared_ptr<RemoteListener> l;
  {
    std::lock_guard lock(g_mu);
    if (g_listeners == nullptr) return;
    auto& v = *g_listeners;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if ((*it)->app_port == port && (*it)->owner == process_id()) {
        l = *it;
        v.erase(it);
        break;
      }
    }
  }
  if (!l) return;
  l->stop = true;
  // Wakes the thread's poll and frees the port at once, so the program can
  // listen on it again; the thread closes the descriptor.
  (void)shutdown(l->fd, SHUT_RDWR);
}

}  // namespace rdmakit::preload
