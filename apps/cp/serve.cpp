// rdmakit-cp serve: one session server; each client gets a "slots" buffer of
// its own (Server::expose_per_endpoint: only that peer sees it) and a thread
// running a Receiver (push) or a Sender (pull) confined to --root. At most
// --max-clients copy at once; one more is refused with the limit named.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <rdmakit/session/session.hpp>
#include <thread>
#include <vector>

#include "auth.hpp"
#include "confine.hpp"
#include "endpoints.hpp"
#include "protocol.hpp"
#include "receiver.hpp"
#include "records.hpp"
#include "sender.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// Admits one more transfer unless max_clients are running; returns how many
// run with it (0: refused).
uint32_t admit(ServerState& s) {
  uint32_t n = s.copying.load();
  while (n < s.max_clients)
    if (s.copying.compare_exchange_weak(n, n + 1)) return n + 1;
  return 0;
}

// Test hook: RDMAKIT_CP_HOLD_FILE=PATH holds each admitted transfer before
// its reply while PATH exists (at most 8 s, below the client's 10 s wait for
// the reply), so a test can have many clients admitted at once.
void hold_if_asked(const std::string& peer) {
  const char* path = std::getenv("RDMAKIT_CP_HOLD_FILE");
  if (path == nullptr || *path == '\0') return;
  int i = 0;
  for (; i < 400 && ::access(path, F_OK) == 0; ++i) std::this_thread::sleep_for(20ms);
  if (i == 400)
    std::fprintf(stderr,
                 "rdmakit-cp serve: %s: hold file %s still there after 8 s; going on\n",
                 peer.c_str(), path);
}

// The client closes when it has read everything (or its refusal); a peer
// that does not is closed after 5 s, so it cannot keep its buffer.
void wait_for_close(session::Endpoint& ep) {
  for (int i = 0; i < 100 && !ep.closed(); ++i) std::this_thread::sleep_for(50ms);
  if (!ep.closed()) ep.close();
  for (int i = 0; i < 100 && !ep.closed(); ++i) std::this_thread::sleep_for(10ms);
}

void reply(session::Channel& ch, bool ok, uint32_t lanes, Failure kind,
           const std::string& why, const std::vector<JoinToken>& tokens = {}) {
  if (!ok) return refuse_hello(ch, static_cast<uint8_t>(kind), why);
  Writer w = message(Msg::kHelloReply);
  w.put<uint8_t>(ok)
      .put<uint32_t>(lanes)
      .put<uint8_t>(static_cast<uint8_t>(kind))
      .str(why);
  for (const JoinToken& t : tokens) w.bytes(t);
  (void)ch.send(std::span<const std::byte>(w.data()));
  ::sodium_memzero(w.data().data(), w.data().size());
}

// Lanes for a copy that asked for `want`: its first, and as many more as
// the extra lanes' budget has left.
uint32_t take_lanes(ServerState& s, uint32_t want) {
  uint32_t used = s.extra_lanes_used.load();
  for (;;) {
    const uint32_t left = s.extra_lanes > used ? s.extra_lanes - used : 0;
    const uint32_t n = std::min(want - 1, left);
    if (n == 0) return 1;
    if (s.extra_lanes_used.compare_exchange_weak(used, used + n)) return n + 1;
  }
}

// A lane connection: its first message is a join with a token the server
// gave an admitted copy. Refused (and closed, nothing read from its
// buffer) unless the token is an open copy's, for that lane, not used.
void join_lane(ServerState& s, const std::shared_ptr<session::Endpoint>& ep,
               session::Message&& first) {
  Reader rd(first.data());
  (void)rd.get<uint8_t>();
  const auto lane = rd.get<uint32_t>();
  const auto raw = rd.take(kJoinTokenBytes);
  std::string why;
  const MemoryRegion* own = ep->local_buffer(kSlotsBuffer);
  if (!rd.ok() || !rd.at_end()) {
    why = "malformed lane join";
  } else if (own == nullptr || own->length() < kLaneBytes) {
    why = "server error: no slots buffer for this lane";
  } else {
    JoinToken token;
    std::memcpy(token.data(), raw.data(), token.size());
    why = s.lanes.join(lane, token, ep);
    ::sodium_memzero(token.data(), token.size());
  }
  first.release();
  Writer w = message(Msg::kLaneReply);
  w.put<uint8_t>(why.empty() ? 1 : 0).str(why);
  (void)ep->channel().send(std::span<const std::byte>(w.data()));
  if (why.empty()) return;  // the copy it joined owns it now
  std::fprintf(s.log, "rdmakit-cp serve: %s: lane join refused: %s\n", ep->peer().c_str(),
               why.c_str());
  wait_for_close(*ep);
}

