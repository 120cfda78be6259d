// rdmakit-mesh: N processes, each pair connected once by a session; for a
// duration every rank WRITEs into each peer's named buffer and pings it with
// messages. Rank 0 reports the N x N bandwidth matrix, per-pair latency and
// connection-setup time as a table, JSON, CSV and (with python3-matplotlib) a
// heat-map PNG. A rank that dies is reported by the others, who finish.
//   rdmakit-mesh --rank R --size N --root HOST:PORT     (standalone)
//   mpirun -n N rdmakit-mesh                              (PMIx from the launcher)
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.hpp"
#include "rdmakit/session/session.hpp"

using namespace rdmakit;
using namespace rdmakit::session;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

struct Config {
  int rank = -1;
  int size = 0;
  std::string root;
  std::string provider = "auto";
  std::string host = "127.0.0.1";
  double duration_s = 2.0;
  uint32_t chunk = 64 * 1024;
  uint32_t window = 4;
  std::string out;  // PREFIX for PREFIX.json/.csv/.png (rank 0)
  int kill_rank = -1;
  double kill_after_s = 0.5;
};

// The mesh's own messages (fixed layout, first byte = kind).
enum Kind : uint8_t { kHello = 1, kPing, kPong };
struct Wire {
  uint8_t kind;
  uint8_t pad[3];
  int32_t from;
  int64_t t0_ns;
};

struct Peer {
  std::shared_ptr<Endpoint> ep;
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> outstanding{0};
  std::atomic<bool> ping_out{false};
  std::atomic<uint64_t> lat_sum_ns{0};
  std::atomic<uint64_t> lat_count{0};
  std::atomic<bool> lost{false};
  std::atomic<bool> reported{false};
  std::mutex mu;
  std::string lost_reason;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

class Mesh {
 public:
  explicit Mesh(const Config& c, mesh::Bootstrap& boot)
      : c_(c), boot_(boot), rank_(boot.rank()), size_(boot.size()), peers_(size_) {
    for (auto& p : peers_) p = std::make_unique<Peer>();
  }

  int run() {
    SessionOptions so;
    so.provider = parse_provider(c_.provider);
    so.thread_mode = ThreadMode::kSharedWorkers;
    so.workers = 2;
    so.max_message = 256;
    so.recv_depth = 32;
    Handlers h = handlers();
    server_ = std::make_unique<Server>(c_.host + ":0", so, h);
    server_->expose("mesh", size_t{c_.chunk} * static_cast<size_t>(size_));
    server_->start();
    const auto addresses = boot_.allgather(server_->address());
    const auto t_setup = Clock::now();
    // Each pair once: rank i connects to every lower rank.
    SessionOptions co = so;
    co.thread_mode = ThreadMode::kPollerPerEndpoint;
    co.event_mode = EventMode::kBlocking;
    co.connect_timeout = milliseconds(20000);
    for (int j = 0; j < rank_; ++j) {
      if (!addresses[j])
        throw std::runtime_error("rank " + std::to_string(j) + " is gone");
      clients_.push_back(std::make_unique<Client>(co, h));
      // Lower ranks WRITE into us through this endpoint: expose here too.
      clients_.back()->expose("mesh", size_t{c_.chunk} * static_cast<size_t>(size_));
      Endpoint& ep = clients_.back()->connect(*addresses[j]);
      ep.user_data = reinterpret_cast<void*>(static_cast<intptr_t>(j + 1));
      peers_[j]->ep = ep.shared_from_this();
      const Wire hello{kHello, {}, rank_, 0};
      send_wire(ep.channel(), hello);
    }
    // Wait for the higher ranks to connect and say who they are.
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (connected_higher() < size_ - 1 - rank_) {
      if (Clock::now() > deadline)
        throw std::runtime_error("higher ranks did not connect");
      std::this_thread::sleep_for(milliseconds(1));
    }
    const double setup_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();
    boot_.allgather("ready");
    traffic();
    return report(setup_ms);
  }

