// The copying client: push (local sources -> HOST:DST) or pull
// (HOST:sources -> local DST) over one session endpoint.
#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <rdmakit/session/session.hpp>
#include <thread>

#include "auth.hpp"
#include "endpoints.hpp"
#include "lanes.hpp"
#include "progress.hpp"
#include "protocol.hpp"
#include "receiver.hpp"
#include "records.hpp"
#include "remote_shell.hpp"
#include "sender.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

// RDMAKIT_CP_TIMING=1: the time of each phase on stderr (where a short copy
// spends its time: walk, session setup, transfer, close).
struct PhaseClock {
  bool on = std::getenv("RDMAKIT_CP_TIMING") != nullptr;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  void mark(const char* phase) {
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    std::fprintf(stderr, "rdmakit-cp: timing: %-8s %7.1f ms\n", phase,
                 std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
};

// A lane past the first: a session client of its own (on tcp a connection
// of its own, served by its own progress thread).
struct ClientLane {
  std::unique_ptr<session::Client> client;
  MemoryRegion* slots = nullptr;
  std::unique_ptr<MemoryRegion> staging;
  session::Endpoint* ep = nullptr;
};

// Test hooks: RDMAKIT_CP_TEST_SAVE_TOKEN=FILE keeps lane 1's join token in
// FILE; RDMAKIT_CP_TEST_LANE_TOKEN=FILE joins lane 1 with the token in FILE
// instead (a replayed token), =zero with zeros (a wrong one).
void test_token_hooks(uint32_t lane, JoinToken* token) {
  if (lane != 1) return;
  if (const char* save = std::getenv("RDMAKIT_CP_TEST_SAVE_TOKEN"); save && *save) {
    if (FILE* f = std::fopen(save, "wb")) {
      std::fwrite(token->data(), 1, token->size(), f);
      std::fclose(f);
    }
  }
  const char* use = std::getenv("RDMAKIT_CP_TEST_LANE_TOKEN");
  if (use == nullptr || *use == '\0') return;
  if (std::strcmp(use, "zero") == 0) {
    token->fill(std::byte{0});
    return;
  }
  if (FILE* f = std::fopen(use, "rb")) {
    if (std::fread(token->data(), 1, token->size(), f) != token->size())
      token->fill(std::byte{0});
    std::fclose(f);
  }
}

// Opens lane `lane` and joins it to the copy with its token; "" or why not.
// With a secret the lane authenticates first, as lane 0 did: the token, sent
// on lane 0 in the clear, is not enough to join.
std::string open_lane(const session::SessionOptions& so, const std::string& address,
                      bool push, uint32_t lane, JoinToken token,
                      const std::optional<auth::Secret>& secret, ClientLane* out) {
  test_token_hooks(lane, &token);
  out->client = std::make_unique<session::Client>(so);
  out->slots = &out->client->expose(kSlotsBuffer, push ? 4096 : kLaneBytes, kAccessAll);
  out->staging =
      out->client->context().allocate(push ? kLaneBytes : 4096, kAccessLocalWrite);
  out->ep = &out->client->connect(address);
  session::Channel& ch = out->ep->channel();
  if (std::string why = authenticate_to_server(ch, secret, 10s); !why.empty()) return why;
  Writer join = message(Msg::kLaneJoin);
  join.put<uint32_t>(lane).bytes(token);
  session::OpResult r = ch.send(std::span<const std::byte>(join.data()));
  ::sodium_memzero(join.data().data(), join.data().size());
  ::sodium_memzero(token.data(), token.size());
  session::Message m;
  if (r.ok()) r = ch.recv(&m, 10s);
  if (!r.ok()) return "no answer to its join: " + r.detail;
  Reader rd(m.data());
  const auto type = static_cast<Msg>(rd.get<uint8_t>());
  const auto ok = rd.get<uint8_t>();
  const std::string why = rd.str(4096);
  m.release();
  if (!rd.ok() || type != Msg::kLaneReply) return "protocol error: bad join reply";
  if (!ok) return "server refused its join: " + why;
  return "";
}

struct Remote {
  bool remote = false;
  std::string host, path;
};

// "host:path" is remote when the ':' comes before any '/' (so ./a:b is local).
Remote parse_location(const std::string& s) {
  const size_t colon = s.find(':');
  const size_t slash = s.find('/');
  if (colon == std::string::npos || colon == 0 ||
      (slash != std::string::npos && slash < colon))
    return {false, "", s};
  return {true, s.substr(0, colon), s.substr(colon + 1)};
}

}  // namespace

int copy(const CopyOptions& o) {
  std::signal(SIGPIPE, SIG_IGN);
  Report report;
  const Remote dst = parse_location(o.dest);
  std::vector<Remote> srcs;
  for (const std::string& s : o.sources) srcs.push_back(parse_location(s));
  const bool push = dst.remote;
  std::string host = push ? dst.host : "";
  for (const Remote& s : srcs) {
    if (s.remote == push || (!push && !host.empty() && s.host != host)) {
      std::fprintf(
          stderr,
          "rdmakit-cp: give local sources and HOST:DST (push), or HOST:SOURCES from one "
          "host and a local DST (pull)\n");
      return static_cast<int>(Failure::kUsage);
    }
    if (!push) host = s.host;
  }
  const uint32_t flags =
      (o.resume ? kFlagResume : 0) | (o.recursive ? kFlagRecursive : 0);

  // Local side first: a push walks its sources, a pull checks its destination.
  PhaseClock clock;
  Target target;
  // A push walks its sources on a thread of its own while the session is set
  // up and the first entries are sent (see EntryQueue). Sizes are only
  // needed up front by the progress display.
  EntryQueue entries;
  std::thread walker;
  struct WalkerJoin {
    EntryQueue& queue;
    std::thread& thread;
    ~WalkerJoin() {
      queue.cancel();
      if (thread.joinable()) thread.join();
    }
  } walker_join{entries, walker};
  report.show_items(o.itemize, o.verbose);
  if (push) {
    walker = std::thread([&] {
      WalkOptions walk;
      walk.recursive = o.recursive;
      if (!o.filters.empty())
        walk.excluded = [&](const std::string& p, bool dir) {
          return o.filters.excluded(p, dir);
        };
      for (const Remote& s : srcs)
        if (!walk_source({AT_FDCWD, false}, s.path, walk, &entries, &report)) break;
      entries.finish();
    });
  } else {
    Failure kind = Failure::kNone;
    std::string why;
    if (!resolve_target(AT_FDCWD, o.dest, false, static_cast<uint32_t>(srcs.size()),
                        &target, &kind, &why)) {
      report.error(kind, o.dest, why);
      return report.exit_code();
    }
  }

  std::optional<auth::Secret> secret;
  std::string provider = o.provider;
  std::string address = host + ":" + std::to_string(o.port);
  // -e: the server is started over the remote shell, and its provider,
  // address, port and a fresh secret come back through that shell only.
  RemoteShell shell;
  if (!o.rsh.empty()) {
    const RemoteRequest req{o.rsh, o.rdmakit_path, host,
                            push,  o.provider,     push && o.preserve_special};
    std::vector<std::string> argv;
    std::string why;
    if (!remote_command(req, &argv, &why)) {
      std::fprintf(stderr, "rdmakit-cp: %s\n", why.c_str());
      return static_cast<int>(Failure::kUsage);
    }
    Bootstrap boot;
    if (!start_remote_server(req, argv, &shell, &boot, &why)) {
      report.error(Failure::kPeer, host, why);
      return report.exit_code();
    }
    secret = auth::Secret::from_bytes(boot.secret, "the remote shell");
    provider = boot.provider;
    address = boot.endpoint();
    clock.mark("ssh");
  } else {
    try {
      secret = auth::Secret::resolve(o.secret_file);
    } catch (const Error& e) {
      std::fprintf(stderr, "rdmakit-cp: %s\n", e.what());
      return static_cast<int>(Failure::kUsage);
    }
  }
  const session::SessionOptions so = session_options(provider);
  SummaryInfo info;
  info.direction = push ? "push" : "pull";
  info.peer = address;
  try {
    // The session retries a refused connect by itself; a handshake cut short
    // (EPIPE/ECONNRESET: a server just starting or just restarted) is retried
    // here, a bounded number of times, with a fresh client.
    std::unique_ptr<session::Client> client_holder;
    MemoryRegion* slots_mr = nullptr;
    std::unique_ptr<MemoryRegion> staging;
    session::Endpoint* ep_ptr = nullptr;
    for (int attempt = 1;; ++attempt) {
      staging.reset();
      client_holder = std::make_unique<session::Client>(so);
      // Only the receiving end needs the slots and only the sending end the
      // staging memory; the other one is a page (on shm each MiB is mapped
      // and populated at once, a visible cost for a short copy).
      slots_mr =
          &client_holder->expose(kSlotsBuffer, push ? 4096 : kLaneBytes, kAccessAll);
      staging =
          client_holder->context().allocate(push ? kLaneBytes : 4096, kAccessLocalWrite);
      try {
        ep_ptr = &client_holder->connect(address);
        break;
      } catch (const Error& e) {
        if (attempt >= 3 || (e.sys_errno() != EPIPE && e.sys_errno() != ECONNRESET))
          throw;
        std::fprintf(stderr, "rdmakit-cp: %s: handshake cut short (%s); retrying\n",
                     address.c_str(), std::strerror(e.sys_errno()));
        std::this_thread::sleep_for(200ms * attempt);
      }
    }
    clock.mark("connect");
    MemoryRegion& slots = *slots_mr;
    session::Endpoint& ep = *ep_ptr;
    info.provider = ep.provider_name();
    session::Channel& ch = ep.channel();
    const auto t0 = std::chrono::steady_clock::now();

    // Before any request: prove we hold the secret and have the server
    // prove it (a client with a secret trusts no server without one).
    const std::string auth_error = authenticate_to_server(ch, secret, 10s);
    if (!auth_error.empty()) {
      report.error(Failure::kRefused, address, auth_error);
      ep.close();
      return report.exit_code();
    }
    // Test hook: RDMAKIT_CP_HELLO_VERSION=N says version N (a client of another version).
    const char* speak = std::getenv("RDMAKIT_CP_HELLO_VERSION");
    const auto version = speak != nullptr && *speak != '\0'
                             ? static_cast<uint32_t>(std::strtoul(speak, nullptr, 10))
                             : kProtocolVersion;
    Request req;
    req.version = version;
    req.op = static_cast<uint8_t>(push ? Op::kPush : Op::kPull);
    req.flags = static_cast<uint8_t>(flags);
    if (push) {
      req.paths = {dst.path.empty() ? "." : dst.path, std::to_string(srcs.size())};
    } else {
      for (const Remote& s : srcs) req.paths.push_back(s.path);
    }
    req.sync = o.sync;
    req.filters = o.filters.encode();
    req.partial_dir = o.partial_dir;
    req.bwlimit = o.bwlimit;
    // The default follows the provider the session picked ("auto": verbs or tcp).
    const uint32_t want_lanes = std::clamp<uint32_t>(
        o.lanes != 0 ? o.lanes
                     : default_lanes(info.provider,
                                     std::max(1u, std::thread::hardware_concurrency())),
        1, kMaxLanes);
    req.lanes = static_cast<uint8_t>(want_lanes);
    Writer hello = message(Msg::kHello);
    encode_request(req, &hello);
    session::OpResult r = ch.send(std::span<const std::byte>(hello.data()));
    session::Message m;
    if (r.ok()) r = ch.recv(&m, 10s);
    if (!r.ok()) {
      report.error(Failure::kPeer, address,
                   std::string("no answer from the server: ") + r.detail);
      return report.exit_code();
    }
    Reader rd(m.data());
    const auto type = static_cast<Msg>(rd.get<uint8_t>());
    const auto ok = rd.get<uint8_t>();
    // The lanes granted (at most those asked for), a join token each past
    // the first.
    const auto granted = rd.get<uint32_t>();
    const auto kind = static_cast<Failure>(rd.get<uint8_t>());
    const std::string why = rd.str();
    std::vector<JoinToken> tokens;
    if (rd.ok() && ok && granted >= 1 && granted <= want_lanes) {
      tokens.resize(granted - 1);
      for (JoinToken& t : tokens) {
        const auto raw = rd.take(kJoinTokenBytes);
        if (rd.ok()) std::memcpy(t.data(), raw.data(), t.size());
      }
    }
    m.release();
    if (!rd.ok() || type != Msg::kHelloReply ||
        (ok && (granted < 1 || granted > want_lanes))) {
      report.error(Failure::kPeer, address, "protocol error: bad reply");
      return report.exit_code();
    }
    if (!ok) {
      report.error(
          kind > Failure::kPeer || kind == Failure::kNone ? Failure::kPeer : kind,
          address, "server refused: " + why);
      return report.exit_code();
    }

    // The other lanes join, each on a thread of its own: a lane's session
    // setup (its memory, connect, join) is a few milliseconds.
    std::vector<ClientLane> lanes(tokens.size());
    std::vector<std::string> lane_whys(tokens.size());
    {
      std::vector<std::thread> openers;
      for (uint32_t l = 1; l <= tokens.size(); ++l)
        openers.emplace_back([&, l] {
          try {
            lane_whys[l - 1] =
                open_lane(so, address, push, l, tokens[l - 1], secret, &lanes[l - 1]);
          } catch (const std::exception& e) {
            lane_whys[l - 1] = e.what();
          } catch (...) {
            lane_whys[l - 1] = "unknown failure";
          }
          ::sodium_memzero(tokens[l - 1].data(), kJoinTokenBytes);
        });
      for (std::thread& t : openers) t.join();
    }
    for (uint32_t l = 1; l <= tokens.size(); ++l) {
      const std::string& lane_why = lane_whys[l - 1];
      if (!lane_why.empty()) {
        report.error(Failure::kPeer, address,
                     "lane " + std::to_string(l) + " of " + std::to_string(granted) +
                         ": " + lane_why);
        for (ClientLane& c : lanes)
          if (c.ep != nullptr) c.ep->close();
        ep.close();
        return report.exit_code();
      }
    }
    info.lanes = granted;
    // Test hook: RDMAKIT_CP_TEST_DROP_LANE=L closes lane L 400 ms into the
    // copy (a lane lost on its own).
    std::thread dropper;
    struct DropperJoin {
      std::thread& t;
      ~DropperJoin() {
        if (t.joinable()) t.join();
      }
    } dropper_join{dropper};
    if (const char* v = std::getenv("RDMAKIT_CP_TEST_DROP_LANE"); v && *v) {
      const unsigned long l = std::strtoul(v, nullptr, 10);
      if (l >= 1 && l <= lanes.size())
        dropper = std::thread([e = lanes[l - 1].ep] {
          std::this_thread::sleep_for(400ms);
          e->close();
        });
    }

    ProgressMode mode = ProgressMode::kTerminal;
    if (o.progress_files) mode = ProgressMode::kPerFile;
    if (o.progress_total) mode = ProgressMode::kOverall;
    if (o.quiet || o.json) mode = ProgressMode::kNone;
    report.show_file_progress(mode == ProgressMode::kPerFile);
    Progress progress(report, mode);
    if (push) {
      SenderConfig sc;
      sc.channel = &ch;
      sc.remote_offset = 0;
      sc.staging = {staging->data(), staging->length(), staging->lkey()};
      for (ClientLane& c : lanes)
        sc.lanes.push_back({&c.ep->channel(),
                            {c.staging->data(), c.staging->length(), c.staging->lkey()},
                            0,
                            c.ep->peer()});
      sc.root = {AT_FDCWD, false};
      sc.sync = o.sync;
      sc.side = ItemSide::kPush;
      sc.bwlimit = o.bwlimit;
      sc.report = &report;
      sc.corrupt_chunk = corrupt_chunk_from_env();
      sc.corrupt_records = corrupt_records_from_env();
      if (const char* v = std::getenv("RDMAKIT_CP_TEST_DECLARE_SIZE"); v && *v) {
        sc.lie_size = true;
        sc.declare_size = std::strtoull(v, nullptr, 10);
      }
      Sender(sc).run(entries);
    } else {
      ReceiverConfig rc;
      rc.channel = &ch;
      rc.slots = slots.data();
      for (ClientLane& c : lanes)
        rc.lanes.push_back({&c.ep->channel(), c.slots->data(), c.ep->peer()});
      rc.target = target;
      rc.resume = o.resume;
      rc.partial_dir = o.partial_dir;
      // What the server may name: the last component of each source asked
      // for (a copy to a new name replaces the first component anyway).
      for (const Remote& s : srcs) rc.tops.push_back(source_name(s.path));
      rc.sync = o.sync;
      rc.side = ItemSide::kPull;
      if (!o.filters.empty())
        rc.excluded = [&](const std::string& p, bool dir) {
          return o.filters.excluded(p, dir);
        };
      rc.report = &report;
      rc.preserve_special = o.preserve_special;
      Receiver(rc).run();
    }
    progress.stop();
    clock.mark("transfer");
    info.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The endpoint's goodbye is posted by close(); the session (staging,
    // slots, client) is torn down when this scope ends, which waits for
    // its progress thread but no longer for a fixed linger.
    if (dropper.joinable()) dropper.join();
    for (ClientLane& c : lanes) c.ep->close();
    ep.close();
  } catch (const Error& e) {
    report.error(Failure::kPeer, address, e.what());
  }
  if (target.base >= 0) ::close(target.base);
  if (shell.running()) {
    // The remote server exits once its client has gone and its input closes.
    const std::string how = shell.finish(10s);
    if (shell.status() != 0 && report.worst() == Failure::kNone)
      std::fprintf(stderr, "rdmakit-cp: %s: warning: after the copy, %s\n", host.c_str(),
                   how.c_str());
  }
  clock.mark("close");
  if (o.stats && !o.json) print_stats(report, info);
  print_summary(report, info, o.json);
  return report.exit_code();
}

}  // namespace rdmakit::cp