// An admitted copy's extra lanes: granted in the reply, joined within 10 s
// (or the copy fails with the lane named), closed when the copy ends.
struct CopyLanes {
  ServerState& s;
  session::Endpoint& control;
  uint32_t granted = 1;
  std::shared_ptr<LaneGroup> group;
  std::vector<JoinToken> tokens;

  CopyLanes(ServerState& st, session::Endpoint& ep, uint32_t want)
      : s(st), control(ep), granted(want) {
    if (granted > 1) {
      group = s.lanes.open(granted, &tokens);
      if (!group) {  // a count open() does not take: one lane
        s.extra_lanes_used -= granted - 1;
        granted = 1;
      }
    }
  }
  ~CopyLanes() {
    s.lanes.close(group);
    for (uint32_t l = 1; l < granted; ++l)
      if (auto ep = group->endpoint(l)) wait_for_close(*ep);
    s.extra_lanes_used -= granted - 1;
  }
  // Every lane joined; else the copy is told why and false.
  bool joined(Report& report) {
    ::sodium_memzero(tokens.data(), tokens.size() * sizeof(JoinToken));
    if (granted == 1) return true;
    for (int i = 0; i < 100; ++i) {
      if (group->wait_joined(100ms)) return true;
      if (control.closed()) break;
    }
    const std::string why = "lane " + std::to_string(group->missing()) + " of " +
                            std::to_string(granted) +
                            (control.closed() ? " did not join before the client left"
                                              : " did not join within 10 s");
    report.error(Failure::kPeer, control.peer(), why);
    Writer w = message(Msg::kFatal);
    w.put<uint8_t>(static_cast<uint8_t>(Failure::kPeer)).str(why);
    (void)control.channel().send(std::span<const std::byte>(w.data()));
    return false;
  }
  std::vector<SenderLane> sender_lanes() {
    std::vector<SenderLane> out;
    for (uint32_t l = 1; l < granted; ++l) {
      auto ep = group->endpoint(l);
      out.push_back({&ep->channel(), session::Local::of(*ep->local_buffer(kSlotsBuffer)),
                     0, ep->peer()});
    }
    return out;
  }
  std::vector<ReceiverLane> receiver_lanes() {
    std::vector<ReceiverLane> out;
    for (uint32_t l = 1; l < granted; ++l) {
      auto ep = group->endpoint(l);
      out.push_back({&ep->channel(), ep->local_buffer(kSlotsBuffer)->data(), ep->peer()});
    }
    return out;
  }
};

