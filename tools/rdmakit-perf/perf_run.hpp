#pragma once
// One end of a measurement: the client or the server of one test, for its
// whole sweep of sizes. The client decides everything: its settings go to
// the server in the control connection's private data (perf_wire.hpp), each
// size starts with a Start/Ready exchange on the control channel
// (perf_control.hpp) and ends with End (what the sender posted) and Result
// (what the server saw, plus its own figures for bidirectional runs), so
// every figure can be cross-checked.
//
// Where each part lives:
//   perf_run.cpp           connection setup, the sweep, per-size preparation
//   perf_pingpong.cpp      send_lat, write_lat
//   perf_round_trip.cpp    read_lat, atomic_lat, write_cpl_lat
//   perf_latency_stats.cpp the latency tests' End/Result and statistics
//   perf_bandwidth.cpp     every *_bw test
//   perf_crosscheck.cpp    the server's Result and the client's checks
//   perf_atomic.hpp        what is particular to the atomic tests
// The completion handling and WR building every loop shares are inline
// below, as they are on the measured path.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "perf.hpp"
#include "perf_atomic.hpp"
#include "perf_check.hpp"
#include "perf_control.hpp"
#include "perf_wire.hpp"

namespace rdmakit::perf {

class PerfRun {
 public:
  PerfRun(const Options& options, bool server)
      : o_(options), server_(server), ctrl_(options.timeout_s) {}
  ~PerfRun();
  PerfRun(const PerfRun&) = delete;
  PerfRun& operator=(const PerfRun&) = delete;

  void open();

  // --- connection setup (perf_run.cpp) --------------------------------------
  void client_connect(const std::string& address);
  void server_accept(Listener& listener);
  std::unique_ptr<Listener> listen(const std::string& address) {
    return ctx_->listen(address);
  }
  RunInfo info() const {
    return RunInfo{ctx_->provider_name(), ctx_->device_name(), inline_};
  }

  // --- the sweep (perf_run.cpp) ---------------------------------------------
  Result client_step(uint64_t size);
  void client_quit();
  // Serves Start..Result rounds until Quit.
  void serve();

 private:
  struct Counters {
    uint64_t posted = 0, bytes = 0, completions = 0;
    uint64_t recv_completions = 0, recv_bytes = 0, errors = 0;
  };

  // --- setup helpers (perf_run.cpp) -----------------------------------------
  QpOptions data_qp_options();
  void allocate();
  void set_peer(const RemoteRegion& peer);
  void finish_setup();
  SendWr scratch_write(uint64_t wr_id) const;
  void reach_peer_region();

  // --- per-size preparation (perf_run.cpp) ----------------------------------
  void prepare(uint64_t size);
  void top_up_recvs(uint32_t q);
  void post_recvs(uint32_t q, uint32_t n);
  void reserve_samples(uint64_t iterations);
  Result run(uint64_t size, uint64_t iterations, uint64_t duration_ns);

  // --- the test families ----------------------------------------------------
  // perf_pingpong.cpp
  Result run_pingpong(uint64_t size, uint64_t iterations, uint64_t duration_ns);
  void post_one(SendWr& wr, uint64_t idx, bool last);
  void flush_sq(uint32_t q);
  void drain_sends(Watchdog& wd);
  void finish_server(Watchdog& wd);
  // perf_round_trip.cpp
  Result run_rtt(uint64_t size, uint64_t iterations, uint64_t duration_ns);
  Result run_passive(uint64_t size);
  // perf_latency_stats.cpp
  Result client_finish_lat(uint64_t size, uint64_t n, double scale, double seconds);
  // perf_bandwidth.cpp
  Result run_bw(uint64_t size, uint64_t iterations, uint64_t duration_ns);
  double peak(size_t nstamps, uint64_t wr_len) const;

  // --- results and cross-checks (perf_crosscheck.cpp) -----------------------
  void send_result(double bw_avg, double bw_peak, double msg_rate);
  uint64_t target_digest() const;
  uint64_t expected_digest() const;
  Result base_result(uint64_t size, const CtrlMsg& res) const;
  void verify(Result& r, const CtrlMsg& res) const;

  // --- shared by the measured loops -----------------------------------------

  std::byte* local(uint32_t q) const { return mem_->data() + kCtrlArea + q * slot_; }
  std::byte* target(uint32_t q) const {
    return mem_->data() + kCtrlArea + (s_.num_qps + q) * slot_;
  }
  uint64_t peer_target(uint32_t q) const {
    return peer_.addr + kCtrlArea + (s_.num_qps + q) * slot_;
  }