 private:
  Handlers handlers() {
    Handlers h;
    h.on_message = [this](Channel& ch, Message& m) {
      if (m.data().size() != sizeof(Wire)) return;
      Wire w;
      std::memcpy(&w, m.data().data(), sizeof w);
      if (w.from < 0 || w.from >= size_) return;
      Peer& p = *peers_[w.from];
      if (w.kind == kHello) {
        ch.endpoint().user_data =
            reinterpret_cast<void*>(static_cast<intptr_t>(w.from + 1));
        std::lock_guard lock(mu_);
        p.ep = ch.endpoint().shared_from_this();
        ++higher_;
      } else if (w.kind == kPing) {
        Wire pong{kPong, {}, rank_, w.t0_ns};
        send_wire(ch, pong);
      } else if (w.kind == kPong) {
        p.lat_sum_ns += static_cast<uint64_t>(now_ns() - w.t0_ns);
        ++p.lat_count;
        p.ping_out = false;
      }
    };
    h.on_disconnect = [this](Endpoint& ep, const DisconnectInfo& info) {
      const auto tag = reinterpret_cast<intptr_t>(ep.user_data);
      // A peer that closed cleanly (goodbye) has finished, possibly while
      // this rank is still in the last allgather: not a loss.
      if (tag <= 0 || finishing_.load() || info.reason == DisconnectReason::kPeerClosed) {
        return;
      }
      Peer& p = *peers_[static_cast<size_t>(tag - 1)];
      std::lock_guard lock(p.mu);
      p.lost = true;
      p.lost_reason =
          std::string(disconnect_reason_name(info.reason)) + ": " + info.detail;
      std::fprintf(stderr, "rank %d: lost rank %ld (%s)\n", rank_,
                   static_cast<long>(tag - 1), p.lost_reason.c_str());
    };
    return h;
  }

  static void send_wire(Channel& ch, const Wire& w) {
    (void)ch.send(std::as_bytes(std::span(&w, 1)));
  }

  int connected_higher() {
    std::lock_guard lock(mu_);
    return higher_;
  }