void handle(ServerState& s, const std::shared_ptr<session::Endpoint>& ep) {
  session::Channel& ch = ep->channel();
  session::Message first;
  const session::OpResult r = ch.recv(&first, 10s);
  if (!r.ok()) {
    std::fprintf(s.log, "rdmakit-cp serve: %s: no request: %s\n", ep->peer().c_str(),
                 r.detail.c_str());
    ep->close();
    return;
  }
  // Nothing of the request is read before the client is authenticated; a
  // lane of a copy authenticates too (its token alone crossed lane 0 in the
  // clear), then joins with its token.
  session::Message m;
  std::string auth_why;
  if (!authenticate_client(ch, s.secret, std::move(first), &m, &auth_why)) {
    std::fprintf(s.log, "rdmakit-cp serve: %s: %s\n", ep->peer().c_str(),
                 auth_why.c_str());
    wait_for_close(*ep);
    return;
  }
  if (!m.is_notification() && !m.data().empty() &&
      static_cast<Msg>(m.data()[0]) == Msg::kLaneJoin)
    return join_lane(s, ep, std::move(m));
  Request req;
  const Parsed parsed = parse_request(m.data(), &req);
  m.release();
  if (parsed == Parsed::kRefused) {
    const std::string why = "protocol version mismatch: the client speaks version " +
                            std::to_string(req.version) + ", this server " +
                            std::to_string(kProtocolVersion);
    reply(ch, false, 0, Failure::kPeer, why);
    std::fprintf(s.log, "rdmakit-cp serve: %s: %s\n", ep->peer().c_str(), why.c_str());
    wait_for_close(*ep);
    return;
  }
  if (parsed != Parsed::kOk) {
    reply(ch, false, 0, Failure::kPeer, "malformed request");
    std::fprintf(s.log, "rdmakit-cp serve: %s: malformed request\n", ep->peer().c_str());
    wait_for_close(*ep);
    return;
  }
  FilterRules filters;
  std::string filter_why;
  if (!FilterRules::decode(req.filters, &filters, &filter_why)) {
    reply(ch, false, 0, Failure::kPeer, "malformed filter rules: " + filter_why);
    std::fprintf(s.log, "rdmakit-cp serve: %s: malformed filter rules: %s\n",
                 ep->peer().c_str(), filter_why.c_str());
    wait_for_close(*ep);
    return;
  }
  std::function<bool(const std::string&, bool)> excluded;
  if (!filters.empty())
    excluded = [&](const std::string& p, bool dir) { return filters.excluded(p, dir); };
  const auto op = static_cast<Op>(req.op);
  const auto flags = req.flags;
  const std::vector<std::string>& paths = req.paths;
  if ((op == Op::kPush && s.read_only) || (op == Op::kPull && s.write_only)) {
    const std::string why =
        op == Op::kPush ? "refused: this server is read-only (--read-only): no pushes"
                        : "refused: this server is write-only (--write-only): no pulls";
    reply(ch, false, 0, Failure::kRefused, why);
    std::fprintf(s.log, "rdmakit-cp serve: %s: %s\n", ep->peer().c_str(), why.c_str());
    wait_for_close(*ep);
    return;
  }
  // The peer's own buffer: the receiver's slots on a push, the sender's
  // staging on a pull (the client's slots are the target then).
  MemoryRegion* own = ep->local_buffer(kSlotsBuffer);
  if (own == nullptr || own->length() < kLaneBytes) {
    reply(ch, false, 0, Failure::kPeer, "server error: no slots buffer for this client");
    std::fprintf(s.log, "rdmakit-cp serve: %s: no per-client slots buffer\n",
                 ep->peer().c_str());
    wait_for_close(*ep);
    return;
  }
  const uint32_t copying = admit(s);
  if (copying == 0) {
    const std::string why = "server busy: " + std::to_string(s.max_clients) +
                            " clients are copying, its limit (--max-clients " +
                            std::to_string(s.max_clients) + "); try again later";
    reply(ch, false, 0, Failure::kPeer, why);
    std::fprintf(s.log, "rdmakit-cp serve: %s: refused: %s\n", ep->peer().c_str(),
                 why.c_str());
    wait_for_close(*ep);
    return;
  }
  const uint32_t granted = take_lanes(s, req.lanes);
  std::fprintf(s.log, "rdmakit-cp serve: %s: %s admitted (%u copying) over %u lane%s\n",
               ep->peer().c_str(), op == Op::kPush ? "push" : "pull", copying, granted,
               granted == 1 ? "" : "s");
  CopyLanes lanes(s, *ep, granted);
  hold_if_asked(ep->peer());
  Report report;
  const bool resume = flags & kFlagResume;
  if (op == Op::kPush) {
    // paths: destination, then the number of sources as text.
    Target target;
    Failure kind = Failure::kNone;
    std::string why;
    const uint32_t nsources = static_cast<uint32_t>(
        std::min<unsigned long>(std::strtoul(paths[1].c_str(), nullptr, 10), 1u << 20));
    if (!resolve_target(s.root, paths[0], s.confined, nsources, &target, &kind, &why)) {
      std::fprintf(s.log, "rdmakit-cp serve: %s: push to %s: %s\n", ep->peer().c_str(),
                   paths[0].c_str(), why.c_str());
      reply(ch, false, 0, kind, paths[0] + ": " + why);
    } else {
      reply(ch, true, lanes.granted, Failure::kNone, "", lanes.tokens);
      ReceiverConfig rc;
      rc.channel = &ch;
      rc.slots = own->data();
      if (lanes.joined(report)) {
        rc.lanes = lanes.receiver_lanes();
        rc.target = target;
        rc.resume = resume;
        rc.partial_dir = req.partial_dir;
        rc.sync = req.sync;
        rc.side = ItemSide::kPush;
        rc.excluded = excluded;
        rc.report = &report;
        rc.preserve_special = s.preserve_special;
        rc.max_bytes = s.max_client_bytes;
        Receiver rx(rc);
        rx.run();
      }
      ::close(target.base);
    }
  } else {
    // Walked whole before the reply: the walk's errors go to the client
    // first (a pull's sources are few and named by the client).
    EntryQueue entries;
    const SourceRoot root{s.root, s.confined};
    WalkOptions walk;
    walk.recursive = flags & kFlagRecursive;
    walk.excluded = excluded;
    for (const std::string& p : paths) walk_source(root, p, walk, &entries, &report);
    entries.finish();
    reply(ch, true, lanes.granted, Failure::kNone, "", lanes.tokens);
    for (const FileError& e : report.errors()) {
      Writer w = message(Msg::kFileError);
      w.put<uint8_t>(static_cast<uint8_t>(e.kind)).str(e.path).str(e.reason);
      (void)ch.send(std::span<const std::byte>(w.data()));
    }
    SenderConfig sc;
    sc.channel = &ch;
    sc.remote_offset = 0;
    sc.staging = session::Local::of(*own);
    sc.root = root;
    sc.sync = req.sync;
    sc.side = ItemSide::kPull;
    sc.bwlimit = req.bwlimit;
    sc.report = &report;
    sc.corrupt_chunk = corrupt_chunk_from_env();
    if (const char* v = std::getenv("RDMAKIT_CP_TEST_TOP"); v && *v) sc.test_top = v;
    if (const char* v = std::getenv("RDMAKIT_CP_TEST_LINK_TO"); v && *v) sc.test_link = v;
    sc.corrupt_records = corrupt_records_from_env();
    if (lanes.joined(report)) {
      sc.lanes = lanes.sender_lanes();
      Sender(sc).run(entries);
    }
  }
  // Then its place is free (its buffer goes with the endpoint).
  wait_for_close(*ep);
  // How the connection ended: PEER_CLOSED when the client said goodbye.
  const session::DisconnectInfo gone = ep->disconnect_info();
  std::fprintf(
      s.log,
      "rdmakit-cp serve: %s: %s done: %lu files, %lu bytes, %s; connection "
      "ended: %s\n",
      ep->peer().c_str(), op == Op::kPush ? "push" : "pull",
      static_cast<unsigned long>(report.files_done.load()),
      static_cast<unsigned long>(report.bytes_done.load()), failure_name(report.worst()),
      ep->closed() ? session::disconnect_reason_name(gone.reason) : "still open");
  s.served++;  // before copying--, so a watcher sees one or the other
  s.copying--;
}

}  // namespace

