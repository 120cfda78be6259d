#pragma once
// rdmakit-perf: shared definitions of the tool (options, tests, results).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::perf {

enum class Test : uint8_t {
  kSendLat,
  kSendBw,
  kWriteLat,
  kWriteBw,
  kWriteImmBw,
  kReadLat,
  kReadBw,
  kAtomicLat,
  kAtomicBw,
  kWriteCplLat,  // WRITE post to local completion (no ping-pong)
};

enum class AtomicOp : uint8_t { kFetchAdd, kCompareSwap };

const char* test_name(Test test) noexcept;
std::optional<Test> parse_test(const std::string& name);
std::vector<std::string> test_names();
bool is_latency(Test test) noexcept;
bool is_atomic(Test test) noexcept;
// Tests whose data operations consume RECVs at the peer.
bool consumes_recv(Test test) noexcept;
// What a latency figure of this test is.
const char* latency_kind(Test test) noexcept;
// perftest-style title, e.g. "RDMA_Write BW Test".
std::string test_title(Test test, AtomicOp op);

// Settings both ends use. The client's command line decides; the server
// receives them in the connect private data.
struct Settings {
  Test test = Test::kWriteBw;
  AtomicOp atomic_op = AtomicOp::kFetchAdd;
  bool bidirectional = false;
  bool event = false;  // CompletionQueue::wait instead of busy poll
  // The target of one-sided tests busy-polls instead of sleeping, as
  // ucx_perftest's server does (tcp targets always poll).
  bool busy_target = false;
  uint32_t num_qps = 1;
  uint32_t tx_depth = 128;
  uint32_t rx_depth = 512;
  uint32_t inline_size = 0;
  uint32_t post_list = 16;  // WRs per post_send call (doorbell batching)
  uint32_t cq_mod = 64;     // one signaled WR every cq_mod
  // Bandwidth tests: operations per QP that complete before the clock starts
  // (still posted and counted; ucx_perftest's -w).
  uint64_t warmup = 0;
  uint64_t max_size = 65536;
};

struct Options {
  Settings settings;
  std::vector<uint64_t> sizes;
  uint64_t iterations = 0;         // per QP; 0 = duration mode
  double duration_s = 0;           // -D
  std::string server;              // empty: this process is the server
  std::string bind = "127.0.0.1";  // loopback unless --bind says otherwise
  uint16_t port = 18515;
  std::string provider = "auto";
  std::string device;
  int cpu = -1;
  bool loopback = false;
  bool json = false;
  bool csv = false;
  bool progress = false;  // stdout is a terminal and the sweep is long
  double timeout_s = 10;  // no progress for this long: fail
  double accept_timeout_s = 120;
  int server_cpu = -1;  // for the header only (loopback)
};

// One (test, size) result as seen by the client, including what the server
// reported back, so that counts can be cross-checked.
struct Result {
  Test test = Test::kWriteBw;
  uint64_t size = 0;
  uint64_t iterations = 0;        // measured operations (latency: samples)
  uint64_t posted = 0;            // data WRs posted by the client
  uint64_t completions = 0;       // send-queue completions reaped by the client
  uint64_t recv_completions = 0;  // receive completions reaped by the client
  uint64_t bytes = 0;             // payload bytes the client's WRs moved
  uint64_t peer_posted = 0;       // data WRs posted by the server
  uint64_t peer_recv_completions = 0;
  uint64_t peer_recv_bytes = 0;
  bool verified = false;  // data / counters checked after the run
  std::string verify_detail;
  double seconds = 0;
  bool latency = false;
  // Latency, microseconds.
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, t_p99 = 0,
         t_p999 = 0;
  // Bandwidth, MB/s with MB = 10^6 bytes; message rate in millions/s.
  double bw_peak = 0, bw_avg = 0, msg_rate = 0;
};

struct RunInfo {
  std::string provider;
  std::string device;
  uint32_t effective_inline = 0;
};

// The two ends (perf_run.cpp).
// Runs the server end: listens, serves one client for its whole sweep.
int run_server(const Options& options, int port_fd);
// Runs the client end; prints results as they come.
int run_client(const Options& options);

// Output (perf_report.cpp).
class Reporter {
 public:
  explicit Reporter(const Options& options) : options_(options) {}
  void header(const RunInfo& info);
  void progress(size_t index, size_t count, uint64_t size);
  void row(const RunInfo& info, const Result& result);
  void footer();

 private:
  const Options& options_;
  bool progress_shown_ = false;
};

}  // namespace rdmakit::perf
