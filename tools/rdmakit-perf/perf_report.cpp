// Test names and the three output formats: perftest-style table, JSON lines,
// CSV. Nothing here runs inside a measured loop.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "perf.hpp"
#include "perf_clock.hpp"

namespace rdmakit::perf {
namespace {

struct TestInfo {
  Test test;
  const char* name;
  const char* title;
};

constexpr TestInfo kTests[] = {
    {Test::kSendLat, "send_lat", "Send Latency Test"},
    {Test::kSendBw, "send_bw", "Send BW Test"},
    {Test::kWriteLat, "write_lat", "RDMA_Write Latency Test"},
    {Test::kWriteBw, "write_bw", "RDMA_Write BW Test"},
    {Test::kWriteImmBw, "write_imm_bw", "RDMA_Write_with_Imm BW Test"},
    {Test::kReadLat, "read_lat", "RDMA_Read Latency Test"},
    {Test::kReadBw, "read_bw", "RDMA_Read BW Test"},
    {Test::kAtomicLat, "atomic_lat", "Atomic Latency Test"},
    {Test::kAtomicBw, "atomic_bw", "Atomic BW Test"},
    {Test::kWriteCplLat, "write_cpl_lat", "RDMA_Write Post-to-Completion Test"},
};

constexpr const char* kLine =
    "------------------------------------------------------------------------------------"
    "---";

}  // namespace

const char* test_name(Test test) noexcept {
  for (const auto& t : kTests) {
    if (t.test == test) return t.name;
  }
  return "?";
}

std::optional<Test> parse_test(const std::string& name) {
  for (const auto& t : kTests) {
    if (name == t.name) return t.test;
  }
  return std::nullopt;
}

std::vector<std::string> test_names() {
  std::vector<std::string> names;
  for (const auto& t : kTests) names.emplace_back(t.name);
  return names;
}

bool is_latency(Test test) noexcept {
  return test == Test::kSendLat || test == Test::kWriteLat || test == Test::kReadLat ||
         test == Test::kAtomicLat || test == Test::kWriteCplLat;
}

bool is_atomic(Test test) noexcept {
  return test == Test::kAtomicLat || test == Test::kAtomicBw;
}

bool consumes_recv(Test test) noexcept {
  return test == Test::kSendLat || test == Test::kSendBw || test == Test::kWriteImmBw;
}

const char* latency_kind(Test test) noexcept {
  switch (test) {
    case Test::kSendLat:
    case Test::kWriteLat: return "half_round_trip";
    case Test::kReadLat:
    case Test::kAtomicLat: return "round_trip";
    case Test::kWriteCplLat: return "post_to_completion";
    default: return "";
  }
}

std::string test_title(Test test, AtomicOp op) {
  for (const auto& t : kTests) {
    if (t.test != test) continue;
    std::string title = t.title;
    if (is_atomic(test)) {
      title += op == AtomicOp::kCompareSwap ? " (CMP_AND_SWAP)" : " (FETCH_AND_ADD)";
    }
    return title;
  }
  return "?";
}

void Reporter::header(const RunInfo& info) {
  if (options_.json || options_.csv) return;
  const Settings& s = options_.settings;
  const bool lat = is_latency(s.test);
  std::string measure;
  if (lat) {
    const std::string kind = latency_kind(s.test);
    measure =
        kind == "half_round_trip" ? "half round trip (ping-pong RTT / 2), like perftest"
        : kind == "round_trip"    ? "full round trip (post to completion), like perftest"
                                  : "post to local completion of one WRITE";
  } else {
    measure = s.bidirectional ? "bandwidth of both directions, summed; MB = 10^6 bytes"
                              : "bandwidth at the initiator; MB = 10^6 bytes";
  }
  std::string run = options_.iterations
                        ? fmt::format("{} iters", options_.iterations)
                        : fmt::format("{:.1f} s/size", options_.duration_s);
  std::string pin =
      options_.loopback
          ? fmt::format("client cpu {}, server cpu {}", options_.cpu, options_.server_cpu)
          : (options_.cpu >= 0 ? fmt::format("cpu {}", options_.cpu)
                               : std::string("none"));
  std::printf("%s\n", kLine);
  std::printf("                    %s (rdmakit-perf)\n",
              test_title(s.test, s.atomic_op).c_str());
  std::printf(" Provider       : %-12s Device         : %s\n", info.provider.c_str(),
              info.device.c_str());
  std::printf(" Number of qps  : %-12u Connection     : RC\n", s.num_qps);
  std::printf(" TX depth       : %-12u RX depth       : %u\n", s.tx_depth, s.rx_depth);
  std::printf(" CQ moderation  : %-12u Post list      : %u\n", s.cq_mod, s.post_list);
  if (s.warmup > 0) {
    std::printf(" Warm-up        : %-12s (bandwidth tests: not timed)\n",
                fmt::format("{} ops/QP", s.warmup).c_str());
  }
  std::printf(" Inline size    : %-12u Bidirectional  : %s\n", info.effective_inline,
              s.bidirectional ? "on" : "off");
  std::printf(" Completion     : %-12s Clock          : %s\n",
              s.event ? "event" : "busy-poll", Clock::source());
  std::printf(" Run            : %-12s Pinning        : %s\n", run.c_str(), pin.c_str());
  if (s.busy_target) std::printf(" Target         : busy-polls (--busy-target)\n");
  std::printf(" Measures       : %s\n", measure.c_str());
  std::printf("%s\n", kLine);
  if (lat) {
    std::printf(" %-8s %-12s %-12s %-12s %-16s %-12s %-14s %-16s %-16s\n", "#bytes",
                "#iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]",
                "t_avg[usec]", "t_stdev[usec]", "99% pct[usec]", "99.9% pct[usec]");
  } else {
    std::printf(" %-10s %-12s %-18s %-20s %-14s\n", "#bytes", "#iterations",
                "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]");
  }
  std::fflush(stdout);
}

void Reporter::progress(size_t index, size_t count, uint64_t size) {
  if (!options_.progress || options_.json || options_.csv) return;
  std::printf("\r [%zu/%zu] %llu bytes ...", index + 1, count,
              static_cast<unsigned long long>(size));
  std::fflush(stdout);
  progress_shown_ = true;
}

void Reporter::row(const RunInfo& info, const Result& r) {
  if (progress_shown_) {
    std::printf("\r\033[K");  // erase the progress line before the row
    progress_shown_ = false;
  }
  const Settings& s = options_.settings;
  if (options_.json) {
    nlohmann::json j;
    j["test"] = test_name(r.test);
    if (is_atomic(r.test)) {
      j["atomic"] = s.atomic_op == AtomicOp::kCompareSwap ? "cas" : "fetch_add";
    }
    j["provider"] = info.provider;
    j["device"] = info.device;
    j["size"] = r.size;
    j["iterations"] = r.iterations;
    j["qps"] = s.num_qps;
    j["tx_depth"] = s.tx_depth;
    j["cq_mod"] = s.cq_mod;
    j["warmup"] = s.warmup;
    j["post_list"] = s.post_list;
    j["inline"] = info.effective_inline;
    j["bidirectional"] = s.bidirectional;
    j["event"] = s.event;
    j["busy_target"] = s.busy_target;
    j["posted"] = r.posted;
    j["completions"] = r.completions;
    j["recv_completions"] = r.recv_completions;
    j["bytes"] = r.bytes;
    j["peer_posted"] = r.peer_posted;
    j["peer_recv_completions"] = r.peer_recv_completions;
    j["peer_recv_bytes"] = r.peer_recv_bytes;
    j["verified"] = r.verified;
    if (!r.verify_detail.empty()) j["verify_detail"] = r.verify_detail;
    j["seconds"] = r.seconds;
    if (r.latency) {
      j["latency"] = latency_kind(r.test);
      j["t_min_us"] = r.t_min;
      j["t_max_us"] = r.t_max;
      j["t_typical_us"] = r.t_typical;
      j["t_avg_us"] = r.t_avg;
      j["t_stdev_us"] = r.t_stdev;
      j["t_p99_us"] = r.t_p99;
      j["t_p999_us"] = r.t_p999;
    } else {
      j["bw_peak_MBps"] = r.bw_peak;
      j["bw_avg_MBps"] = r.bw_avg;
      j["msg_rate_Mps"] = r.msg_rate;
    }
    std::printf("%s\n", j.dump().c_str());
  } else if (options_.csv) {
    // One header per process, also when several tests run.
    static bool csv_header_done = false;
    if (!csv_header_done) {
      std::printf(
          "test,provider,device,size,iterations,qps,posted,completions,recv_completions,"
          "bytes,peer_posted,peer_recv_completions,peer_recv_bytes,verified,seconds,"
          "t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,t_p99_us,t_p999_us,"
          "bw_peak_MBps,bw_avg_MBps,msg_rate_Mps\n");
      csv_header_done = true;
    }
    std::string tail =
        r.latency
            ? fmt::format("{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},,,", r.t_min,
                          r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.t_p99, r.t_p999)
            : fmt::format(",,,,,,,{:.2f},{:.2f},{:.6f}", r.bw_peak, r.bw_avg, r.msg_rate);
    std::printf("%s,%s,%s,%llu,%llu,%u,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%d,%.6f,%s\n",
                test_name(r.test), info.provider.c_str(), info.device.c_str(),
                static_cast<unsigned long long>(r.size),
                static_cast<unsigned long long>(r.iterations), s.num_qps,
                static_cast<unsigned long long>(r.posted),
                static_cast<unsigned long long>(r.completions),
                static_cast<unsigned long long>(r.recv_completions),
                static_cast<unsigned long long>(r.bytes),
                static_cast<unsigned long long>(r.peer_posted),
                static_cast<unsigned long long>(r.peer_recv_completions),
                static_cast<unsigned long long>(r.peer_recv_bytes), r.verified ? 1 : 0,
                r.seconds, tail.c_str());
  } else if (r.latency) {
    std::printf(
        " %-8llu %-12llu %-12.2f %-12.2f %-16.2f %-12.2f %-14.2f %-16.2f %-16.2f\n",
        static_cast<unsigned long long>(r.size),
        static_cast<unsigned long long>(r.iterations), r.t_min, r.t_max, r.t_typical,
        r.t_avg, r.t_stdev, r.t_p99, r.t_p999);
  } else {
    std::printf(" %-10llu %-12llu %-18.2f %-20.2f %-14.6f\n",
                static_cast<unsigned long long>(r.size),
                static_cast<unsigned long long>(r.iterations), r.bw_peak, r.bw_avg,
                r.msg_rate);
  }
  if (!r.verified && !options_.json && !options_.csv) {
    std::printf(" ! check failed: %s\n", r.verify_detail.c_str());
  }
  std::fflush(stdout);
}

void Reporter::footer() {
  if (options_.json || options_.csv) return;
  std::printf("%s\n", kLine);
  std::fflush(stdout);
}

}  // namespace rdmakit::perf