  void traffic() {
    // A WRITE's source must be registered in the context of the endpoint's
    // session: the server's for higher ranks, each client's for lower ones.
    std::vector<std::unique_ptr<MemoryRegion>> src(static_cast<size_t>(size_));
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      Context& ctx =
          j < rank_ ? clients_[static_cast<size_t>(j)]->context() : server_->context();
      src[j] = ctx.allocate(c_.chunk, kAccessLocalWrite);
      std::memset(src[j]->data(), rank_ + 1, c_.chunk);
    }
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(c_.duration_s);
    traffic_start_ = start;
    while (Clock::now() < end) {
      if (rank_ == c_.kill_rank &&
          Clock::now() - start > std::chrono::duration<double>(c_.kill_after_s)) {
        std::fprintf(stderr, "rank %d: killing myself as asked (--kill-rank)\n", rank_);
        std::fflush(nullptr);
        ::raise(SIGKILL);
      }
      bool idle = true;
      for (int j = 0; j < size_; ++j) {
        Peer& p = *peers_[j];
        if (j == rank_ || !p.ep || p.lost.load() || p.ep->closed()) continue;
        Channel& ch = p.ep->channel();
        while (p.outstanding.load() < static_cast<int>(c_.window)) {
          ++p.outstanding;
          const OpResult r =
              ch.write("mesh", size_t{c_.chunk} * static_cast<size_t>(rank_),
                       Local::of(*src[j]), c_.chunk, [&p, this](const OpResult& res) {
                         if (res.ok()) p.bytes += c_.chunk;
                         --p.outstanding;
                       });
          if (!r.ok()) {
            --p.outstanding;
            if (r.code != Errc::kClosed && !p.reported.exchange(true)) {
              std::fprintf(stderr, "rank %d: WRITE to rank %d: %s\n", rank_, j,
                           r.detail.c_str());
            }
            break;
          }
          idle = false;
        }
        if (!p.ping_out.exchange(true)) {
          const Wire ping{kPing, {}, rank_, now_ns()};
          send_wire(ch, ping);
        }
      }
      if (idle) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    elapsed_s_ = std::chrono::duration<double>(Clock::now() - start).count();
    const auto drain = Clock::now() + std::chrono::seconds(5);
    for (auto& p : peers_) {
      while (p->outstanding.load() > 0 && Clock::now() < drain) {
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
  }

  // Row: "setup_ms;bw0,lat0,state0;bw1,lat1,state1;..." (MB/s, usec, ok|lost|self).
  int report(double setup_ms) {
    std::ostringstream row;
    row << setup_ms;
    for (int j = 0; j < size_; ++j) {
      Peer& p = *peers_[j];
      const double mbs = static_cast<double>(p.bytes.load()) / elapsed_s_ / 1e6;
      const double lat = p.lat_count.load()
                             ? static_cast<double>(p.lat_sum_ns.load()) /
                                   static_cast<double>(p.lat_count.load()) / 2e3
                             : 0.0;
      row << ";" << mbs << "," << lat << ","
          << (j == rank_ ? "self"
              : p.lost   ? "lost"
                         : "ok");
    }
    const auto rows = boot_.allgather(row.str());
    finishing_ = true;
    if (rank_ != 0) return 0;
    return print(rows);
  }

  int print(const std::vector<std::optional<std::string>>& rows) {
    std::vector<std::vector<double>> bw(size_, std::vector<double>(size_, 0));
    std::vector<std::vector<double>> lat(size_, std::vector<double>(size_, 0));
    std::vector<std::vector<std::string>> state(size_,
                                                std::vector<std::string>(size_, "-"));
    std::vector<double> setup(size_, 0);
    std::vector<bool> present(size_, false);
    for (int i = 0; i < size_; ++i) {
      if (!rows[i]) continue;
      present[i] = true;
      std::stringstream ss(*rows[i]);
      std::string field;
      std::getline(ss, field, ';');
      setup[i] = std::stod(field);
      for (int j = 0; j < size_ && std::getline(ss, field, ';'); ++j) {
        std::stringstream fs(field);
        std::string a, b, s;
        std::getline(fs, a, ',');
        std::getline(fs, b, ',');
        std::getline(fs, s, ',');
        bw[i][j] = std::stod(a);
        lat[i][j] = std::stod(b);
        state[i][j] = s;
      }
    }
    double max_setup = 0;
    for (int i = 0; i < size_; ++i) max_setup = std::max(max_setup, setup[i]);
    std::printf(
        "rdmakit-mesh: %d ranks (%s bootstrap, %s), %.1f s, %u B WRITEs, window %u\n",
        size_, boot_.name(), server_->context().provider_name(), elapsed_s_, c_.chunk,
        c_.window);
    std::printf("connection setup (all pairs, slowest rank): %.1f ms\n", max_setup);
    std::printf("bandwidth MB/s (row = writer, column = target) | half-RTT usec\n");
    for (int i = 0; i < size_; ++i) {
      std::printf("%4d:", i);
      if (!present[i]) {
        std::printf("  rank %d did not report (dead)\n", i);
        continue;
      }
      for (int j = 0; j < size_; ++j) {
        if (i == j) {
          std::printf(" %8s", "-");
        } else if (state[i][j] == "lost") {
          std::printf(" %8s", "LOST");
        } else {
          std::printf(" %8.1f", bw[i][j]);
        }
      }
      std::printf("  |");
      for (int j = 0; j < size_; ++j) {
        if (i != j && state[i][j] == "ok")
          std::printf(" %6.1f", lat[i][j]);
        else
          std::printf(" %6s", "-");
      }
      std::printf("\n");
    }
    int lost = 0;
    for (int i = 0; i < size_; ++i) lost += present[i] ? 0 : 1;
    if (lost > 0) std::printf("%d rank(s) lost; the others finished\n", lost);
    if (!c_.out.empty()) write_files(bw, lat, state, present, max_setup);
    std::fflush(stdout);
    return 0;
  }

  void write_files(const std::vector<std::vector<double>>& bw,
                   const std::vector<std::vector<double>>& lat,
                   const std::vector<std::vector<std::string>>& state,
                   const std::vector<bool>& present, double setup_ms) {
    std::ofstream csv(c_.out + ".csv");
    csv << "writer,target,mb_per_s,half_rtt_us,state\n";
    std::ofstream js(c_.out + ".json");
    js << "{\"ranks\":" << size_ << ",\"provider\":\""
       << server_->context().provider_name() << "\",\"bootstrap\":\"" << boot_.name()
       << "\",\"duration_s\":" << elapsed_s_ << ",\"setup_ms\":" << setup_ms
       << ",\"pairs\":[";
    bool first = true;
    for (int i = 0; i < size_; ++i) {
      for (int j = 0; j < size_; ++j) {
        if (i == j) continue;
        const std::string s = present[i] ? state[i][j] : "dead";
        csv << i << "," << j << "," << bw[i][j] << "," << lat[i][j] << "," << s << "\n";
        js << (first ? "" : ",") << "{\"writer\":" << i << ",\"target\":" << j
           << ",\"mb_per_s\":" << bw[i][j] << ",\"half_rtt_us\":" << lat[i][j]
           << ",\"state\":\"" << s << "\"}";
        first = false;
      }
    }
    js << "]}\n";
    csv.close();
    js.close();
    // The heat map: a small matplotlib script next to the binary.
    char self[4096] = {};
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : "";
    dir = dir.substr(0, dir.rfind('/'));
    const std::string script = dir + "/rdmakit-mesh-heatmap.py";
    // Debian's python3 (where python3-matplotlib lives), not one earlier in PATH.
    const char* py =
        ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    const std::string cmd =
        std::string(py) + " '" + script + "' '" + c_.out + ".csv' '" + c_.out + ".png'";
    if (::access(script.c_str(), R_OK) != 0 || std::system(cmd.c_str()) != 0) {
      std::printf("heat map: not written (needs %s and python3-matplotlib)\n",
                  script.c_str());
    } else {
      std::printf("wrote %s.json, %s.csv, %s.png\n", c_.out.c_str(), c_.out.c_str(),
                  c_.out.c_str());
    }
  }

  const Config& c_;
  mesh::Bootstrap& boot_;
  int rank_;
  int size_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::mutex mu_;
  int higher_ = 0;
  std::atomic<bool> finishing_{false};
  Clock::time_point traffic_start_{};
  double elapsed_s_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"rdmakit-mesh: all-to-all session traffic between N processes"};
  app.add_option("--rank", c.rank, "standalone: this process's rank");
  app.add_option("--size", c.size, "standalone: number of ranks");
  app.add_option("--root", c.root, "standalone: HOST:PORT where rank 0 bootstraps");
  app.add_option("-p,--provider", c.provider, "shm | tcp | verbs | auto");
  app.add_option("--host", c.host, "address this rank listens on");
  app.add_option("-t,--duration", c.duration_s, "seconds of traffic");
  app.add_option("--chunk", c.chunk, "bytes per WRITE")->check(CLI::Range(8u, 16u << 20));
  app.add_option("--window", c.window, "WRITEs in flight per peer")
      ->check(CLI::Range(1u, 64u));
  app.add_option("-o,--out", c.out, "rank 0: write OUT.json, OUT.csv, OUT.png");
  app.add_option("--kill-rank", c.kill_rank,
                 "this rank SIGKILLs itself mid-run (testing)");
  app.add_option("--kill-after", c.kill_after_s, "seconds into the traffic");
  CLI11_PARSE(app, argc, argv);
  try {
    std::unique_ptr<mesh::Bootstrap> boot;
    if (c.rank >= 0) {
      if (c.size <= 0 || c.rank >= c.size || c.root.empty()) {
        std::fprintf(stderr,
                     "standalone mode needs --rank R --size N --root HOST:PORT\n");
        return 2;
      }
      boot = mesh::standalone_bootstrap(c.rank, c.size, c.root);
    } else {
      boot = mesh::pmix_bootstrap();
      if (!boot) {
        std::fprintf(stderr,
                     "not started by a PMIx launcher (mpirun, srun): give --rank --size "
                     "--root\n");
        return 2;
      }
    }
    if (c.kill_rank == 0) {
      std::fprintf(stderr, "--kill-rank 0: rank 0 reports the results; pick another\n");
      return 2;
    }
    Mesh m(c, *boot);
    return m.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-mesh: %s\n", e.what());
    return 1;
  }
}
