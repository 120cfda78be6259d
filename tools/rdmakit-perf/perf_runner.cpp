// Both ends of a measurement. The client decides everything: its settings go
// to the server in the control connection's private data, each size starts
// with a Start/Ready exchange on a control QP (SEND/RECV), and ends with End
// (what the sender posted) and Result (what the server saw, plus its own
// figures for bidirectional runs), so every figure can be cross-checked.
//
// Memory, one region per side:
//   [control area 4 KiB][local slot per QP][target slot per QP]
// Local slots are sources (SEND/WRITE) or sinks (READ/atomics); target slots
// are what the peer's one-sided operations and SENDs land in.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>

#include "fmt/format.h"
#include "perf.hpp"
#include "perf_clock.hpp"

// write_lat polls a byte that the peer's WRITE lands in, as perftest does.
// On a NIC that is DMA; on tcp it is the provider's receive thread doing a
// memcpy, which ThreadSanitizer reports: rdmakit (like verbs) orders WRITE
// data only through completions, and this poll is the benchmark's deliberate
// shortcut. Only that load and the stamp store are hidden from TSan.
#if defined(__SANITIZE_THREAD__)
#define RDMAKIT_PERF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMAKIT_PERF_TSAN 1
#endif
#endif
#ifdef RDMAKIT_PERF_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace rdmakit::perf {
namespace {

using namespace std::chrono_literals;

uint8_t load_polled(uint8_t* p) noexcept {
#ifdef RDMAKIT_PERF_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  const uint8_t v = std::atomic_ref<uint8_t>(*p).load(std::memory_order_acquire);
#ifdef RDMAKIT_PERF_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  return v;
}

void store_stamp(uint8_t* p, uint8_t v) noexcept {
#ifdef RDMAKIT_PERF_TSAN
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  std::atomic_ref<uint8_t>(*p).store(v, std::memory_order_relaxed);
#ifdef RDMAKIT_PERF_TSAN
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
}

constexpr uint32_t kMagic = 0x46524b52;  // "RKRF"
constexpr uint16_t kWireVersion = 2;
constexpr size_t kCtrlArea = 4096;
constexpr size_t kCtrlSlot = 256;
constexpr uint32_t kCtrlRecvs = 8;
constexpr uint64_t kQpShift = 48;
constexpr uint64_t kIdxMask = (uint64_t{1} << kQpShift) - 1;
// A signaled 8-byte WRITE into the peer's control scratch retires trailing
// unsignaled WRs at the end of a duration run (no data message is involved).
constexpr uint64_t kFlushBit = uint64_t{1} << 47;
constexpr size_t kScratchRemote = 3072;  // in the control area, past the RECV slots
constexpr size_t kScratchLocal = 3584;
constexpr uint32_t kRecvBatch = 32;
constexpr size_t kMaxLatSamples = size_t{1} << 22;  // duration mode cap
constexpr size_t kMaxBwStamps = size_t{1} << 20;

struct WireSettings {
  uint32_t magic;
  uint16_t version;
  uint8_t test;
  uint8_t atomic_op;
  uint8_t bidirectional;
  uint8_t event;
  uint8_t busy_target;
  uint8_t reserved;
  uint32_t num_qps;
  uint32_t tx_depth;
  uint32_t rx_depth;
  uint32_t inline_size;
  uint32_t post_list;
  uint32_t cq_mod;
  uint64_t max_size;
  uint64_t warmup;
};
static_assert(sizeof(WireSettings) + RemoteRegion::kSerializedSize <=
              Context::kMaxPrivateData);

struct WireQp {
  uint32_t magic;
  uint32_t index;
};

enum class Ctrl : uint32_t { kStart = 1, kReady, kEnd, kResult, kQuit };

// Control message; both ends run the same binary, so a plain struct.
struct CtrlMsg {
  Ctrl type = Ctrl::kStart;
  uint32_t reserved = 0;
  uint64_t size = 0;
  uint64_t iterations = 0;        // Start: per QP, 0 = duration mode
  uint64_t duration_ns = 0;       // Start
  uint64_t posted = 0;            // End/Result: data WRs the sender posted
  uint64_t bytes = 0;             // End/Result: bytes those WRs moved
  uint64_t recv_completions = 0;  // Result
  uint64_t recv_bytes = 0;        // Result
  uint64_t checksum = 0;          // Result: target-area checksum or atomic counters
  uint64_t errors = 0;            // Result: immediates out of sequence
  double bw_avg = 0, bw_peak = 0, msg_rate = 0;  // Result: server's direction
};
static_assert(sizeof(CtrlMsg) <= kCtrlSlot);

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Cheap content hash (word at a time) to compare buffers across processes.
uint64_t checksum(const std::byte* p, size_t n) {
  uint64_t h = 1469598103934665603ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

void fill_pattern(std::byte* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<std::byte>((i * 131 + seed * 7 + 1) & 0xff);
  }
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

void check_post(const PostResult& r, const char* what) {
  if (!r.ok()) fail(fmt::format("{}: post failed: {}", what, post_status_name(r.status)));
}

void check_completion(const Completion& c) {
  if (!c.ok()) {
    fail(fmt::format("{} completion failed: {} (wr_id {:#x}, vendor_err {})",
                     opcode_name(c.opcode), status_name(c.status), c.wr_id,
                     c.vendor_err));
  }
}

bool is_recv_opcode(Opcode op) {
  return op == Opcode::kRecv || op == Opcode::kRecvWriteWithImm;
}

// Fails a loop that makes no progress for `timeout`; reads the clock only
// every `mask + 1` idle turns so a busy loop stays cheap.
class Watchdog {
 public:
  Watchdog(double timeout_s, std::string what, bool event)
      : timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(timeout_s))),
        what_(std::move(what)),
        mask_(event ? 0 : 4095),
        last_(std::chrono::steady_clock::now()) {}
  void progress() noexcept { ++progress_; }
  void idle() {
    if ((++idle_ & mask_) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (progress_ != seen_) {
      seen_ = progress_;
      last_ = now;
    } else if (now - last_ > timeout_) {
      fail(fmt::format("{}: no progress for {:.1f} s", what_,
                       std::chrono::duration<double>(timeout_).count()));
    }
  }

 private:
  std::chrono::steady_clock::duration timeout_;
  std::string what_;
  uint64_t mask_;
  uint64_t idle_ = 0, progress_ = 0, seen_ = 0;
  std::chrono::steady_clock::time_point last_;
};

struct Counters {
  uint64_t posted = 0, bytes = 0, completions = 0;
  uint64_t recv_completions = 0, recv_bytes = 0, errors = 0;
};

struct LatStats {
  double min = 0, max = 0, typical = 0, avg = 0, stdev = 0, p99 = 0, p999 = 0;
};

// Statistics in microseconds of per-iteration tick deltas, scaled by `scale`
// (0.5 for half round trips). Sorts `ticks`.
LatStats lat_stats(std::vector<uint64_t>& ticks, size_t n, double scale) {
  LatStats s;
  if (n == 0) return s;
  std::sort(ticks.begin(), ticks.begin() + static_cast<ptrdiff_t>(n));
  auto us = [&](uint64_t t) { return Clock::us(t) * scale; };
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = us(ticks[i]);
    sum += v;
    sq += v * v;
  }
  s.min = us(ticks[0]);
  s.max = us(ticks[n - 1]);
  s.typical = us(ticks[n / 2]);
  s.avg = sum / n;
  s.stdev = std::sqrt(std::max(0.0, sq / n - s.avg * s.avg));
  auto pct = [&](double p) {
    size_t k = static_cast<size_t>(std::ceil(p * n));
    return us(ticks[std::min(n - 1, k == 0 ? 0 : k - 1)]);
  };
  s.p99 = pct(0.99);
  s.p999 = pct(0.999);
  return s;
}