  // A receive completion: count it and replace the RECV, in batches.
  void on_recv(const Completion& c) {
    const uint32_t q = static_cast<uint32_t>(c.wr_id >> kQpShift);
    ++counters_.recv_completions;
    counters_.recv_bytes += c.byte_len;
    if (s_.test == Test::kWriteImmBw) {
      if (!c.has_imm() || c.imm != static_cast<uint32_t>(imm_expected_[q]))
        ++counters_.errors;
      ++imm_expected_[q];
    }
    --recv_outstanding_[q];
    // send_lat replaces RECVs after posting each reply (run_pingpong), not
    // between a message and its answer.
    if (s_.test != Test::kSendLat) refill_recvs(q);
  }

  void refill_recvs(uint32_t q) {
    if (recv_outstanding_[q] + kRecvBatch <= s_.rx_depth) post_recvs(q, kRecvBatch);
  }

  Opcode data_opcode() const {
    switch (s_.test) {
      case Test::kSendLat:
      case Test::kSendBw: return Opcode::kSend;
      case Test::kWriteImmBw: return Opcode::kWriteWithImm;
      case Test::kReadLat:
      case Test::kReadBw: return Opcode::kRead;
      case Test::kAtomicLat:
      case Test::kAtomicBw: return atomic_opcode(s_.atomic_op);
      default: return Opcode::kWrite;
    }
  }

  SendWr make_wr(uint32_t q, uint64_t size) const {
    SendWr wr;
    wr.opcode = data_opcode();
    wr.length = static_cast<uint32_t>(is_atomic(s_.test) ? kAtomicSize : size);
    wr.local_addr = local(q);
    wr.lkey = mem_->lkey();
    wr.remote_addr = peer_target(q);
    wr.rkey = peer_.rkey;
    wr.compare_add = kFetchAddStep;
    const bool payload_out = wr.opcode == Opcode::kSend || wr.opcode == Opcode::kWrite ||
                             wr.opcode == Opcode::kWriteWithImm;
    if (payload_out && wr.length <= inline_) wr.flags |= kInline;
    return wr;
  }

  int poll_data(std::span<Completion> out) {
    return s_.event ? cq_->wait(out, std::chrono::milliseconds(2)) : cq_->poll(out);
  }

  // The target of one-sided tests stays idle, as perftest's server does:
  // shm and verbs targets need no CPU. tcp serves requests in whichever
  // thread polls (its progress thread only when nobody does), so there the
  // target keeps polling.
  bool idle_target() const {
    return !s_.busy_target && ctx_->provider() != ProviderKind::kTcp;
  }
  int poll_target(std::span<Completion> out) {
    return idle_target() ? cq_->wait(out, std::chrono::milliseconds(1)) : poll_data(out);
  }

  // Any data completion in the single-QP latency loops. Returns true for a
  // receive.
  bool on_completion(const Completion& c) {
    check_completion(c);
    if (is_recv_opcode(c.opcode)) {
      on_recv(c);
      return true;
    }
    const uint32_t q = static_cast<uint32_t>(c.wr_id >> kQpShift);
    completed_[q] = (c.wr_id & kFlushBit) ? posted_[q] : (c.wr_id & kIdxMask) + 1;
    ++counters_.completions;
    return false;
  }

  static constexpr uint32_t kRecvBatch = 32;
  static constexpr size_t kMaxLatSamples = size_t{1} << 22;  // duration mode cap
  static constexpr size_t kMaxBwStamps = size_t{1} << 20;

  const Options& o_;
  bool server_;
  Settings s_;
  // Destroyed in reverse: the data QPs, the control QP (~PerfRun), the
  // region, the CQs, then the context.
  std::unique_ptr<Context> ctx_;
  ControlChannel ctrl_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<MemoryRegion> mem_;
  std::vector<std::unique_ptr<QueuePair>> qps_;
  RemoteRegion peer_;
  uint64_t slot_ = 0;
  uint64_t until_signal_ = 1;      // post_one: WRs left until the next signaled one
  bool last_wr_signaled_ = false;  // post_one: the last data WR on QP 0 was signaled
  uint32_t inline_ = 0;
  uint64_t cur_size_ = 0;
  bool end_seen_ = false;
  double passive_limit_s_ = 30;
  Counters counters_;
  std::vector<uint32_t> recv_outstanding_;
  std::vector<uint64_t> posted_, completed_, limit_, imm_expected_;
  std::vector<SendWr> wrs_;
  std::vector<RecvWr> recv_wrs_;
  // Latency samples: one timestamp per iteration, sized by reserve_samples
  // before the run (no allocation in the loop).
  std::vector<uint64_t> lat_ticks_;
  std::vector<uint64_t> stamps_, stamp_ops_;
};

}  // namespace rdmakit::perf
