// rdmakit-session-perf: the session layer's own latency and bandwidth, to set
// beside the core's rdmakit-perf (bench/session_vs_core.sh runs both).
//   send_lat  8 B message ping-pong; half round trip (server echoes in its handler)
//   write_bw  64 KiB WRITEs to the peer's named buffer, `window` in flight
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
#include <vector>

#include "rdmakit/session/session.hpp"

using namespace rdmakit;
using namespace rdmakit::session;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string test = "send_lat";
  std::string provider = "shm";
  uint32_t size = 0;
  uint32_t iters = 20000;
  uint32_t window = 128;
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
  Handlers h;
  bool done = false;
  h.on_message = [](Channel& ch, Message& m) { (void)ch.send(m.data()); };
  h.on_disconnect = [&](Endpoint&, const DisconnectInfo&) { done = true; };
  Server s("127.0.0.1:0", options(c), h);
  s.expose("target", std::max<size_t>(c.size, 64) * 2);
  s.start();
  const uint16_t port = s.port();
  if (::write(port_pipe, &port, sizeof port) != sizeof port) return 1;
  const auto limit = Clock::now() + std::chrono::seconds(120);
  while (!done && Clock::now() < limit) s.progress(std::chrono::milliseconds(1));
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
    for (uint32_t i = 0; i < warmup + c.iters; ++i) {
      const auto t0 = Clock::now();
      OpResult r = ch.send(msg);
      Message m;
      if (r.ok()) r = ch.recv(&m, std::chrono::seconds(5));
      if (!r.ok() || m.data().size() != c.size) {
        std::fprintf(stderr, "send_lat: %s\n", r.detail.c_str());
        return 1;
      }
      if (i >= warmup)
        us.push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    }
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
    uint32_t posted = 0, completed = 0, failed = 0;
    auto done = [&](const OpResult& r) {
      ++completed;
      if (!r.ok()) ++failed;
    };
    const auto t0 = Clock::now();
    while (completed < c.iters) {
      while (posted < c.iters && posted - completed < c.window) {
        const OpResult r = ch.write("target", 0, Local::of(*src), c.size, done);
        if (!r.ok()) {
          std::fprintf(stderr, "write_bw: %s\n", r.detail.c_str());
          return 1;
        }
        ++posted;
      }
      cl.progress();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (failed != 0) return 1;
    std::printf(
        "{\"api\":\"session\",\"test\":\"write_bw\",\"provider\":\"%s\",\"size\":%u,"
        "\"iterations\":%u,\"window\":%u,\"seconds\":%.6f,\"bw_avg_MBps\":%.2f}\n",
        c.provider.c_str(), c.size, c.iters, c.window, s,
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