class Session {
 public:
  Session(const Options& options, bool server) : o_(options), server_(server) {}

  void open() {
    ContextOptions co;
    co.provider = parse_provider(o_.provider);
    co.verbs.device = o_.device;
    ctx_ = Context::open(co);
    ctrl_cq_ = ctx_->create_cq(CqOptions{.capacity = 64});
  }

  // --- connection setup ---------------------------------------------------

  void client_connect(const std::string& address) {
    s_ = o_.settings;
    allocate();
    WireSettings w{};
    w.magic = kMagic;
    w.version = kWireVersion;
    w.test = static_cast<uint8_t>(s_.test);
    w.atomic_op = static_cast<uint8_t>(s_.atomic_op);
    w.bidirectional = s_.bidirectional;
    w.event = s_.event;
    w.busy_target = s_.busy_target;
    w.num_qps = s_.num_qps;
    w.tx_depth = s_.tx_depth;
    w.rx_depth = s_.rx_depth;
    w.inline_size = s_.inline_size;
    w.post_list = s_.post_list;
    w.cq_mod = s_.cq_mod;
    w.max_size = s_.max_size;
    w.warmup = s_.warmup;
    std::byte pd[sizeof(WireSettings) + RemoteRegion::kSerializedSize];
    std::memcpy(pd, &w, sizeof w);
    mem_->remote().serialize(std::span<std::byte, RemoteRegion::kSerializedSize>(
        pd + sizeof w, RemoteRegion::kSerializedSize));
    // A server running several tests listens anew for each one: retry a
    // refused connection for a bounded time.
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      try {
        ctrl_ = ctx_->connect(address, ctrl_qp_options(), pd, 10s);
        break;
      } catch (const Error& e) {
        if (e.sys_errno() != ECONNREFUSED || std::chrono::steady_clock::now() > give_up)
          throw;
        std::this_thread::sleep_for(50ms);
      }
    }
    post_ctrl_recvs();
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      const WireQp wq{kMagic, q};
      qps_.push_back(ctx_->connect(
          address, data_qp_options(),
          std::span<const std::byte>(reinterpret_cast<const std::byte*>(&wq), sizeof wq),
          10s));
    }
    auto peer = RemoteRegion::deserialize(qps_[0]->peer_private_data());
    if (!peer) fail("server sent no usable region descriptor");
    set_peer(*peer);
    finish_setup();
  }

  void server_accept(Listener& listener) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o_.accept_timeout_s * 1000));
    ctrl_ = listener.accept(ctrl_qp_options(), timeout);
    const auto pd = ctrl_->peer_private_data();
    WireSettings w{};
    if (pd.size() < sizeof w + RemoteRegion::kSerializedSize)
      fail("client hello too short");
    std::memcpy(&w, pd.data(), sizeof w);
    if (w.magic != kMagic || w.version != kWireVersion) {
      fail("client hello: not rdmakit-perf or a different version");
    }
    s_.test = static_cast<Test>(w.test);
    s_.atomic_op = static_cast<AtomicOp>(w.atomic_op);
    s_.bidirectional = w.bidirectional != 0;
    s_.event = w.event != 0;
    s_.busy_target = w.busy_target != 0;
    s_.num_qps = w.num_qps;
    s_.tx_depth = w.tx_depth;
    s_.rx_depth = w.rx_depth;
    s_.inline_size = w.inline_size;
    s_.post_list = w.post_list;
    s_.cq_mod = w.cq_mod;
    s_.max_size = w.max_size;
    s_.warmup = w.warmup;
    if (s_.num_qps == 0 || s_.num_qps > 1024 || s_.max_size > (uint64_t{1} << 32)) {
      fail("client hello: settings out of range");
    }
    auto peer = RemoteRegion::deserialize(pd.subspan(sizeof w));
    if (!peer) fail("client hello: bad region descriptor");
    // The ctrl QP was accepted before the region existed (its size comes
    // from the settings); ctrl RECVs are posted before any data QP is
    // accepted, and the client speaks only after those.
    allocate();
    post_ctrl_recvs();
    qps_.resize(s_.num_qps);
    const auto reply = mem_->remote().serialize();
    for (uint32_t i = 0; i < s_.num_qps; ++i) {
      auto qp = listener.accept(data_qp_options(), 10s, reply);
      WireQp wq{};
      const auto qpd = qp->peer_private_data();
      if (qpd.size() < sizeof wq) fail("data QP without index");
      std::memcpy(&wq, qpd.data(), sizeof wq);
      if (wq.magic != kMagic || wq.index >= s_.num_qps || qps_[wq.index]) {
        fail("data QP with a bad index");
      }
      qps_[wq.index] = std::move(qp);
    }
    set_peer(*peer);
    finish_setup();
  }

  std::unique_ptr<Listener> listen(const std::string& address) {
    return ctx_->listen(address);
  }

  RunInfo info() const {
    return RunInfo{ctx_->provider_name(), ctx_->device_name(), inline_};
  }

  // --- the sweep ------------------------------------------------------------

  Result client_step(uint64_t size) {
    prepare(size);
    reserve_samples(o_.iterations);
    CtrlMsg start;
    start.type = Ctrl::kStart;
    start.size = size;
    start.iterations = o_.iterations;
    start.duration_ns = static_cast<uint64_t>(o_.duration_s * 1e9);
    ctrl_send(start);
    expect(ctrl_recv(), Ctrl::kReady);
    Result r = run(size, o_.iterations, start.duration_ns);
    return r;
  }

  void client_quit() {
    CtrlMsg quit;
    quit.type = Ctrl::kQuit;
    ctrl_send(quit);
  }

  // Serves Start..Result rounds until Quit.
  void serve() {
    for (;;) {
      const CtrlMsg m = ctrl_recv(o_.accept_timeout_s);
      if (m.type == Ctrl::kQuit) return;
      if (m.type != Ctrl::kStart) fail("protocol: expected Start");
      if (m.size == 0 || m.size > s_.max_size) fail("protocol: size out of range");
      prepare(m.size);
      // Everything sized before Ready: a peer that starts at once must not
      // outrun a server still allocating (its RECVs would run out: RNR).
      reserve_samples(m.iterations);
      CtrlMsg ready;
      ready.type = Ctrl::kReady;
      ctrl_send(ready);
      run(m.size, m.iterations, m.duration_ns);
    }
  }

 private:
  // --- setup helpers --------------------------------------------------------

  QpOptions ctrl_qp_options() {
    QpOptions q;
    q.send_cq = ctrl_cq_.get();
    q.recv_cq = ctrl_cq_.get();
    q.max_send_wr = 16;
    q.max_recv_wr = kCtrlRecvs;
    return q;
  }

  QpOptions data_qp_options() {
    if (!cq_) {
      // One CQ for sends and receives of all data QPs: a single place to
      // poll or sleep on, also in event mode. Completions are told apart
      // by opcode.
      const uint32_t cap = s_.num_qps * (s_.tx_depth + s_.rx_depth) + 64;
      cq_ = ctx_->create_cq(CqOptions{.capacity = cap});
    }
    QpOptions q;
    q.send_cq = cq_.get();
    q.recv_cq = cq_.get();
    q.max_send_wr = s_.tx_depth;
    q.max_recv_wr = s_.rx_depth;
    q.max_inline = std::max<uint32_t>(s_.inline_size, 8);
    q.peer_timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
    return q;
  }

  void allocate() {
    slot_ = round_up(std::max<uint64_t>(s_.max_size, 64), 4096);
    const uint64_t total = kCtrlArea + 2 * slot_ * s_.num_qps;
    mem_ = ctx_->allocate(total, kAccessAll);
    // Touch every page now so no page fault lands in a measured loop.
    std::memset(mem_->data(), 0, total);
    lat_ticks_.clear();
  }

  void set_peer(const RemoteRegion& peer) {
    if (peer.length < kCtrlArea + 2 * slot_ * s_.num_qps) fail("peer region too small");
    peer_ = peer;
  }

  void finish_setup() {
    inline_ = std::min<uint32_t>(s_.inline_size, qps_[0]->max_inline());
    recv_outstanding_.assign(s_.num_qps, 0);
    posted_.assign(s_.num_qps, 0);
    completed_.assign(s_.num_qps, 0);
    limit_.assign(s_.num_qps, 0);
    imm_expected_.assign(s_.num_qps, 0);
    wrs_.assign(std::max<uint32_t>(s_.post_list, 1), SendWr{});
    recv_wrs_.assign(kRecvBatch, RecvWr{});
    reach_peer_region();
  }

  // A signaled 8-byte WRITE into the peer's scratch, outside any test's data.
  SendWr scratch_write(uint64_t wr_id) const {
    return SendWr{.wr_id = wr_id,
                  .opcode = Opcode::kWrite,
                  .flags = kSignaled,
                  .length = 8,
                  .local_addr = mem_->data() + kScratchLocal,
                  .lkey = mem_->lkey(),
                  .remote_addr = peer_.addr + kScratchRemote,
                  .rkey = peer_.rkey};
  }

  // One WRITE per QP into the peer's scratch before anything is measured:
  // shm maps a peer region on its first access (as a NIC may fetch a
  // translation), which must not count against the first measured run.
  void reach_peer_region() {
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      check_post(qps_[q]->post_send(scratch_write(kFlushBit)),
                 "first WRITE to the peer's region");
      Completion c;
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (cq_->poll({&c, 1}) == 0) {
        if (std::chrono::steady_clock::now() > give_up) {
          fail("first WRITE to the peer's region: no completion within 10 s");
        }
      }
      check_completion(c);
    }
  }

  std::byte* local(uint32_t q) const { return mem_->data() + kCtrlArea + q * slot_; }
  std::byte* target(uint32_t q) const {
    return mem_->data() + kCtrlArea + (s_.num_qps + q) * slot_;
  }
  uint64_t peer_target(uint32_t q) const {
    return peer_.addr + kCtrlArea + (s_.num_qps + q) * slot_;
  }

  // --- control channel --------------------------------------------------

  void post_ctrl_recvs() {
    for (uint32_t i = 0; i < kCtrlRecvs; ++i) post_ctrl_recv(i);
  }
  void post_ctrl_recv(uint32_t i) {
    check_post(ctrl_->post_recv(RecvWr{.wr_id = i,
                                       .addr = mem_->data() + kCtrlSlot * (1 + i),
                                       .length = kCtrlSlot,
                                       .lkey = mem_->lkey()}),
               "control RECV");
  }

  // Handles one control completion; returns true if it delivered a message.
  bool ctrl_take(const Completion& c, CtrlMsg* out) {
    check_completion(c);
    if (c.opcode != Opcode::kRecv) {
      ctrl_send_done_ = true;
      return false;
    }
    const uint32_t i = static_cast<uint32_t>(c.wr_id);
    if (i >= kCtrlRecvs || c.byte_len != sizeof(CtrlMsg))
      fail("protocol: bad control message");
    std::memcpy(out, mem_->data() + kCtrlSlot * (1 + i), sizeof(CtrlMsg));
    post_ctrl_recv(i);
    return true;
  }

  // Non-blocking: a queued or newly arrived control message.
  bool ctrl_try_recv(CtrlMsg* out) {
    if (pending_count_ > 0) {
      *out = pending_[pending_head_];
      pending_head_ = (pending_head_ + 1) % kCtrlRecvs;
      --pending_count_;
      return true;
    }
    Completion c;
    while (ctrl_cq_->poll({&c, 1}) == 1) {
      if (ctrl_take(c, out)) return true;
    }
    return false;
  }

  CtrlMsg ctrl_recv(double timeout_s = -1) {
    Watchdog wd(timeout_s > 0 ? timeout_s : std::max(o_.timeout_s, 30.0),
                "waiting for the peer's control message", true);
    CtrlMsg m;
    for (;;) {
      if (ctrl_try_recv(&m)) return m;
      // Keep polling the data CQ too: software providers progress there.
      Completion c[16];
      const int n = cq_ ? cq_->poll(c) : 0;
      for (int i = 0; i < n; ++i) handle_stray(c[i]);
      Completion cc;
      if (ctrl_cq_->wait({&cc, 1}, 2ms) == 1) {
        if (ctrl_take(cc, &m)) return m;
      }
      wd.idle();
    }
  }

  void ctrl_send(const CtrlMsg& m) {
    std::memcpy(mem_->data(), &m, sizeof m);
    ctrl_send_done_ = false;
    check_post(ctrl_->post_send(SendWr{.wr_id = 1000,
                                       .opcode = Opcode::kSend,
                                       .flags = kSignaled,
                                       .length = sizeof(CtrlMsg),
                                       .local_addr = mem_->data(),
                                       .lkey = mem_->lkey()}),
               "control SEND");
    Watchdog wd(std::max(o_.timeout_s, 30.0), "sending a control message", true);
    while (!ctrl_send_done_) {
      Completion c;
      if (ctrl_cq_->wait({&c, 1}, 2ms) == 1) {
        CtrlMsg in;
        if (ctrl_take(c, &in)) {
          if (pending_count_ == kCtrlRecvs) fail("protocol: too many control messages");
          pending_[(pending_head_ + pending_count_) % kCtrlRecvs] = in;
          ++pending_count_;
        }
      }
      wd.idle();
    }
  }

  // A waiting side notices a dead peer through the control QP's state.
  void check_peer() const {
    if (ctrl_->state() != QpState::kConnected) {
      fail(fmt::format("peer lost (control QP {})", qp_state_name(ctrl_->state())));
    }
  }

  static void expect(const CtrlMsg& m, Ctrl type) {
    if (m.type != type) {
      fail(fmt::format("protocol: expected message {}, got {}", static_cast<int>(type),
                       static_cast<int>(m.type)));
    }
  }

  // A data completion outside a measured loop: only errors matter.
  void handle_stray(const Completion& c) {
    check_completion(c);
    if (is_recv_opcode(c.opcode)) {
      fail("protocol: unexpected data receive outside a test");
    }
  }

  // --- per-size preparation -------------------------------------------------

  void prepare(uint64_t size) {
    const Test t = s_.test;
    cur_size_ = size;
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      fill_pattern(local(q), size, server_ ? 2 * q + 1 : 2 * q + 2);
      if (t == Test::kReadLat || t == Test::kReadBw) {
        // The peer reads our target; its content is what it must see.
        fill_pattern(target(q), size, 1000 + q + (server_ ? 0 : 500));
        std::memset(local(q), 0, size);
      } else {
        std::memset(target(q), 0, size);
      }
      if (is_atomic(t)) std::memset(local(q), 0, 8);
      posted_[q] = completed_[q] = 0;
      imm_expected_[q] = 0;
      if (consumes_recv(t)) top_up_recvs(q);
    }
    counters_ = Counters{};
  }

  void top_up_recvs(uint32_t q) {
    while (recv_outstanding_[q] < s_.rx_depth) {
      const uint32_t n =
          std::min<uint32_t>(kRecvBatch, s_.rx_depth - recv_outstanding_[q]);
      post_recvs(q, n);
    }
  }

  void post_recvs(uint32_t q, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      // Every RECV of a QP lands in its target slot, sized for the largest
      // message of the sweep, so RECVs left over from one size fit the next.
      recv_wrs_[i] = RecvWr{.wr_id = uint64_t{q} << kQpShift,
                            .addr = target(q),
                            .length = static_cast<uint32_t>(slot_),
                            .lkey = mem_->lkey()};
    }
    check_post(qps_[q]->post_recv(std::span<const RecvWr>(recv_wrs_.data(), n)), "RECV");
    recv_outstanding_[q] += n;
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

  // --- work requests --------------------------------------------------------

  Opcode data_opcode() const {
    switch (s_.test) {
      case Test::kSendLat:
      case Test::kSendBw: return Opcode::kSend;
      case Test::kWriteImmBw: return Opcode::kWriteWithImm;
      case Test::kReadLat:
      case Test::kReadBw: return Opcode::kRead;
      case Test::kAtomicLat:
      case Test::kAtomicBw:
        return s_.atomic_op == AtomicOp::kCompareSwap ? Opcode::kCompareSwap
                                                      : Opcode::kFetchAdd;
      default: return Opcode::kWrite;
    }
  }

  SendWr make_wr(uint32_t q, uint64_t size) const {
    SendWr wr;
    wr.opcode = data_opcode();
    wr.length = static_cast<uint32_t>(is_atomic(s_.test) ? 8 : size);
    wr.local_addr = local(q);
    wr.lkey = mem_->lkey();
    wr.remote_addr = peer_target(q);
    wr.rkey = peer_.rkey;
    wr.compare_add = 1;
    const bool payload_out = wr.opcode == Opcode::kSend || wr.opcode == Opcode::kWrite ||
                             wr.opcode == Opcode::kWriteWithImm;
    if (payload_out && wr.length <= inline_) wr.flags |= kInline;
    return wr;
  }

  int poll_data(std::span<Completion> out) {
    return s_.event ? cq_->wait(out, 2ms) : cq_->poll(out);
  }

  // The target of one-sided tests stays idle, as perftest's server does:
  // shm and verbs targets need no CPU. tcp serves requests in whichever
  // thread polls (its progress thread only when nobody does), so there the
  // target keeps polling.
  bool idle_target() const {
    return !s_.busy_target && ctx_->provider() != ProviderKind::kTcp;
  }
  int poll_target(std::span<Completion> out) {
    return idle_target() ? cq_->wait(out, 1ms) : poll_data(out);
  }

  // --- measurement ----------------------------------------------------------

  Result run(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
    // A side that only waits for the peer sees no progress of its own for
    // the whole run: bound it by the run's length (at 10 MB/s at worst).
    passive_limit_s_ = std::max(o_.timeout_s, 30.0) + duration_ns / 1e9 +
                       static_cast<double>(iterations) * size * s_.num_qps / 1e7;
    switch (s_.test) {
      case Test::kSendLat:
      case Test::kWriteLat: return run_pingpong(size, iterations, duration_ns);
      case Test::kReadLat:
      case Test::kAtomicLat:
      case Test::kWriteCplLat:
        return server_ ? run_passive(size) : run_rtt(size, iterations, duration_ns);
      default: return run_bw(size, iterations, duration_ns);
    }
  }

  // Samples come from one timestamp per iteration: delta of consecutive
  // iteration starts, as perftest does; no allocation in the loop.
  // Sized by reserve_samples before the run.
  uint64_t* lat_buffer() { return lat_ticks_.data(); }

  // Timestamp arrays for a run of `iterations` (0: duration mode), before
  // the run starts.
  void reserve_samples(uint64_t iterations) {
    if (is_latency(s_.test)) {
      if (server_) return;  // only the client takes timestamps
      const size_t need = (iterations ? iterations : kMaxLatSamples) + 1;
      if (lat_ticks_.size() < need) lat_ticks_.assign(need, 0);
      return;
    }
    const uint64_t stamp_cap =
        iterations ? s_.num_qps * (iterations / s_.cq_mod + 2) + 2 : kMaxBwStamps;
    if (stamps_.size() < stamp_cap) {
      stamps_.assign(stamp_cap, 0);
      stamp_ops_.assign(stamp_cap, 0);
    }
  }

  // Posts one data WR on QP 0 with selective signaling; makes room first.
  void post_one(SendWr& wr, uint64_t idx, bool last) {
    Completion c[8];
    while (posted_[0] - completed_[0] >= s_.tx_depth) {
      const int n = cq_->poll(c);
      for (int i = 0; i < n; ++i) on_completion(c[i]);
    }
    wr.wr_id = idx;
    // Every cq_mod-th WR is signaled; a countdown, not a division, on the
    // measured path.
    if (idx == 0) until_signal_ = s_.cq_mod;
    const bool sig = --until_signal_ == 0 || last;
    if (until_signal_ == 0) until_signal_ = s_.cq_mod;
    wr.flags =
        static_cast<uint8_t>(sig ? (wr.flags | kSignaled) : (wr.flags & ~kSignaled));
    if (wr.opcode == Opcode::kCompareSwap) {
      wr.compare_add = idx;
      wr.swap = idx + 1;
    }
    check_post(qps_[0]->post_send(wr), "data WR");
    ++posted_[0];
    ++counters_.posted;
    counters_.bytes += wr.length;
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

  // After a duration run that ended on an unsignaled WR: post a signaled
  // WRITE to the peer's scratch so the send queue drains completely.
  void flush_sq(uint32_t q) {
    if (posted_[q] == 0 || posted_[q] % s_.cq_mod == 0) return;
    const SendWr wr = scratch_write((uint64_t{q} << kQpShift) | kFlushBit);
    Completion c[8];
    while (posted_[q] - completed_[q] >= s_.tx_depth) {
      const int n = cq_->poll(c);
      for (int i = 0; i < n; ++i) on_completion(c[i]);
    }
    check_post(qps_[q]->post_send(wr), "flush WRITE");
  }

  // Reaps the send queue after a latency loop so that every signaled WR is
  // accounted for before the counts are reported.
  void drain_sends(Watchdog& wd) {
    flush_sq(0);
    Completion c[16];
    while (completed_[0] < posted_[0] && posted_[0] > 0) {
      // Only signaled WRs complete; the last one always is.
      const int n = poll_data(c);
      for (int i = 0; i < n; ++i) on_completion(c[i]);
      if (n) wd.progress();
      wd.idle();
    }
  }

  // send_lat / write_lat: ping-pong, half round trip.
  Result run_pingpong(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
    const bool send = s_.test == Test::kSendLat;
    Watchdog wd(o_.timeout_s, fmt::format("{} size {}", test_name(s_.test), size),
                s_.event);
    SendWr wr = make_wr(0, size);
    auto* my_flag = reinterpret_cast<uint8_t*>(target(0) + size - 1);
    auto* out_flag = reinterpret_cast<uint8_t*>(local(0)) + size - 1;
    Completion c[8];
    // Waits for the peer's message number i (1-based stamp for WRITE).
    auto wait_incoming = [&](uint64_t i, uint64_t* end_count) -> bool {
      const uint8_t stamp = static_cast<uint8_t>(i % 255 + 1);
      uint32_t idle = 0;
      for (;;) {
        if (send) {
          const int n = poll_data(c);
          bool got = false;
          for (int k = 0; k < n; ++k) got |= on_completion(c[k]);
          if (got) return true;
        } else {
          if (load_polled(my_flag) == stamp) {
            return true;
          }
          // Reap sends and let software providers progress.
          const int n = cq_->poll(c);
          for (int k = 0; k < n; ++k) on_completion(c[k]);
        }
        wd.idle();
        // The server learns the end of a duration run from End.
        if (end_count && (++idle & 1023) == 0) {
          CtrlMsg m;
          if (*end_count == UINT64_MAX && ctrl_try_recv(&m)) {
            expect(m, Ctrl::kEnd);
            *end_count = m.posted;
            end_seen_ = true;
          }
          if (*end_count == i) return false;
        }
      }
    };
    auto post_out = [&](uint64_t i, bool last) {
      if (!send) {
        store_stamp(out_flag, static_cast<uint8_t>(i % 255 + 1));
      }
      post_one(wr, i, last);
    };

    // RECVs are replaced after the reply is posted (on_recv leaves them):
    // a batch of postings must not sit between a message and its answer.
    auto post_reply = [&](uint64_t i, bool last) {
      post_out(i, last);
      if (send) refill_recvs(0);
    };

    Result r;
    if (server_) {
      uint64_t end_count = UINT64_MAX;
      uint64_t i = 0;
      for (;; ++i) {
        if (iterations && i == iterations) break;
        if (!wait_incoming(i, &end_count)) break;
        wd.progress();
        // In duration mode the server cannot know which reply is last; it
        // signals every cq_mod and drains below.
        post_reply(i, iterations && i + 1 == iterations);
      }
      finish_server(wd);
      return r;
    }

    uint64_t* t = lat_buffer();
    const uint64_t cap = iterations ? iterations : kMaxLatSamples;
    const uint64_t t0 = Clock::now();
    const uint64_t deadline =
        iterations ? UINT64_MAX : t0 + static_cast<uint64_t>(duration_ns / Clock::ns(1));
    uint64_t i = 0;
    for (; i < cap; ++i) {
      const uint64_t now = Clock::now();
      t[i] = now;
      if (now >= deadline) break;
      post_reply(i, i + 1 == cap);
      wait_incoming(i, nullptr);
      wd.progress();
    }
    if (i == cap) t[i] = Clock::now();
    drain_sends(wd);
    return client_finish_lat(size, i, 0.5, Clock::ns(t[i] - t0) / 1e9);
  }

  // read_lat / atomic_lat / write_cpl_lat: post, poll to completion.
  Result run_rtt(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
    Watchdog wd(o_.timeout_s, fmt::format("{} size {}", test_name(s_.test), size),
                s_.event);
    SendWr wr = make_wr(0, size);
    uint64_t* t = lat_buffer();
    const uint64_t cap = iterations ? iterations : kMaxLatSamples;
    const uint64_t t0 = Clock::now();
    const uint64_t deadline =
        iterations ? UINT64_MAX : t0 + static_cast<uint64_t>(duration_ns / Clock::ns(1));
    const bool cas = wr.opcode == Opcode::kCompareSwap;
    const auto* old = reinterpret_cast<const uint64_t*>(local(0));
    Completion c[4];
    uint64_t i = 0;
    for (; i < cap; ++i) {
      const uint64_t now = Clock::now();
      t[i] = now;
      if (now >= deadline) break;
      wr.wr_id = i;
      wr.flags |= kSignaled;
      if (cas) {
        wr.compare_add = i;
        wr.swap = i + 1;
      }
      check_post(qps_[0]->post_send(wr), "data WR");
      ++posted_[0];
      ++counters_.posted;
      counters_.bytes += wr.length;
      for (;;) {
        const int n = poll_data(c);
        if (n > 0) {
          on_completion(c[0]);
          if (n > 1) fail("more completions than posted");
          break;
        }
        wd.idle();
      }
      if (cas && *old != i) ++counters_.errors;  // each CAS must have swapped
      wd.progress();
    }
    if (i == cap) t[i] = Clock::now();
    return client_finish_lat(size, i, 1.0, Clock::ns(t[i] - t0) / 1e9);
  }

  // Server side of tests where it does nothing but let the client work.
  Result run_passive(uint64_t) {
    Watchdog wd(passive_limit_s_, "waiting for the client's End", s_.event);
    Completion c[16];
    CtrlMsg m;
    uint32_t turn = 0;
    for (;;) {
      // Polling the data CQ drives the tcp provider's target side.
      const int n = poll_target(c);
      for (int i = 0; i < n; ++i) on_completion(c[i]);
      if ((++turn & 255) == 0 || idle_target()) {
        if (ctrl_try_recv(&m)) break;
        check_peer();
      }
      wd.idle();
    }
    expect(m, Ctrl::kEnd);
    send_result(0, 0, 0);
    return Result{};
  }

  // Server after its part of a ping-pong: all replies reaped, then End and
  // Result.
  void finish_server(Watchdog& wd) {
    drain_sends(wd);
    // End may have been consumed already in duration mode; wait otherwise.
    if (!end_seen_) {
      const CtrlMsg m = ctrl_recv();
      expect(m, Ctrl::kEnd);
    }
    end_seen_ = false;
    send_result(0, 0, 0);
  }

  void send_result(double bw_avg, double bw_peak, double msg_rate) {
    CtrlMsg res;
    res.type = Ctrl::kResult;
    res.posted = counters_.posted;
    res.bytes = counters_.bytes;
    res.recv_completions = counters_.recv_completions;
    res.recv_bytes = counters_.recv_bytes;
    res.errors = counters_.errors;
    res.bw_avg = bw_avg;
    res.bw_peak = bw_peak;
    res.msg_rate = msg_rate;
    res.checksum = target_digest();
    ctrl_send(res);
  }

  // What the server reports about its target slots after a run.
  uint64_t target_digest() const {
    const uint64_t size = cur_size_;
    uint64_t sum = 0;
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      if (is_atomic(s_.test)) {
        sum += std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(target(q)))
                   .load(std::memory_order_acquire);
      } else {
        sum += checksum(target(q), size);
      }
    }
    return sum;
  }

  // What the client expects the server's digest to be.
  uint64_t expected_digest() const {
    const uint64_t size = cur_size_;
    uint64_t sum = 0;
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      if (is_atomic(s_.test)) {
        sum += posted_[q];  // FETCH_ADD +1 each; CAS i -> i+1 in order
      } else {
        sum += checksum(local(q), size);
      }
    }
    return sum;
  }

  // Client: End, Result, checks, latency statistics.
  Result client_finish_lat(uint64_t size, uint64_t n, double scale, double seconds) {
    CtrlMsg end;
    end.type = Ctrl::kEnd;
    end.posted = counters_.posted;
    end.bytes = counters_.bytes;
    ctrl_send(end);
    const CtrlMsg res = ctrl_recv();
    expect(res, Ctrl::kResult);
    Result r = base_result(size, res);
    r.iterations = n;
    r.latency = true;
    r.seconds = seconds;
    for (uint64_t i = 0; i < n; ++i) lat_ticks_[i] = lat_ticks_[i + 1] - lat_ticks_[i];
    const LatStats st = lat_stats(lat_ticks_, n, scale);
    r.t_min = st.min;
    r.t_max = st.max;
    r.t_typical = st.typical;
    r.t_avg = st.avg;
    r.t_stdev = st.stdev;
    r.t_p99 = st.p99;
    r.t_p999 = st.p999;
    verify(r, res);
    return r;
  }

  Result base_result(uint64_t size, const CtrlMsg& res) const {
    Result r;
    r.test = s_.test;
    r.size = size;
    r.posted = counters_.posted;
    r.completions = counters_.completions;
    r.recv_completions = counters_.recv_completions;
    r.bytes = counters_.bytes;
    r.peer_posted = res.posted;
    r.peer_recv_completions = res.recv_completions;
    r.peer_recv_bytes = res.recv_bytes;
    return r;
  }

  // Cross-checks counts and memory contents against the server's Result.
  void verify(Result& r, const CtrlMsg& res) const {
    std::string why;
    const Test t = s_.test;
    if (consumes_recv(t)) {
      if (res.recv_completions != counters_.posted) {
        why += fmt::format("server received {} messages, client posted {}; ",
                           res.recv_completions, counters_.posted);
      }
      if (res.recv_bytes != counters_.bytes) {
        why += fmt::format("server received {} bytes, client posted {}; ", res.recv_bytes,
                           counters_.bytes);
      }
      if (res.errors) why += fmt::format("{} immediates out of sequence; ", res.errors);
    }
    if (t == Test::kSendLat && counters_.recv_completions != res.posted) {
      why += fmt::format("client received {} replies, server posted {}; ",
                         counters_.recv_completions, res.posted);
    }
    if (s_.bidirectional && consumes_recv(t) &&
        counters_.recv_completions != res.posted) {
      why += fmt::format("client received {} messages, server posted {}; ",
                         counters_.recv_completions, res.posted);
    }
    if (counters_.errors)
      why += fmt::format("{} compare-and-swaps did not swap; ", counters_.errors);
    const bool memory_check = t == Test::kWriteBw || t == Test::kWriteLat ||
                              t == Test::kWriteCplLat || t == Test::kWriteImmBw ||
                              is_atomic(t);
    if (memory_check && counters_.posted > 0 && res.checksum != expected_digest()) {
      why += is_atomic(t)
                 ? fmt::format("server counters sum to {}, expected {}; ", res.checksum,
                               expected_digest())
                 : std::string("server's target memory differs from the source; ");
    }
    // The server's digest covers every QP's target slot.
    if ((t == Test::kReadBw || t == Test::kReadLat) &&
        std::all_of(posted_.begin(), posted_.end(), [](uint64_t p) { return p > 0; })) {
      uint64_t sum = 0;
      for (uint32_t q = 0; q < s_.num_qps; ++q) sum += checksum(local(q), cur_size_);
      if (sum != res.checksum) why += "data read differs from the server's memory; ";
    }
    // Selective signaling: one completion per cq_mod WRs plus the last.
    uint64_t want_cpl = 0;
    for (uint32_t q = 0; q < s_.num_qps; ++q) {
      if (posted_[q] == 0) continue;
      want_cpl += posted_[q] / s_.cq_mod + (posted_[q] % s_.cq_mod ? 1 : 0);
    }
    if (t == Test::kReadLat || t == Test::kAtomicLat || t == Test::kWriteCplLat) {
      want_cpl = counters_.posted;  // every WR signaled
    }
    if (counters_.completions != want_cpl) {
      why += fmt::format("{} send completions, expected {}; ", counters_.completions,
                         want_cpl);
    }
    r.verified = why.empty();
    if (!why.empty()) why.resize(why.size() - 2);
    r.verify_detail = why;
  }

  // Bandwidth tests: keep every send queue full with batched, selectively
  // signaled posts; both ends run this loop (the server as a receiver, or
  // as a second sender when bidirectional).
  Result run_bw(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
    const bool sending = !server_ || s_.bidirectional;
    const bool recv_duty = consumes_recv(s_.test) && (server_ || s_.bidirectional);
    Watchdog wd(sending || recv_duty ? o_.timeout_s : passive_limit_s_,
                fmt::format("{} size {}", test_name(s_.test), size), s_.event);
    // Server waits for the client's End; a bidirectional client for the
    // server's.
    const bool want_peer_end = server_ || s_.bidirectional;
    const uint32_t nq = s_.num_qps;
    std::vector<SendWr> tmpl(nq);
    for (uint32_t q = 0; q < nq; ++q) {
      tmpl[q] = make_wr(q, size);
      limit_[q] = sending ? (iterations ? iterations : UINT64_MAX) : 0;
    }
    const uint64_t wr_len = tmpl[0].length;
    uint64_t peer_expected = UINT64_MAX;  // RECVs the peer's sends consume
    bool peer_end = !want_peer_end;
    bool send_done = !sending;
    bool end_sent = false;
    uint64_t total_completed = 0;
    size_t nstamps = 0;
    uint64_t t_end = 0;
    Completion c[32];
    const uint64_t t0 = Clock::now();
    const uint64_t deadline =
        (iterations || !sending) ? UINT64_MAX
                                 : t0 + static_cast<uint64_t>(duration_ns / Clock::ns(1));
    stamps_[0] = t0;
    stamp_ops_[0] = 0;
    nstamps = 1;
    uint32_t turn = 0;
    bool deadline_hit = false;
    for (;;) {
      bool active = false;
      if (!send_done) {
        if (!deadline_hit && Clock::now() >= deadline) {
          deadline_hit = true;
          for (uint32_t q = 0; q < nq; ++q) {
            // Finish on a signaled WR so the end is observable.
            limit_[q] = posted_[q] + (posted_[q] % s_.cq_mod ? 1 : 0);
          }
        }
        for (uint32_t q = 0; q < nq; ++q) {
          const uint64_t room = s_.tx_depth - (posted_[q] - completed_[q]);
          const uint64_t left = limit_[q] - posted_[q];
          const uint64_t n = std::min<uint64_t>({room, left, wrs_.size()});
          if (n == 0) continue;
          for (uint64_t j = 0; j < n; ++j) {
            const uint64_t idx = posted_[q] + j;
            SendWr& w = wrs_[j];
            w = tmpl[q];
            w.wr_id = (uint64_t{q} << kQpShift) | idx;
            if ((idx + 1) % s_.cq_mod == 0 || idx + 1 == limit_[q]) w.flags |= kSignaled;
            w.imm = static_cast<uint32_t>(idx);
            if (w.opcode == Opcode::kCompareSwap) {
              w.compare_add = idx;
              w.swap = idx + 1;
            }
          }
          const PostResult pr =
              qps_[q]->post_send(std::span<const SendWr>(wrs_.data(), n));
          if (!pr.ok() && pr.status != PostStatus::kQueueFull) check_post(pr, "data WRs");
          // A partial post is fine: the rest is rebuilt and posted next turn.
          posted_[q] += pr.posted;
          counters_.posted += pr.posted;
          counters_.bytes += pr.posted * wr_len;
          active |= pr.posted > 0;
        }
      }
      const int n = sending || recv_duty ? poll_data(c) : poll_target(c);
      if (n > 0) {
        const uint64_t now = Clock::now();
        bool got_send = false;
        for (int k = 0; k < n; ++k) {
          check_completion(c[k]);
          if (is_recv_opcode(c[k].opcode)) {
            on_recv(c[k]);
            continue;
          }
          const uint32_t q = static_cast<uint32_t>(c[k].wr_id >> kQpShift);
          const uint64_t upto = (c[k].wr_id & kIdxMask) + 1;
          total_completed += upto - completed_[q];
          completed_[q] = upto;
          ++counters_.completions;
          got_send = true;
        }
        if (got_send) {
          if (nstamps < stamps_.size()) {
            stamps_[nstamps] = now;
            stamp_ops_[nstamps] = total_completed;
            ++nstamps;
          }
          t_end = now;
        }
        active = true;
      }
      if (!send_done) {
        bool all = true;
        for (uint32_t q = 0; q < nq && all; ++q) {
          all = limit_[q] != UINT64_MAX && completed_[q] == limit_[q];
        }
        if (all) {
          send_done = true;
          if (t_end == 0) t_end = Clock::now();
        }
      }
      if (send_done && sending && !end_sent && want_peer_end) {
        // Tell the peer how many RECV-consuming messages to expect.
        CtrlMsg end;
        end.type = Ctrl::kEnd;
        end.posted = counters_.posted;
        end.bytes = counters_.bytes;
        ctrl_send(end);
        end_sent = true;
      }
      if (!peer_end && ((++turn & 63) == 0 || !active)) {
        CtrlMsg m;
        if ((turn & 4095) == 0) check_peer();
        if (ctrl_try_recv(&m)) {
          expect(m, Ctrl::kEnd);
          peer_end = true;
          peer_expected = m.posted;
        }
      }
      const bool recv_ok =
          !recv_duty || (peer_end && counters_.recv_completions >= peer_expected);
      if (send_done && peer_end && recv_ok) break;
      if (active) {
        wd.progress();
      } else {
        wd.idle();
      }
    }

    // Figures of this side's own direction.
    double bw_avg = 0, bw_peak = 0, msg_rate = 0, seconds = 0;
    if (sending && t_end > t0) {
      // The clock starts at the first completion past the warm-up, when
      // there is one before the end.
      uint64_t t_start = t0;
      uint64_t ops_before = 0;
      if (s_.warmup > 0) {
        for (size_t k = 1; k + 1 < nstamps; ++k) {
          if (stamp_ops_[k] >= s_.warmup * nq) {
            t_start = stamps_[k];
            ops_before = stamp_ops_[k];
            break;
          }
        }
      }
      seconds = Clock::ns(t_end - t_start) / 1e9;
      const uint64_t ops = counters_.posted - ops_before;
      bw_avg = static_cast<double>(ops * wr_len) / seconds / 1e6;
      msg_rate = ops / seconds / 1e6;
      bw_peak = peak(nstamps, wr_len);
      if (bw_peak < bw_avg) bw_peak = bw_avg;
    }
    if (server_) {
      send_result(bw_avg, bw_peak, msg_rate);
      return Result{};
    }
    if (!s_.bidirectional) {
      CtrlMsg end;
      end.type = Ctrl::kEnd;
      end.posted = counters_.posted;
      end.bytes = counters_.bytes;
      ctrl_send(end);
    }
    const CtrlMsg res = ctrl_recv();
    expect(res, Ctrl::kResult);
    Result r = base_result(size, res);
    r.iterations = nq ? counters_.posted / nq : 0;
    r.seconds = seconds;
    r.bw_avg = bw_avg + res.bw_avg;
    r.bw_peak = bw_peak + res.bw_peak;
    r.msg_rate = msg_rate + res.msg_rate;
    verify(r, res);
    return r;
  }

  // Peak: best rate over any stretch of at least 1/20 of the run (and
  // 20 us), so bursts of completions polled together do not count as speed.
  double peak(size_t nstamps, uint64_t wr_len) const {
    if (nstamps < 3) return 0;
    const uint64_t total = stamps_[nstamps - 1] - stamps_[0];
    const uint64_t min_dt = std::max<uint64_t>(
        total / 20, static_cast<uint64_t>(20000.0 / std::max(Clock::ns(1), 1e-9)));
    double best = 0;
    size_t j = 0;
    for (size_t k = 0; k < nstamps; ++k) {
      if (j < k) j = k;
      while (j < nstamps && stamps_[j] - stamps_[k] < min_dt) ++j;
      if (j == nstamps) break;
      const double bytes = static_cast<double>(stamp_ops_[j] - stamp_ops_[k]) * wr_len;
      best = std::max(best, bytes / (Clock::ns(stamps_[j] - stamps_[k]) / 1e9) / 1e6);
    }
    return best;
  }

  const Options& o_;
  bool server_;
  Settings s_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompletionQueue> ctrl_cq_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<MemoryRegion> mem_;
  std::unique_ptr<QueuePair> ctrl_;
  std::vector<std::unique_ptr<QueuePair>> qps_;
  RemoteRegion peer_;
  uint64_t slot_ = 0;
  uint64_t until_signal_ = 1;  // post_one: WRs left until the next signaled one
  uint32_t inline_ = 0;
  uint64_t cur_size_ = 0;
  bool end_seen_ = false;
  double passive_limit_s_ = 30;
  bool ctrl_send_done_ = false;
  CtrlMsg pending_[kCtrlRecvs];
  uint32_t pending_head_ = 0, pending_count_ = 0;
  Counters counters_;
  std::vector<uint32_t> recv_outstanding_;
  std::vector<uint64_t> posted_, completed_, limit_, imm_expected_;
  std::vector<SendWr> wrs_;
  std::vector<RecvWr> recv_wrs_;
  std::vector<uint64_t> lat_ticks_;
  std::vector<uint64_t> stamps_, stamp_ops_;
};

}  // namespace

