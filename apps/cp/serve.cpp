// rdmakit-cp serve: one session server; each client gets a lane of the
// exposed "slots" buffer (the session layer exposes a buffer to every peer,
// so peers are kept apart by offset) and a thread running a Receiver (push)
// or a Sender (pull) confined to --root.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <rdmakit/session/session.hpp>
#include <thread>

#include "confine.hpp"
#include "endpoints.hpp"
#include "protocol.hpp"
#include "receiver.hpp"
#include "sender.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct ServerState {
  int root = -1;
  MemoryRegion* slots = nullptr;
  std::vector<std::unique_ptr<MemoryRegion>> staging;  // per lane, for pull
  std::mutex mu;
  bool lane_used[kLanes] = {};
  std::atomic<int> active{0};
};

int take_lane(ServerState& s) {
  std::lock_guard lock(s.mu);
  for (uint32_t i = 0; i < kLanes; ++i)
    if (!s.lane_used[i]) {
      s.lane_used[i] = true;
      return static_cast<int>(i);
    }
  return -1;
}

void reply(session::Channel& ch, bool ok, uint32_t lane, Failure kind,
           const std::string& why) {
  Writer w = message(Msg::kHelloReply);
  w.put<uint8_t>(ok)
      .put<uint32_t>(lane)
      .put<uint8_t>(static_cast<uint8_t>(kind))
      .str(why);
  (void)ch.send(std::span<const std::byte>(w.data()));
}

void handle(ServerState& s, const std::shared_ptr<session::Endpoint>& ep) {
  session::Channel& ch = ep->channel();
  session::Message m;
  const session::OpResult r = ch.recv(&m, 10s);
  if (!r.ok()) {
    std::fprintf(stderr, "rdmakit-cp serve: %s: no request: %s\n", ep->peer().c_str(),
                 r.detail.c_str());
    ep->close();
    return;
  }
  Reader rd(m.data());
  const auto type = static_cast<Msg>(rd.get<uint8_t>());
  const auto version = rd.get<uint32_t>();
  const auto op = static_cast<Op>(rd.get<uint8_t>());
  const auto flags = rd.get<uint8_t>();
  const auto n = rd.get<uint32_t>();
  std::vector<std::string> paths;
  for (uint32_t i = 0; i < n && i < 100000 && rd.ok(); ++i) paths.push_back(rd.str(4096));
  m.release();
  if (!rd.ok() || type != Msg::kHello || version != kProtocolVersion || paths.empty() ||
      (op != Op::kPush && op != Op::kPull)) {
    reply(ch, false, 0, Failure::kPeer, "malformed request or protocol version mismatch");
    std::fprintf(stderr, "rdmakit-cp serve: %s: malformed request\n", ep->peer().c_str());
    return;
  }
  const int lane = take_lane(s);
  if (lane < 0) {
    reply(ch, false, 0, Failure::kPeer, "server busy (all lanes in use)");
    return;
  }
  Report report;
  const bool resume = flags & kFlagResume;
  if (op == Op::kPush) {
    // paths: destination, then the number of sources as text.
    Target target;
    Failure kind = Failure::kNone;
    std::string why;
    const uint32_t nsources =
        paths.size() > 1
            ? static_cast<uint32_t>(std::strtoul(paths[1].c_str(), nullptr, 10))
            : 1;
    if (!resolve_target(s.root, paths[0], true, nsources, &target, &kind, &why)) {
      std::fprintf(stderr, "rdmakit-cp serve: %s: push to %s: %s\n", ep->peer().c_str(),
                   paths[0].c_str(), why.c_str());
      reply(ch, false, 0, kind, paths[0] + ": " + why);
    } else {
      reply(ch, true, static_cast<uint32_t>(lane), Failure::kNone, "");
      Receiver rx(
          {&ch, s.slots->data() + uint64_t(lane) * kLaneBytes, target, resume, &report});
      rx.run();
      ::close(target.base);
    }
  } else {
    // Walked whole before the reply: the walk's errors go to the client
    // first (a pull's sources are few and named by the client).
    EntryQueue entries;
    const SourceRoot root{s.root, true};
    for (const std::string& p : paths)
      walk_source(root, p, flags & kFlagRecursive, &entries, &report);
    entries.finish();
    reply(ch, true, static_cast<uint32_t>(lane), Failure::kNone, "");
    for (const FileError& e : report.errors()) {
      Writer w = message(Msg::kFileError);
      w.put<uint8_t>(static_cast<uint8_t>(e.kind)).str(e.path).str(e.reason);
      (void)ch.send(std::span<const std::byte>(w.data()));
    }
    MemoryRegion& staging = *s.staging[static_cast<size_t>(lane)];
    SenderConfig sc;
    sc.channel = &ch;
    sc.remote_offset = 0;
    sc.staging = session::Local::of(staging);
    sc.root = root;
    sc.resume = resume;
    sc.report = &report;
    sc.corrupt_chunk = corrupt_chunk_from_env();
    Sender(sc).run(entries);
  }
  // The client closes when it has read everything; then the lane is free.
  for (int i = 0; i < 100 && !ep->closed(); ++i) std::this_thread::sleep_for(50ms);
  if (!ep->closed()) ep->close();
  for (int i = 0; i < 100 && !ep->closed(); ++i) std::this_thread::sleep_for(10ms);
  std::fprintf(stderr, "rdmakit-cp serve: %s: %s done: %lu files, %lu bytes, %s\n",
               ep->peer().c_str(), op == Op::kPush ? "push" : "pull",
               static_cast<unsigned long>(report.files_done.load()),
               static_cast<unsigned long>(report.bytes_done.load()),
               failure_name(report.worst()));
  std::lock_guard lock(s.mu);
  s.lane_used[lane] = false;
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

int serve(const ServeOptions& o) {
  ServerState s;
  s.root = ::open(o.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s.root < 0) {
    std::fprintf(stderr, "rdmakit-cp serve: --root %s: %s\n", o.root.c_str(),
                 std::strerror(errno));
    return static_cast<int>(Failure::kUsage);
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  session::SessionOptions so = session_options(o.provider);
  // One shared progress thread for every client: with a poller per
  // endpoint the session keeps each closed endpoint's thread until the
  // server ends, so a long-lived server would gain an idle-polling thread
  // per copy (measured: each one costs the receiving CPU a few percent).
  so.thread_mode = session::ThreadMode::kSharedWorkers;
  so.workers = 1;
  session::Handlers h;
  h.on_connect = [&s](session::Endpoint& ep) {
    auto self = ep.shared_from_this();
    s.active++;
    std::thread([&s, self] {
      handle(s, self);
      s.active--;
    }).detach();
  };
  const std::string address = o.bind + ":" + std::to_string(o.port);
  session::Server server(address, so, h);
  s.slots = &server.expose(kSlotsBuffer, uint64_t{kLanes} * kLaneBytes, kAccessAll);
  for (uint32_t i = 0; i < kLanes; ++i)
    s.staging.push_back(server.context().allocate(kLaneBytes, kAccessLocalWrite));
  server.start();
  std::fprintf(stderr,
               "rdmakit-cp serve: root %s, listening on %s (%s), confinement: %s\n",
               o.root.c_str(), server.address().c_str(), server.context().provider_name(),
               confinement_method());
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
  // The staging regions belong to the server's context: release them while
  // it still exists (the server is destroyed first, being declared last).
  s.staging.clear();
  ::close(s.root);
  return 0;
}

}  // namespace rdmakit::cp