session::SessionOptions session_options(const std::string& provider) {
  session::SessionOptions so;
  so.provider = parse_provider(provider);
  so.max_message = kMaxMessage;
  so.recv_depth = 64;
  so.heartbeat = std::chrono::milliseconds(200);
  so.liveness = std::chrono::milliseconds(8000);
  so.peer_timeout = std::chrono::milliseconds(8000);
  return so;
}

int64_t corrupt_chunk_from_env() {
  const char* v = std::getenv("RDMAKIT_CP_CORRUPT_CHUNK");
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : -1;
}

bool corrupt_records_from_env() {
  const char* v = std::getenv("RDMAKIT_CP_CORRUPT_CHUNK");
  return v != nullptr && *v != '\0' && v[std::strlen(v) - 1] == 'r';
}

// 127.0.0.0/8, ::1 and localhost: only this host's users can connect. A
// name other than localhost is not loopback (it could resolve anywhere).
bool is_loopback(const std::string& a) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  const std::string bare =
      a.size() > 2 && a.front() == '[' && a.back() == ']' ? a.substr(1, a.size() - 2) : a;
  if (::inet_pton(AF_INET6, bare.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return a == "localhost";
}

session::SessionOptions server_session_options(const std::string& provider,
                                               uint32_t max_clients) {
  session::SessionOptions so = session_options(provider);
  // One shared progress thread for every client: with a poller per
  // endpoint the session keeps each closed endpoint's thread until the
  // server ends, so a long-lived server would gain an idle-polling thread
  // per copy (measured: each one costs the receiving CPU a few percent).
  so.thread_mode = session::ThreadMode::kSharedWorkers;
  so.workers = 1;
  // The worker sleeps in epoll at once instead of spinning 50 us after each
  // completion: on the receiving CPU, shared with the writer, the spin costs
  // more than the wake-ups (with SCHED_BATCH; docs/cp.md).
  so.event_mode = session::EventMode::kEpollFd;
  // Room for the admitted clients and as many being refused at the same
  // time: past max_endpoints the session rejects a peer before it could be
  // told why.
  // Lane connections count: each copy's lanes past the first, up to the
  // lane budget.
  so.max_endpoints =
      std::max(so.max_endpoints, 2 * max_clients + extra_lanes_for(max_clients));
  return so;
}

session::Handlers client_handlers(ServerState& s) {
  session::Handlers h;
  h.on_connect = [&s](session::Endpoint& ep) {
    auto self = ep.shared_from_this();
    s.connected++;
    s.active++;
    std::thread([&s, self] {
      handle(s, self);
      s.active--;
    }).detach();
  };
  return h;
}

int serve(const ServeOptions& o) {
  ServerState s;
  s.max_clients = o.max_clients;
  s.extra_lanes = extra_lanes_for(o.max_clients);
  s.read_only = o.read_only;
  s.write_only = o.write_only;
  s.preserve_special = o.preserve_special;
  s.max_client_bytes = o.max_client_bytes;
  const int usage = static_cast<int>(Failure::kUsage);
  if (o.read_only && o.write_only) {
    std::fprintf(stderr,
                 "rdmakit-cp serve: --read-only and --write-only exclude each other\n");
    return usage;
  }
  try {
    s.secret = auth::Secret::resolve(o.secret_file);
  } catch (const Error& e) {
    std::fprintf(stderr, "rdmakit-cp serve: %s\n", e.what());
    return usage;
  }
  const bool loopback = is_loopback(o.bind);
  if (!s.secret && !loopback && !o.no_auth) {
    std::fprintf(
        stderr,
        "rdmakit-cp serve: refusing to listen on %s without a secret: anyone who "
        "reaches it could read and write under --root. Give --secret-file PATH "
        "(or RDMAKIT_SECRET_FILE / RDMAKIT_SECRET), or --no-auth to accept that\n",
        o.bind.c_str());
    return usage;
  }
  s.root = ::open(o.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s.root < 0) {
    std::fprintf(stderr, "rdmakit-cp serve: --root %s: %s\n", o.root.c_str(),
                 std::strerror(errno));
    return static_cast<int>(Failure::kUsage);
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  const session::SessionOptions so = server_session_options(o.provider, o.max_clients);
  const std::string address = o.bind + ":" + std::to_string(o.port);
  session::Server server(address, so, client_handlers(s));
  server.expose_per_endpoint(kSlotsBuffer, kLaneBytes, kAccessAll);
  server.start();
  const std::string auth_state =
      s.secret ? "on (" + s.secret->origin() + ")"
               : std::string(loopback ? "OFF: any local user can connect and read/write "
                                        "under the root"
                                      : "OFF (--no-auth): anyone who reaches the port "
                                        "can read/write under the root");
  std::fprintf(stderr,
               "rdmakit-cp serve: root %s, listening on %s (%s), authentication %s, "
               "confinement: %s, max clients %u%s%s%s\n",
               o.root.c_str(), server.address().c_str(), server.context().provider_name(),
               auth_state.c_str(), confinement_method(), o.max_clients,
               o.read_only ? ", read-only" : "", o.write_only ? ", write-only" : "",
               o.preserve_special ? ", keeps setuid/setgid/sticky" : "");
  if (!o.port_file.empty()) {
    const std::string tmp = o.port_file + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%u\n", server.port());
      std::fclose(f);
      std::rename(tmp.c_str(), o.port_file.c_str());
    }
  }
  while (!g_stop) std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 100 && s.active > 0; ++i) std::this_thread::sleep_for(50ms);
  if (s.active > 0) {
    // A transfer still runs on state this frame owns: leave without
    // unwinding under it (its part file stays for --resume).
    std::fprintf(stderr, "rdmakit-cp serve: stopping with %d transfer(s) unfinished\n",
                 s.active.load());
    std::_Exit(0);
  }
  ::close(s.root);
  return 0;
}

}  // namespace rdmakit::cp
