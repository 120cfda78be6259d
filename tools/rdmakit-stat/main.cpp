// rdmakit-stat: every live connection the preload library decided about on
// this host (docs/stat.md), like ss(8) for rdmakit: program, pid, ends,
// path (shm / verbs / tcp, or kernel with the fallback reason), bytes and
// messages each way, ring use, age; per process, upgrades and fallbacks by
// reason. It reads the files the preloaded processes publish and never
// touches the processes themselves.
#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "preload/stat_format.hpp"
#include "stat_reader.hpp"

namespace st = rdmakit::stat_tool;
using nlohmann::json;

namespace {

std::string user_name(uid_t uid) {
  const passwd* pw = getpwuid(uid);
  return pw != nullptr ? pw->pw_name : std::to_string(uid);
}

std::string human(uint64_t n) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));  // NOLINT
  } else {
    std::snprintf(buf, sizeof buf, v < 10 ? "%.1f%s" : "%.0f%s", v, units[u]);
  }
  return buf;
}

std::string age(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60,
                  static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) / 60 % 60);
  }
  return buf;
}

json to_json(const st::Snapshot& snap, bool closed) {
  json procs = json::array();
  for (const auto& p : snap.processes) {
    json conns = json::array();
    for (const auto& c : p.connections) {
      if (c.state == "closed" && !closed) continue;
      json j = {{"fd", c.fd},
                {"side", c.side},
                {"path", c.path},
                {"state", c.state},
                {"local", c.local},
                {"peer", c.peer},
                {"age_s", std::round(c.age_s * 1000) / 1000}};
      if (c.path == "kernel") j["reason"] = c.reason;
      if (c.counted) {
        j["tx_bytes"] = c.tx_bytes;
        j["tx_msgs"] = c.tx_msgs;
        j["rx_bytes"] = c.rx_bytes;
        j["rx_msgs"] = c.rx_msgs;
        j["ring_bytes"] = c.ring_bytes;
        j["rx_peak_bytes"] = c.rx_peak;
      } else {
        for (const char* k : {"tx_bytes", "tx_msgs", "rx_bytes", "rx_msgs"})
          j[k] = nullptr;
      }
      conns.push_back(std::move(j));
    }
    json reasons = json::array();
    for (const auto& r : p.reasons)
      reasons.push_back({{"reason", r.text}, {"count", r.count}});
    procs.push_back(
        {{"pid", p.pid},
         {"program", p.program},
         {"uid", p.uid},
         {"user", user_name(p.uid)},
         {"upgrades", {{"shm", p.upgrades_shm}, {"remote", p.upgrades_remote}}},
         {"fallbacks", p.fallbacks},
         {"fallback_reasons", reasons},
         {"fallback_reasons_other", p.reasons_other},
         {"unlisted", p.unlisted},
         {"totals",
          {{"tx_bytes", p.tx_bytes},
           {"rx_bytes", p.rx_bytes},
           {"tx_msgs", p.tx_msgs},
           {"rx_msgs", p.rx_msgs}}},
         {"connections", std::move(conns)}});
  }
  json skipped = json::array();
  for (const auto& s : snap.skipped)
    skipped.push_back({{"file", s.file}, {"why", s.why}});
  return {{"time", static_cast<double>(std::time(nullptr))},
          {"processes", std::move(procs)},
          {"skipped", std::move(skipped)},
          {"removed_stale", snap.removed}};
}

