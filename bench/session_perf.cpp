// rdmakit-session-perf: the session layer's own latency and bandwidth, to set
// beside the core's rdmakit-perf (bench/session_vs_core.sh runs both).
//   send_lat  8 B message ping-pong; half round trip (server echoes in its handler)
//   write_bw  64 KiB WRITEs to the peer's named buffer, `window` in flight;
//             the name is resolved once (Channel::resolve). Like the core's
//             write_bw (post lists of 16, cq_mod), WRITEs go in
//             write_batch() lists of `batch` with one callback on the last
//             (its completion implies the others); --batch 1: one write()
//             with a callback per WRITE
// Both ends busy-poll in application thread mode (no library threads), each
// pinned to its own CPU; the server is forked (--loopback semantics).
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/session/session.hpp"
#include "tsc_stamp.hpp"

using namespace rdmakit;
using namespace rdmakit::session;
using Clock = std::chrono::steady_clock;
using rdmakit::bench::Stamp;

namespace {

struct Config {
  std::string test = "send_lat";
  std::string provider = "shm";
  uint32_t size = 0;
  uint32_t iters = 20000;
  uint32_t window = 128;
  uint32_t batch = 16;
  int client_cpu = 0;
  int server_cpu = 1;
};

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

SessionOptions options(const Config& c) {
  SessionOptions o;
  o.provider = parse_provider(c.provider);
  o.thread_mode = ThreadMode::kApplication;
  o.event_mode = EventMode::kBusyPoll;
  o.max_message = std::max<uint32_t>(c.size, 64);
  o.recv_depth = 256;
  return o;
}

int server(const Config& c, int port_pipe) {
  pin(c.server_cpu);
  SessionOptions o = options(c);
  // write_bw's target only serves heartbeats: like rdmakit-perf's passive
  // target it sleeps in the kernel, except on tcp, whose one-sided ops the
  // target's polling carries (rdmakit-perf busy-polls a tcp target too).
  if (c.test == "write_bw" && o.provider != ProviderKind::kTcp) {
    o.event_mode = EventMode::kBlocking;
  }
  Handlers h;
  bool done = false;
  h.on_message = [](Channel& ch, Message& m) { (void)ch.send(m.data()); };
  h.on_disconnect = [&](Endpoint&, const DisconnectInfo&) { done = true; };
  Server s("127.0.0.1:0", o, h);
  s.expose("target", std::max<size_t>(c.size, 64) * 2);
  s.start();
  const uint16_t port = s.port();
  if (::write(port_pipe, &port, sizeof port) != sizeof port) return 1;
  const auto limit = Clock::now() + std::chrono::seconds(120);
  // The clock is read every 1024 passes, not between two messages.
  for (uint32_t pass = 0; !done; ++pass) {
    if ((pass & 1023) == 0 && Clock::now() >= limit) break;
    s.progress(std::chrono::milliseconds(1));
  }
  return done ? 0 : 1;
}

int client(const Config& c, uint16_t port) {
  pin(c.client_cpu);
  Client cl(options(c));
  Channel& ch = cl.connect("127.0.0.1:" + std::to_string(port)).channel();
  if (c.test == "send_lat") {
    std::vector<std::byte> msg(c.size, std::byte{7});
    std::vector<double> us;
    us.reserve(c.iters);
    const uint32_t warmup = c.iters / 10;
    const Stamp stamp;
    // One timestamp per iteration; a round trip is the gap between two.
    uint64_t prev = stamp.now();
    Message held;
    for (uint32_t i = 0; i < warmup + c.iters; ++i) {
      OpResult r = ch.send(msg);
      // The previous reply's RECV is re-posted after this send, as
      // rdmakit-perf refills its RECVs after posting (the server's handler
      // does the same: its message is released after the echo).
      held.release();
      if (r.ok()) r = ch.recv(&held, std::chrono::seconds(5));
      if (!r.ok() || held.data().size() != c.size) {
        std::fprintf(stderr, "send_lat: %s\n", r.detail.c_str());
        return 1;
      }
      const uint64_t t = stamp.now();
      if (i >= warmup) us.push_back(stamp.us(t - prev) / 2);
      prev = t;
    }
    held.release();
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double v : us) sum += v;
    std::printf(
        "{\"api\":\"session\",\"test\":\"send_lat\",\"provider\":\"%s\",\"size\":%u,"
        "\"iterations\":%u,\"t_avg_us\":%.4f,\"t_typical_us\":%.4f,\"t_min_us\":%.4f,"
        "\"t_p99_us\":%.4f}\n",
        c.provider.c_str(), c.size, c.iters, sum / us.size(), us[us.size() / 2],
        us.front(), us[static_cast<size_t>(0.99 * (us.size() - 1))]);
  } else {
    auto src = cl.context().allocate(c.size, kAccessLocalWrite);
    RemoteBuffer target;
    if (const OpResult r = ch.resolve("target", &target); !r.ok()) {
      std::fprintf(stderr, "write_bw: %s\n", r.detail.c_str());
      return 1;
    }
    struct Counts {
      uint32_t completed = 0;
      uint32_t failed = 0;
    } counts;
    uint32_t posted = 0;
    const uint32_t& completed = counts.completed;
    const uint32_t batch = std::max<uint32_t>(1, std::min(c.batch, c.window));
    const std::vector<WriteSegment> segments(
        batch, WriteSegment{.offset = 0, .src = Local::of(*src), .length = c.size});
    const auto t0 = Clock::now();
    while (completed < c.iters) {
      while (posted < c.iters && posted - completed < c.window) {
        const uint32_t n =
            std::min({batch, c.iters - posted, c.window - (posted - completed)});
        const uint32_t upto = posted + n;
        // Two words: within std::function's small buffer, no allocation.
        OpCallback done = [k = &counts, upto](const OpResult& r) {
          k->completed = upto;
          if (!r.ok()) ++k->failed;
        };
        const OpResult r =
            batch == 1
                ? ch.write(target, 0, Local::of(*src), c.size, std::move(done))
                : ch.write_batch(target, std::span(segments.data(), n), std::move(done));
        if (!r.ok()) {
          std::fprintf(stderr, "write_bw: %s\n", r.detail.c_str());
          return 1;
        }
        posted = upto;
      }
      cl.progress();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (counts.failed != 0) return 1;
    std::printf(
        "{\"api\":\"session\",\"test\":\"write_bw\",\"provider\":\"%s\",\"size\":%u,"
        "\"iterations\":%u,\"window\":%u,\"batch\":%u,\"seconds\":%.6f,"
        "\"bw_avg_MBps\":%.2f}\n",
        c.provider.c_str(), c.size, c.iters, c.window, batch, s,
        static_cast<double>(c.size) * c.iters / s / 1e6);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"rdmakit-session-perf: session-layer latency and bandwidth (loopback)"};
  app.add_option("test", c.test, "send_lat | write_bw")
      ->check(CLI::IsMember({"send_lat", "write_bw"}));
  app.add_option("--provider", c.provider, "shm | tcp | verbs");
  app.add_option("-s,--size", c.size,
                 "bytes (default 8 for send_lat, 65536 for write_bw)");
  app.add_option("-n,--iters", c.iters, "iterations");
  app.add_option("--window", c.window, "write_bw: WRITEs in flight");
  app.add_option(
      "--batch", c.batch,
      "write_bw: WRITEs per write_batch() call, one callback each (1: write())");
  app.add_option("--cpu", c.client_cpu, "client CPU (-1: not pinned)");
  app.add_option("--server-cpu", c.server_cpu, "server CPU (-1: not pinned)");
  CLI11_PARSE(app, argc, argv);
  if (c.size == 0) c.size = c.test == "send_lat" ? 8 : 65536;
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      _exit(server(c, fds[1]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server: %s\n", e.what());
      _exit(1);
    }
  }
  ::close(fds[1]);
  uint16_t port = 0;
  int rc = 1;
  if (::read(fds[0], &port, sizeof port) == sizeof port) {
    try {
      rc = client(c, port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "client: %s\n", e.what());
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return rc;
}