int run_server(const Options& options, int port_fd) {
  Session session(options, true);
  session.open();
  auto listener = session.listen(fmt::format("{}:{}", options.bind, options.port));
  if (port_fd >= 0) {
    const uint16_t port = listener->port();
    if (::write(port_fd, &port, sizeof port) != sizeof port)
      fail("cannot report the port");
    ::close(port_fd);
  } else {
    std::fprintf(stderr, "rdmakit-perf: server on %s, waiting for a client\n",
                 listener->address().c_str());
  }
  session.server_accept(*listener);
  session.serve();
  return 0;
}

int run_client(const Options& options) {
  Session session(options, false);
  session.open();
  session.client_connect(options.server);
  Reporter reporter(options);
  const RunInfo info = session.info();
  reporter.header(info);
  int failures = 0;
  for (size_t i = 0; i < options.sizes.size(); ++i) {
    reporter.progress(i, options.sizes.size(), options.sizes[i]);
    const Result r = session.client_step(options.sizes[i]);
    reporter.row(info, r);
    if (!r.verified) ++failures;
  }
  reporter.footer();
  session.client_quit();
  if (failures) {
    std::fprintf(stderr, "rdmakit-perf: %d result(s) failed the cross-check\n", failures);
  }
  return failures ? 2 : 0;
}

}  // namespace rdmakit::perf
