#include "bench.hpp"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "client.hpp"
#include "fmt/format.h"
#include "server.hpp"

namespace rdmakit::kv {
namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// The clock of rdmakit-perf's read_lat, for the like-for-like comparison with
// it: rdtsc (about 10 ns here; CLOCK_MONOTONIC through the vDSO costs about
// 24 ns), converted with a rate calibrated once against CLOCK_MONOTONIC.
// Elsewhere than x86-64, CLOCK_MONOTONIC itself.
struct TscClock {
  double ns_per_tick = 1.0;
  bool tsc = false;

  static uint64_t ticks() noexcept {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return now_ns();
#endif
  }
  void calibrate() {
#if defined(__x86_64__)
    const uint64_t n0 = now_ns();
    const uint64_t t0 = ticks();
    while (now_ns() - n0 < 20000000) {
    }
    const uint64_t n1 = now_ns();
    const uint64_t t1 = ticks();
    if (t1 > t0) {
      ns_per_tick = double(n1 - n0) / double(t1 - t0);
      tsc = true;
    }
#endif
  }
};

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    std::fprintf(stderr, "rdmakit-kv bench: cannot pin to cpu %d (not pinned)\n", cpu);
}

// CPU time (ns) of every thread of a process, from the scheduler's accounting.
uint64_t process_cpu_ns(pid_t pid) {
  uint64_t total = 0;
  const std::string dir = fmt::format("/proc/{}/task", pid);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(dir + "/" + e->d_name + "/schedstat");
    uint64_t ns = 0;
    if (f >> ns) total += ns;
  }
  closedir(d);
  return total;
}

std::string key_of(uint64_t i) { return std::to_string(i); }

std::string value_of(uint64_t key, uint32_t size) {
  std::string v = fmt::format("{}:", key);
  v.resize(std::max<size_t>(size, v.size()), 'v');
  return v;
}

struct Phase {
  const char* name = "";
  std::vector<uint64_t> lat_ns{};
  uint64_t wall_ns = 0;
  uint64_t server_cpu_ns = 0;
  uint64_t wrong = 0;
};

nlohmann::json summarize(Phase& p, uint64_t ops, std::ostream& out) {
  std::sort(p.lat_ns.begin(), p.lat_ns.end());
  auto pct = [&](double q) {
    if (p.lat_ns.empty()) return 0.0;
    const size_t i = std::min(p.lat_ns.size() - 1, size_t(q * double(p.lat_ns.size())));
    return double(p.lat_ns[i]) / 1000.0;
  };
  // The mean of the samples up to p99: finer than a percentile when the
  // clock ticks in steps as long as a shm READ-GET's differences.
  const size_t body = p.lat_ns.size() - p.lat_ns.size() / 100;
  double body_sum = 0;
  for (size_t i = 0; i < body; ++i) body_sum += double(p.lat_ns[i]);
  const double mean_to_p99 = body == 0 ? 0 : body_sum / double(body) / 1000.0;
  const double ops_s = p.wall_ns == 0 ? 0 : double(ops) * 1e9 / double(p.wall_ns);
  const double cpu_share =
      p.wall_ns == 0 ? 0 : double(p.server_cpu_ns) / double(p.wall_ns);
  // The server's CPU time per operation: all of its threads (the tcp
  // provider's progress thread that answers READs included), spinning too.
  const double cpu_us_per_op =
      ops == 0 ? 0 : double(p.server_cpu_ns) / 1000.0 / double(ops);
  out << fmt::format(
      "{:<12} {:>12.0f} {:>9.3f} {:>9.3f} {:>9.3f} {:>14.2f} {:>12.2f} {:>6}\n", p.name,
      ops_s, pct(0.5), pct(0.99), pct(0.999), cpu_share, cpu_us_per_op, p.wrong);
  return {{"phase", p.name},
          {"ops", ops},
          {"ops_per_s", ops_s},
          {"p25_us", pct(0.25)},
          {"p50_us", pct(0.5)},
          {"p75_us", pct(0.75)},
          {"mean_to_p99_us", mean_to_p99},
          {"p99_us", pct(0.99)},
          {"p999_us", pct(0.999)},
          {"server_cpu_s", double(p.server_cpu_ns) / 1e9},
          {"server_cpu_share", cpu_share},
          {"server_cpu_us_per_op", cpu_us_per_op},
          {"wrong", p.wrong}};
}