void print_table(const st::Snapshot& snap, bool closed, bool processes) {
  std::printf("%-15s %7s %5s %-7s %-6s %-22s %-22s %9s %9s %9s %9s %11s %8s  %s\n",
              "PROGRAM", "PID", "FD", "SIDE", "PATH", "LOCAL", "PEER", "TX-BYTES",
              "TX-MSGS", "RX-BYTES", "RX-MSGS", "RING", "AGE", "REASON");
  for (const auto& p : snap.processes) {
    for (const auto& c : p.connections) {
      if (c.state == "closed" && !closed) continue;
      const std::string dash = "-";
      const std::string path = c.state == "closed" ? c.path + "*" : c.path;
      const std::string ring =
          c.counted ? human(c.rx_peak) + "/" + human(c.ring_bytes) : dash;
      std::printf("%-15.15s %7d %5d %-7s %-6s %-22s %-22s %9s %9s %9s %9s %11s %8s  %s\n",
                  p.program.c_str(), static_cast<int>(p.pid), c.fd, c.side.c_str(),
                  path.c_str(), c.local.c_str(), c.peer.c_str(),
                  c.counted ? human(c.tx_bytes).c_str() : "-",
                  c.counted ? std::to_string(c.tx_msgs).c_str() : "-",
                  c.counted ? human(c.rx_bytes).c_str() : "-",
                  c.counted ? std::to_string(c.rx_msgs).c_str() : "-", ring.c_str(),
                  age(c.age_s).c_str(), c.path == "kernel" ? c.reason.c_str() : "");
    }
  }
  if (!processes) return;
  std::printf("\n%-15s %7s %-10s %8s %8s %9s %9s %9s  %s\n", "PROGRAM", "PID", "USER",
              "SHM", "REMOTE", "FALLBACK", "TX-BYTES", "RX-BYTES", "FALLBACK REASONS");
  for (const auto& p : snap.processes) {
    std::string reasons;
    for (const auto& r : p.reasons) {
      if (!reasons.empty()) reasons += "; ";
      reasons += std::to_string(r.count) + "x " + r.text;
    }
    if (p.reasons_other > 0)
      reasons += "; " + std::to_string(p.reasons_other) + "x other";
    std::printf("%-15.15s %7d %-10.10s %8llu %8llu %9llu %9s %9s  %s\n",
                p.program.c_str(), static_cast<int>(p.pid), user_name(p.uid).c_str(),
                static_cast<unsigned long long>(p.upgrades_shm),     // NOLINT
                static_cast<unsigned long long>(p.upgrades_remote),  // NOLINT
                static_cast<unsigned long long>(p.fallbacks),        // NOLINT
                human(p.tx_bytes).c_str(), human(p.rx_bytes).c_str(), reasons.c_str());
    if (p.unlisted > 0) {
      std::printf("  (%llu connections not listed: all %u slots were in use)\n",
                  static_cast<unsigned long long>(p.unlisted),  // NOLINT
                  rdmakit::preload::stats::kSlotCount);
    }
  }
  for (const auto& s : snap.skipped) {
    std::fprintf(stderr, "rdmakit-stat: skipped %s: %s\n", s.file.c_str(), s.why.c_str());
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "rdmakit-stat: the connections the rdmakit preload library (rdmakit-run) decided "
      "about on this host: path (shm, verbs, tcp, or kernel with the fallback reason), "
      "bytes and messages each way, ring use and age, and per process the upgrades and "
      "fallbacks by reason. Reads the statistics files preloaded processes publish "
      "(/dev/shm/rdmakit-stat-UID-PID, mode 0600: a user sees their own processes, root "
      "sees all). See docs/stat.md."};
  bool as_json = false;
  bool closed = false;
  bool no_processes = false;
  bool no_clean = false;
  double watch = 0;
  int64_t count = 0;
  std::vector<int> pids;
  std::string dir = rdmakit::preload::stats::kDefaultDir;
  if (const char* d = std::getenv("RDMAKIT_PRELOAD_STAT_DIR");
      d != nullptr && *d != '\0') {
    dir = d;
  }
  app.add_flag("-j,--json", as_json,
               "print JSON (one document per sample, on one line) instead of the table");
  auto* watch_opt =
      app.add_option(
             "-w,--watch", watch,
             "print a sample every SECONDS (default 1) until interrupted or --count")
          ->expected(0, 1)
          ->type_name("[SECONDS]");
  app.add_option("-c,--count", count,
                 "number of samples to print (default: 1, or unbounded with --watch)")
      ->check(CLI::PositiveNumber);
  app.add_option("-p,--pid", pids, "only these processes (repeatable)");
  app.add_flag(
      "-a,--closed", closed,
      "also list closed connections whose slots are not reused yet (path marked *)");
  app.add_flag("--no-processes", no_processes,
               "table: leave out the per-process summary");
  app.add_flag("--no-clean", no_clean,
               "do not remove the caller's statistics files of processes that are gone");
  app.add_option("--dir", dir,
                 "directory of the statistics files (default /dev/shm, or "
                 "RDMAKIT_PRELOAD_STAT_DIR)");
  app.set_version_flag("--version", "rdmakit-stat 0.1.0");
  CLI11_PARSE(app, argc, argv);

  const bool watching = watch_opt->count() > 0;
  if (watching && watch <= 0) watch = 1;
  if (count == 0) count = watching ? -1 : 1;
  st::ScanOptions opts;
  opts.dir = dir;
  opts.clean = !no_clean;
  for (int p : pids) opts.pids.push_back(p);
  for (int64_t i = 0; count < 0 || i < count; ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(watch > 0 ? watch : 1));
    }
    const st::Snapshot snap = st::scan(opts);
    if (as_json) {
      std::printf("%s\n", to_json(snap, closed).dump().c_str());
    } else {
      if (watching) {
        const std::time_t t = std::time(nullptr);
        char when[32];
        std::strftime(when, sizeof when, "%F %T", std::localtime(&t));
        std::printf("%s%s\n", i > 0 ? "\n" : "", when);
      }
      print_table(snap, closed, !no_processes);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-stat: %s\n", e.what());
    return 1;
  }
}
