// rdmakit-perf: perftest-style benchmarks over any rdmakit provider.
//   rdmakit-perf write_bw                      # server: waits for a client
//   rdmakit-perf write_bw 127.0.0.1            # client: runs and prints
//   rdmakit-perf send_lat --loopback -a        # both ends, two pinned processes
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "fmt/format.h"
#include "perf.hpp"
#include "perf_clock.hpp"

namespace rdmakit::perf {
namespace {

// CPUs this process may use, read once before any pinning narrows the set.
int online_cpus() {
  static const int count = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return CPU_COUNT(&set);
  }();
  return count;
}

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    std::fprintf(stderr, "rdmakit-perf: cannot pin to cpu %d\n", cpu);
  }
}

int run_guarded(const char* role, int (*fn)(const Options&, int), const Options& o,
                int fd) {
  try {
    return fn(o, fd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-perf %s: %s\n", role, e.what());
    return 1;
  }
}

int server_main(const Options& o, int fd) { return run_server(o, fd); }
int client_main(const Options& o, int) { return run_client(o); }

// Forks the server, learns its port through a pipe, runs the client here.
int loopback(Options o) {
  const int cpus = online_cpus();
  if (cpus >= 2) {
    if (o.cpu < 0) o.cpu = 1;
    o.server_cpu = o.cpu == 0 ? 1 : 0;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("rdmakit-perf: pipe");
    return 1;
  }
  Options server = o;
  // Loopback by default; --bind names another local address, e.g. the one of
  // an RDMA device for verbs (127.0.0.1 has none).
  const std::string host = o.bind == "0.0.0.0" ? "127.0.0.1" : o.bind;
  server.bind = host;
  server.accept_timeout_s = 30;
  const bool explicit_port = o.port != 18515;
  if (!explicit_port) server.port = 0;
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("rdmakit-perf: fork");
    return 1;
  }
  if (child == 0) {
    ::close(fds[0]);
    pin(o.server_cpu);
    const int rc = run_guarded("server", server_main, server, fds[1]);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  ::close(fds[1]);
  pin(o.cpu);
  uint16_t port = 0;
  pollfd pfd{fds[0], POLLIN, 0};
  const bool ready =
      ::poll(&pfd, 1, 30000) == 1 && ::read(fds[0], &port, sizeof port) == sizeof port;
  ::close(fds[0]);
  int rc = 1;
  if (ready) {
    o.server = fmt::format("{}:{}", host, port);
    rc = run_guarded("client", client_main, o, -1);
  } else {
    std::fprintf(stderr, "rdmakit-perf: the server did not start\n");
  }
  // Bounded wait for the server; it exits after Quit or its own timeout.
  int status = 0;
  for (int i = 0; i < 400; ++i) {
    if (waitpid(child, &status, WNOHANG) == child) {
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      return rc != 0 ? rc : (ok ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "rdmakit-perf: server did not exit; killing it\n");
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return rc != 0 ? rc : 1;
}

// Command-line values before they are resolved per test.
struct Raw {
  std::string tests = "";
  std::string atomic = "fadd";
  int64_t size = -1;
  bool all_sizes = false;
  int64_t inline_size = -1;
  int64_t cq_mod = -1;
  int64_t post_list = -1;
  int64_t rx_depth = -1;
  int64_t tx_depth = -1;
  uint64_t iterations = 0;
};

// The default run (no test named): a short overview, as in the demo.
constexpr const char* kOverview = "send_lat,write_lat,read_lat,send_bw,write_bw,read_bw";

// Options of one test from the command line; empty string = OK, else why not.
std::string resolve(const Raw& raw, Test test, Options& o) {
  Settings& s = o.settings;
  s.test = test;
  s.atomic_op = (raw.atomic == "cas" || raw.atomic == "CMP_AND_SWAP")
                    ? AtomicOp::kCompareSwap
                    : AtomicOp::kFetchAdd;
  const bool lat = is_latency(test);
  if (lat && (s.num_qps != 1 || s.bidirectional)) {
    return "latency tests use one QP, one direction (no -q, -b)";
  }
  if (test == Test::kWriteLat && s.event)
    return "write_lat polls memory; --event does not apply";
  o.sizes.clear();
  if (is_atomic(test)) {
    o.sizes = {8};
  } else if (raw.all_sizes) {
    for (uint64_t v = 2; v <= (uint64_t{8} << 20); v *= 2) o.sizes.push_back(v);
  } else {
    const int64_t v = raw.size > 0 ? raw.size : (lat ? 2 : 65536);
    if (v > (int64_t{1} << 30)) return "size too large (at most 1 GiB)";
    o.sizes = {static_cast<uint64_t>(v)};
  }
  s.max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  if (o.duration_s > 0) {
    if (raw.iterations) return "-n and -D exclude each other";
    o.iterations = 0;
  } else {
    o.iterations = raw.iterations ? raw.iterations : (lat ? 1000 : 5000);
    if (s.warmup >= o.iterations) return "--warmup must be smaller than -n";
  }
  // perftest-like defaults: deep queues for bandwidth, shallow for latency.
  s.tx_depth = static_cast<uint32_t>(raw.tx_depth > 0 ? raw.tx_depth : (lat ? 16 : 128));
  s.rx_depth = static_cast<uint32_t>(
      raw.rx_depth > 0 ? raw.rx_depth : std::max<uint32_t>(512, 2 * s.tx_depth));
  if (s.rx_depth < 64) s.rx_depth = 64;  // RECVs are replaced 32 at a time
  s.inline_size =
      static_cast<uint32_t>(raw.inline_size >= 0 ? raw.inline_size : (lat ? 64 : 0));
  s.cq_mod = static_cast<uint32_t>(
      raw.cq_mod > 0 ? raw.cq_mod : std::max<uint32_t>(1, s.tx_depth / 2));
  s.cq_mod = std::min(s.cq_mod, s.tx_depth);
  s.post_list = static_cast<uint32_t>(raw.post_list > 0 ? raw.post_list : 16);
  o.progress = isatty(STDOUT_FILENO) && o.sizes.size() > 1;
  return "";
}

std::vector<Test> parse_tests(const std::string& list, std::string* bad) {
  std::vector<Test> tests;
  std::string all;
  for (const auto& n : test_names()) all += (all.empty() ? "" : ",") + n;
  const std::string expanded = list.empty() ? kOverview : (list == "all" ? all : list);
  size_t pos = 0;
  while (pos <= expanded.size()) {
    const size_t comma = std::min(expanded.find(',', pos), expanded.size());
    const std::string name = expanded.substr(pos, comma - pos);
    if (auto t = parse_test(name)) {
      tests.push_back(*t);
    } else {
      *bad = name;
      return {};
    }
    pos = comma + 1;
  }
  return tests;
}

}  // namespace
}  // namespace rdmakit::perf

int main(int argc, char** argv) {
  using namespace rdmakit::perf;
  Options o;
  Settings& s = o.settings;
  Raw raw;

  CLI::App app{"rdmakit-perf: perftest-style RDMA benchmarks over rdmakit providers"};
  app.add_option("test", raw.tests,
                 "Test, comma list or 'all' (default: " + std::string(kOverview) +
                     "). Tests: " + fmt::format("{}", fmt::join(test_names(), ", ")));
  app.add_option("server", o.server, "Server address (client mode); none: run as server");
  app.add_option("-s,--size", raw.size,
                 "Message size in bytes (default 2 for latency, 65536 for bandwidth)");
  app.add_flag("-a,--all", raw.all_sizes, "All sizes 2..8 MiB (powers of two)");
  app.add_option("-n,--iters", raw.iterations,
                 "Iterations per QP (default 1000 latency, 5000 bandwidth)");
  app.add_option("-D,--duration", o.duration_s, "Run each size for this many seconds");
  app.add_option("-w,--warmup", s.warmup,
                 "Bandwidth tests: operations per QP completed before the clock starts "
                 "(included in -n; default 0)");
  app.add_option("-q,--qps", s.num_qps, "Number of data QPs (bandwidth tests)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-t,--tx-depth", raw.tx_depth,
                 "Send queue depth (default 128, latency 16)");
  app.add_option("-r,--rx-depth", raw.rx_depth, "Receive queue depth (default 512)");
  app.add_option("-I,--inline", raw.inline_size,
                 "Inline size (default 64 for latency tests, 0 for bandwidth)");
  app.add_option("-Q,--cq-mod", raw.cq_mod,
                 "Signal one WR in this many (default tx depth / 2)");
  app.add_option("-l,--post-list", raw.post_list, "WRs per post call (default 16)");
  app.add_flag("-b,--bidirectional", s.bidirectional,
               "Both directions (bandwidth tests)");
  app.add_option("-A,--atomic", raw.atomic,
                 "Atomic: fadd (FETCH_ADD) or cas (CMP_AND_SWAP)")
      ->check(CLI::IsMember({"fadd", "cas", "FETCH_AND_ADD", "CMP_AND_SWAP"}));
  app.add_flag("-e,--event", s.event,
               "Sleep on completion events instead of busy polling");
  app.add_flag("--busy-target", s.busy_target,
               "The target of WRITE/READ/atomic tests busy-polls instead of sleeping "
               "(as ucx_perftest's server does)");
  app.add_option("--provider", o.provider, "auto, shm, tcp or verbs");
  app.add_option("-d,--device", o.device, "verbs device");
  app.add_option("-p,--port", o.port, "TCP port / shm name (default 18515)");
  app.add_option(
      "--bind", o.bind,
      "Server listen address (default 127.0.0.1; an RDMA interface's address, or "
      "0.0.0.0, serves other hosts)");
  app.add_option("--cpu", o.cpu, "Pin this process to a CPU (loopback: the client)");
  app.add_flag("--loopback", o.loopback, "Run server and client here, on two cores");
  app.add_flag("--json", o.json, "One JSON object per line per (test, size)");
  app.add_flag("--csv", o.csv, "CSV output");
  app.add_option("--timeout", o.timeout_s,
                 "Fail after this many seconds without progress");
  app.add_option("--accept-timeout", o.accept_timeout_s,
                 "Server: wait this long for a client");
  CLI11_PARSE(app, argc, argv);

  // CLI11 fills positionals in order: "rdmakit-perf 10.0.0.1" means a
  // client of the default tests, not a test named 10.0.0.1.
  std::string bad;
  std::vector<Test> tests = parse_tests(raw.tests, &bad);
  if (tests.empty() && o.server.empty() && !raw.tests.empty() &&
      (raw.tests.find('.') != std::string::npos ||
       raw.tests.find(':') != std::string::npos)) {
    o.server = raw.tests;
    raw.tests.clear();
    tests = parse_tests(raw.tests, &bad);
  }
  if (tests.empty()) {
    std::fprintf(stderr, "rdmakit-perf: unknown test '%s' (tests: %s, or all)\n",
                 bad.c_str(), fmt::format("{}", fmt::join(test_names(), ", ")).c_str());
    return 1;
  }
  if (o.json && o.csv) {
    std::fprintf(stderr, "rdmakit-perf: choose --json or --csv\n");
    return 1;
  }
  if (o.loopback && !o.server.empty()) {
    std::fprintf(stderr, "rdmakit-perf: --loopback takes no server address\n");
    return 1;
  }
  std::vector<Options> runs;
  for (Test t : tests) {
    Options one = o;
    if (std::string why = resolve(raw, t, one); !why.empty()) {
      std::fprintf(stderr, "rdmakit-perf %s: %s\n", test_name(t), why.c_str());
      return 1;
    }
    runs.push_back(one);
  }
  Clock::init();
  online_cpus();
  int rc = 0;
  if (o.loopback) {
    for (const Options& one : runs) rc = std::max(rc, loopback(one));
    return rc;
  }
  pin(o.cpu);
  if (o.server.empty()) {
    // One client per test named here; the client's hello decides the test.
    for (const Options& one : runs)
      rc = std::max(rc, run_guarded("server", server_main, one, -1));
    return rc;
  }
  for (Options& one : runs) {
    if (one.server.find(':') == std::string::npos)
      one.server += fmt::format(":{}", one.port);
    rc = std::max(rc, run_guarded("client", client_main, one, -1));
  }
  return rc;
}
