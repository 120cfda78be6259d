// rdmakit-pingpong: a client sends a message, the server echoes it, and the
// client checks every byte and times the round trip. Built on the session
// layer, on any provider.
//   rdmakit-pingpong server [--listen 127.0.0.1:7472]
//   rdmakit-pingpong client SERVER:7472 [--iters 10000] [--size 64]
//   rdmakit-pingpong --loopback          # both ends on this host (forks)
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/session/session.hpp"

using namespace rdmakit;
using namespace rdmakit::session;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string role;
  std::string address = "127.0.0.1:7472";
  std::string provider = "auto";
  std::string thread_mode = "app";
  std::string event_mode = "busy";
  uint32_t iters = 10000;
  uint32_t size = 64;
  uint32_t connect_timeout_ms = 5000;
  uint32_t clients = 0;  // server: exit after this many clients (0 = serve forever)
  bool loopback = false;
};

SessionOptions session_options(const Config& c) {
  SessionOptions o;
  o.provider = parse_provider(c.provider);
  o.thread_mode = parse_thread_mode(c.thread_mode);
  o.event_mode = parse_event_mode(c.event_mode);
  o.max_message = std::max<uint32_t>(c.size, 64);
  o.connect_timeout = std::chrono::milliseconds(c.connect_timeout_ms);
  return o;
}

uint8_t pattern(uint32_t iter, uint32_t i) {
  return static_cast<uint8_t>(iter * 31 + i * 7);
}

int run_server(const Config& c, int port_pipe) {
  std::atomic<uint32_t> finished{0};
  Handlers h;
  h.on_message = [](Channel& ch, Message& m) {
    const OpResult r = ch.send(m.data());  // echo
    if (!r.ok()) std::fprintf(stderr, "server: echo failed: %s\n", r.detail.c_str());
  };
  h.on_connect = [](Endpoint& ep) {
    std::printf("server: %s connected\n", ep.peer().c_str());
  };
  h.on_disconnect = [&](Endpoint& ep, const DisconnectInfo& info) {
    std::printf("server: %s left: %s%s%s\n", ep.peer().c_str(),
                disconnect_reason_name(info.reason), info.detail.empty() ? "" : ": ",
                info.detail.c_str());
    ++finished;
  };
  const SessionOptions o = session_options(c);
  Server server(c.address, o, h);
  server.start();
  std::printf("server: listening on %s (%s, threads %s, events %s)\n",
              server.address().c_str(), server.context().provider_name(),
              thread_mode_name(o.thread_mode), event_mode_name(o.event_mode));
  std::fflush(stdout);
  if (port_pipe >= 0) {
    const uint16_t port = server.port();
    if (::write(port_pipe, &port, sizeof port) != sizeof port) return 1;
    ::close(port_pipe);
  }
  while (c.clients == 0 || finished.load() < c.clients) {
    if (o.thread_mode == ThreadMode::kApplication) {
      server.progress(std::chrono::milliseconds(10));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::fflush(stdout);
  return 0;
}

int run_client(const Config& c) {
  Client client(session_options(c));
  Endpoint& ep = client.connect(c.address);
  Channel& ch = ep.channel();
  std::vector<std::byte> out(c.size);
  std::vector<double> rtt_us;
  rtt_us.reserve(c.iters);
  const uint32_t warmup = std::min<uint32_t>(c.iters / 10, 1000);
  for (uint32_t it = 0; it < warmup + c.iters; ++it) {
    for (uint32_t i = 0; i < c.size; ++i) out[i] = std::byte{pattern(it, i)};
    const auto t0 = Clock::now();
    OpResult r = ch.send(out);
    Message reply;
    if (r.ok()) r = ch.recv(&reply, std::chrono::seconds(5));
    const auto t1 = Clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "client: iteration %u: %s: %s\n", it, errc_name(r.code),
                   r.detail.c_str());
      return 1;
    }
    if (reply.data().size() != c.size ||
        std::memcmp(reply.data().data(), out.data(), c.size) != 0) {
      std::fprintf(stderr, "client: iteration %u: the echo differs from what was sent\n",
                   it);
      return 1;
    }
    if (it >= warmup)
      rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(rtt_us.begin(), rtt_us.end());
  double sum = 0;
  for (double v : rtt_us) sum += v;
  auto pct = [&](double p) {
    return rtt_us[static_cast<size_t>(p * (rtt_us.size() - 1))];
  };
  std::printf(
      "pingpong %s -> %s (%s): %u x %u B, verified; half round trip usec: avg %.2f  min "
      "%.2f  "
      "p50 %.2f  p99 %.2f\n",
      client.context().provider_name(), ep.peer().c_str(), c.thread_mode.c_str(), c.iters,
      c.size, sum / rtt_us.size() / 2, rtt_us.front() / 2, pct(0.5) / 2, pct(0.99) / 2);
  return 0;
}

// Forks a server on an ephemeral port, runs the client against it.
int run_loopback(Config c) {
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  c.address = "127.0.0.1:0";
  c.clients = 1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      _exit(run_server(c, fds[1]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server: %s\n", e.what());
      _exit(1);
    }
  }
  ::close(fds[1]);
  uint16_t port = 0;
  if (::read(fds[0], &port, sizeof port) != sizeof port) {
    std::fprintf(stderr, "loopback: the server did not start\n");
    ::waitpid(pid, nullptr, 0);
    return 1;
  }
  ::close(fds[0]);
  c.address = "127.0.0.1:" + std::to_string(port);
  int rc = 1;
  try {
    rc = run_client(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client: %s\n", e.what());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"rdmakit-pingpong: message ping-pong over an rdmakit session"};
  app.add_option("role", c.role, "server | client")
      ->check(CLI::IsMember({"server", "client"}));
  app.add_option("address", c.address, "client: SERVER:PORT");
  app.add_option("--listen", c.address, "server: HOST:PORT to listen on");
  app.add_option("-p,--provider", c.provider, "shm | tcp | verbs | auto");
  app.add_option("--thread-mode", c.thread_mode, "poller | workers | app");
  app.add_option("--event-mode", c.event_mode, "busy | blocking | epoll");
  app.add_option("-n,--iters", c.iters, "round trips")->check(CLI::Range(1u, 100000000u));
  app.add_option("-s,--size", c.size, "message bytes")->check(CLI::Range(1u, 1u << 24));
  app.add_option("--clients", c.clients, "server: exit after this many clients");
  app.add_option("--connect-timeout", c.connect_timeout_ms,
                 "client: ms to keep retrying a server that is not up yet");
  app.add_flag("--loopback", c.loopback, "run both ends on this host");
  CLI11_PARSE(app, argc, argv);
  try {
    if (c.loopback) return run_loopback(c);
    if (c.role == "server") return run_server(c, -1);
    if (c.role == "client") return run_client(c);
    std::fprintf(stderr, "say server, client or --loopback (see --help)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-pingpong: %s\n", e.what());
    return 1;
  }
}