struct Floors {
  double timer_ns = 0;  // one timing of an operation: two CLOCK_MONOTONIC reads
  double check_ns = 0;  // what a READ-GET does with its copy: hash, verify, copy out
  double hash_ns = 0;   // of that, hashing the key
};

// The costs a READ-GET adds to its READ, measured in this run on warm data:
// the gap between get_read and read_raw cannot be below check_ns.
Floors measure_floors(Client& c, uint64_t keys) {
  Floors f;
  constexpr int kReps = 20000;
  uint64_t sink = 0;
  uint64_t t0 = now_ns();
  for (int i = 0; i < kReps; ++i) sink += now_ns();
  f.timer_ns = double(now_ns() - t0) / kReps;
  // Keys in turn, as the GET phases take them (branches see varying key
  // lengths and hit slots), with their snapshots in L1 as a READ leaves them.
  constexpr size_t kKeys = 32;
  std::vector<std::string> ks;
  std::vector<std::vector<std::byte>> copies;
  for (size_t i = 0; i < kKeys; ++i) {
    ks.push_back(key_of(i * keys / kKeys));
    c.read_raw(ks.back());
    copies.emplace_back(c.read_buffer().begin(), c.read_buffer().end());
  }
  t0 = now_ns();
  for (int i = 0; i < kReps; ++i) sink += key_hash(ks[size_t(i) % kKeys]);
  f.hash_ns = double(now_ns() - t0) / kReps;
  std::string value;
  t0 = now_ns();
  for (int i = 0; i < kReps; ++i) {
    const std::string& key = ks[size_t(i) % kKeys];
    sink += uint64_t(
        probe_neighborhood(copies[size_t(i) % kKeys], key, key_hash(key), &value).probe);
  }
  f.check_ns = double(now_ns() - t0) / kReps;
  if (sink == 1) std::fputc(' ', stderr);  // keeps the loops
  return f;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::fflush(stdout);
  const pid_t server_pid = fork();
  if (server_pid < 0) return 1;
  if (server_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
    pin(o.server_cpu);
    int rc = 0;
    try {
      ServerOptions so;
      so.address = "127.0.0.1:0";
      so.provider = o.provider;
      so.quiet = true;
      so.table.capacity = o.keys;
      so.busy_poll = o.server_busy_poll;
      Server server(so);
      const uint16_t port = server.port();
      if (write(fds[1], &port, sizeof port) != sizeof port) _exit(1);
      static std::atomic<bool> stop{false};
      signal(SIGTERM, [](int) { stop = true; });
      server.run(stop);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdmakit-kv bench server: %s\n", e.what());
      rc = 1;
    }
    _exit(rc);
  }
  close(fds[1]);
  uint16_t port = 0;
  const bool got_port = read(fds[0], &port, sizeof port) == sizeof port;
  close(fds[0]);
  pid_t hog_pid = -1;
  if (got_port && o.server_busy) {
    hog_pid = fork();
    if (hog_pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a hog left behind would eat a core
      pin(o.server_cpu);
      volatile uint64_t spin = 0;
      for (;;) spin = spin + 1;
    }
  }
  pin(o.client_cpu);

  int rc = 0;
  // read_raw: the first READ of each READ-GET alone (same bytes, QP, wait and
  // clock), the baseline the READ-GET's latency is compared with. The *_tsc
  // phases repeat get_read and read_raw timed as rdmakit-perf read_lat times
  // (rdtsc), for the comparison with it; the lab's figures are the others.
  std::vector<Phase> phases(6);
  phases[0].name = "put";
  phases[1].name = "get_rpc";
  phases[2].name = "get_read";
  phases[3].name = "read_raw";
  phases[4].name = "get_read_tsc";
  phases[5].name = "read_raw_tsc";
  TscClock tsc;
  tsc.calibrate();
  Floors floors;
  std::string provider = "?";
  try {
    if (!got_port) throw std::runtime_error("the server did not start");
    const int threads = std::max(1, o.threads);
    std::vector<std::vector<uint64_t>> lat(threads);
    std::vector<uint64_t> wrong(threads);
    std::vector<uint64_t> retries(threads);
    std::vector<ReadStats> get_reads(threads);  // during the get_read phase
    std::vector<std::string> errors(threads);
    std::atomic<bool> failed{false};
    // Start and end of each phase; the main thread reads the clock and the
    // server's CPU time between them.
    std::barrier sync(threads + 1);
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        // A client is single-owner: it is created, used and destroyed here.
        std::unique_ptr<Client> c;
        try {
          ClientOptions co;
          co.address = fmt::format("127.0.0.1:{}", port);
          co.provider = o.provider;
          co.timeout = std::chrono::seconds(10);
          c = std::make_unique<Client>(co);
          if (t == 0) {
            provider = c->provider_name();
            // Every key exists before the GET phases, whatever N and K are.
            for (uint64_t k = 0; k < o.keys; ++k)
              c->put(key_of(k), value_of(k, o.value_size));
            floors = measure_floors(*c, o.keys);
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
          failed = true;
        }
        sync.arrive_and_wait();  // clients ready
        std::string value;
        for (size_t ph = 0; ph < phases.size(); ++ph) {
          const uint64_t share =
              o.ops / threads + (uint64_t(t) < o.ops % threads ? 1 : 0);
          lat[t].clear();
          lat[t].reserve(share);
          wrong[t] = 0;
          sync.arrive_and_wait();  // phase start
          const ReadStats before = c ? c->read_stats() : ReadStats{};
          try {
            for (uint64_t i = 0; i < share && !failed; ++i) {
              const uint64_t k = (i * threads + t) % o.keys;
              const std::string key = key_of(k);
              const bool by_tsc = ph >= 4;
              const bool raw = ph == 3 || ph == 5;
              const uint64_t t0 = by_tsc ? TscClock::ticks() : now_ns();
              KvStatus s;
              if (ph == 0) {
                s = c->put(key, value_of(k, o.value_size));
              } else if (raw) {
                c->read_raw(key);
                s = KvStatus::kOk;
              } else {
                s = c->get(key, &value, ph == 1 ? GetMode::kRpc : GetMode::kRead);
              }
              lat[t].push_back(
                  by_tsc ? uint64_t(double(TscClock::ticks() - t0) * tsc.ns_per_tick)
                         : now_ns() - t0);
              if (s != KvStatus::kOk ||
                  ((ph == 1 || ph == 2 || ph == 4) && value != value_of(k, o.value_size)))
                ++wrong[t];
            }
          } catch (const std::exception& e) {
            if (errors[t].empty()) errors[t] = e.what();
            failed = true;
          }
          if (ph == 2 && c) {
            get_reads[t].reads = c->read_stats().reads - before.reads;
            get_reads[t].bytes = c->read_stats().bytes - before.bytes;
          }
          sync.arrive_and_wait();  // phase end
          sync.arrive_and_wait();  // results collected
        }
        if (c) retries[t] = c->read_stats().retries;
      });
    }
    sync.arrive_and_wait();
    for (Phase& p : phases) {
      sync.arrive_and_wait();
      const uint64_t cpu0 = process_cpu_ns(server_pid);
      const uint64_t t0 = now_ns();
      sync.arrive_and_wait();
      p.wall_ns = now_ns() - t0;
      p.server_cpu_ns = process_cpu_ns(server_pid) - cpu0;
      for (int t = 0; t < threads; ++t) {
        p.lat_ns.insert(p.lat_ns.end(), lat[t].begin(), lat[t].end());
        p.wrong += wrong[t];
      }
      sync.arrive_and_wait();
    }
    for (auto& w : workers) w.join();
    for (int t = 0; t < threads; ++t)
      if (!errors[t].empty()) throw std::runtime_error(errors[t]);
    uint64_t read_retries = 0;
    for (uint64_t r : retries) read_retries += r;
    ReadStats gr;
    for (const ReadStats& r : get_reads) {
      gr.reads += r.reads;
      gr.bytes += r.bytes;
    }

    std::cout << fmt::format(
        "rdmakit-kv bench: provider {}, {} ops per phase, {} keys, {} B values, {} "
        "client "
        "threads (cpu {}), server cpu {}{}\n",
        provider, o.ops, o.keys, o.value_size, threads, o.client_cpu, o.server_cpu,
        o.server_busy ? ", server core BUSY (CPU hog)" : "");
    std::cout << fmt::format("{:<12} {:>12} {:>9} {:>9} {:>9} {:>14} {:>12} {:>6}\n",
                             "phase", "ops/s", "p50 us", "p99 us", "p99.9 us",
                             "server cpu/s", "srv us/op", "wrong");
    nlohmann::json j = {{"tool", "rdmakit-kv bench"},
                        {"provider", provider},
                        {"ops", o.ops},
                        {"keys", o.keys},
                        {"value_size", o.value_size},
                        {"threads", threads},
                        {"server_busy", o.server_busy},
                        {"read_retries", read_retries},
                        {"server_busy_poll", o.server_busy_poll},
                        {"get_read_reads_per_get",
                         double(gr.reads) / double(std::max<uint64_t>(o.ops, 1))},
                        {"get_read_bytes_per_get",
                         double(gr.bytes) / double(std::max<uint64_t>(o.ops, 1))},
                        {"floor_timer_ns", floors.timer_ns},
                        {"tsc_timer", tsc.tsc},
                        {"floor_check_ns", floors.check_ns},
                        {"floor_hash_ns", floors.hash_ns}};
    for (auto& p : phases) {
      j["phases"].push_back(summarize(p, o.ops, std::cout));
      if (p.wrong != 0) rc = 1;
    }
    const double rpc = j["phases"][1]["ops_per_s"];
    const double rd = j["phases"][2]["ops_per_s"];
    j["read_over_rpc"] = rpc > 0 ? rd / rpc : 0.0;
    const double get_p50 = j["phases"][2]["p50_us"];
    const double raw_p50 = j["phases"][3]["p50_us"];
    j["get_read_over_read_raw_p50"] = raw_p50 > 0 ? get_p50 / raw_p50 : 0.0;
    const double get_tsc_p50 = j["phases"][4]["p50_us"];
    const double raw_tsc_p50 = j["phases"][5]["p50_us"];
    j["get_read_tsc_over_read_raw_tsc_p50"] =
        raw_tsc_p50 > 0 ? get_tsc_p50 / raw_tsc_p50 : 0.0;
    std::cout << fmt::format("READ GET / RPC GET ops/s: {:.2f}x\n",
                             rpc > 0 ? rd / rpc : 0.0);
    std::cout << fmt::format(
        "READ GET p50 / its bare READ p50: {:.2f}x ({:.2f} READs, {:.0f} B per GET; "
        "floors: timer {:.0f} ns, hash and checks of a snapshot {:.0f} ns, of which the "
        "hash {:.0f} ns)\n",
        raw_p50 > 0 ? get_p50 / raw_p50 : 0.0, double(gr.reads) / double(o.ops),
        double(gr.bytes) / double(o.ops), floors.timer_ns, floors.check_ns,
        floors.hash_ns);
    std::cout << fmt::format(
        "timed as read_lat times ({}): READ GET p50 {:.3f} us, its bare READ {:.3f} us\n",
        tsc.tsc ? "rdtsc" : "CLOCK_MONOTONIC, no TSC here", get_tsc_p50, raw_tsc_p50);
    if (o.json == "-") {
      std::cout << j.dump() << '\n';
    } else if (!o.json.empty()) {
      std::ofstream(o.json) << j.dump(2) << '\n';
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-kv bench: %s\n", e.what());
    rc = 1;
  }
  if (hog_pid > 0) {
    kill(hog_pid, SIGKILL);
    waitpid(hog_pid, nullptr, 0);
  }
  kill(server_pid, SIGTERM);
  int status = 0;
  waitpid(server_pid, &status, 0);
  return rc;
}

}  // namespace rdmakit::kv
