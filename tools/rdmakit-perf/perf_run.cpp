// Connection setup, the sweep of sizes and the preparation of each size; the
// measured loops are in the files of their test family (perf_run.hpp).
#include "perf_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace rdmakit::perf {
namespace {

using namespace std::chrono_literals;

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

void fill_pattern(std::byte* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<std::byte>((i * 131 + seed * 7 + 1) & 0xff);
  }
}

}  // namespace

PerfRun::~PerfRun() {
  qps_.clear();
  ctrl_.close();
}

void PerfRun::open() {
  ContextOptions co;
  co.provider = parse_provider(o_.provider);
  co.verbs.device = o_.device;
  ctx_ = Context::open(co);
  ctrl_.open(*ctx_);
}

// --- connection setup -------------------------------------------------------

void PerfRun::client_connect(const std::string& address) {
  s_ = o_.settings;
  allocate();
  const Hello pd = encode_hello(s_, mem_->remote());
  // A server running several tests listens anew for each one: retry a
  // refused connection for a bounded time.
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    try {
      ctrl_.attach(ctx_->connect(address, ctrl_.qp_options(), pd, 10s));
      break;
    } catch (const Error& e) {
      if (e.sys_errno() != ECONNREFUSED || std::chrono::steady_clock::now() > give_up)
        throw;
      std::this_thread::sleep_for(50ms);
    }
  }
  ctrl_.start(*mem_);
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

void PerfRun::server_accept(Listener& listener) {
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o_.accept_timeout_s * 1000));
  ctrl_.attach(listener.accept(ctrl_.qp_options(), timeout));
  const ClientHello hello = decode_hello(ctrl_.peer_private_data());
  s_ = hello.settings;
  // The ctrl QP was accepted before the region existed (its size comes
  // from the settings); ctrl RECVs are posted before any data QP is
  // accepted, and the client speaks only after those.
  allocate();
  ctrl_.start(*mem_);
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
  set_peer(hello.region);
  finish_setup();
}

QpOptions PerfRun::data_qp_options() {
  if (!cq_) {
    // One CQ for sends and receives of all data QPs: a single place to
    // poll or sleep on, also in event mode. Completions are told apart
    // by opcode.
    const uint32_t cap = s_.num_qps * (s_.tx_depth + s_.rx_depth) + 64;
    cq_ = ctx_->create_cq(CqOptions{.capacity = cap});
    ctrl_.set_data_cq(cq_.get());
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

void PerfRun::allocate() {
  slot_ = round_up(std::max<uint64_t>(s_.max_size, 64), 4096);
  const uint64_t total = kCtrlArea + 2 * slot_ * s_.num_qps;
  mem_ = ctx_->allocate(total, kAccessAll);
  // Touch every page now so no page fault lands in a measured loop.
  std::memset(mem_->data(), 0, total);
  lat_ticks_.clear();
}

void PerfRun::set_peer(const RemoteRegion& peer) {
  if (peer.length < kCtrlArea + 2 * slot_ * s_.num_qps) fail("peer region too small");
  peer_ = peer;
}

void PerfRun::finish_setup() {
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
SendWr PerfRun::scratch_write(uint64_t wr_id) const {
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
void PerfRun::reach_peer_region() {
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

// --- the sweep --------------------------------------------------------------

Result PerfRun::client_step(uint64_t size) {
  prepare(size);
  reserve_samples(o_.iterations);
  CtrlMsg start;
  start.type = Ctrl::kStart;
  start.size = size;
  start.iterations = o_.iterations;
  start.duration_ns = static_cast<uint64_t>(o_.duration_s * 1e9);
  ctrl_.send(start);
  expect(ctrl_.recv(), Ctrl::kReady);
  Result r = run(size, o_.iterations, start.duration_ns);
  return r;
}

void PerfRun::client_quit() {
  CtrlMsg quit;
  quit.type = Ctrl::kQuit;
  ctrl_.send(quit);
}

void PerfRun::serve() {
  for (;;) {
    const CtrlMsg m = ctrl_.recv(o_.accept_timeout_s);
    if (m.type == Ctrl::kQuit) return;
    if (m.type != Ctrl::kStart) fail("protocol: expected Start");
    if (m.size == 0 || m.size > s_.max_size) fail("protocol: size out of range");
    prepare(m.size);
    // Everything sized before Ready: a peer that starts at once must not
    // outrun a server still allocating (its RECVs would run out: RNR).
    reserve_samples(m.iterations);
    CtrlMsg ready;
    ready.type = Ctrl::kReady;
    ctrl_.send(ready);
    run(m.size, m.iterations, m.duration_ns);
  }
}

Result PerfRun::run(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
  // A side that only waits for the peer sees no progress of its own for
  // the whole run: bound it by the run's length (at 10 MB/s at worst).
  passive_limit_s_ =
      std::max(o_.timeout_s, 30.0) + static_cast<double>(duration_ns) / 1e9 +
      static_cast<double>(iterations) * static_cast<double>(size) * s_.num_qps / 1e7;
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

// --- per-size preparation ---------------------------------------------------

void PerfRun::prepare(uint64_t size) {
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
    if (is_atomic(t)) std::memset(local(q), 0, kAtomicSize);
    posted_[q] = completed_[q] = 0;
    imm_expected_[q] = 0;
    if (consumes_recv(t)) top_up_recvs(q);
  }
  counters_ = Counters{};
}

void PerfRun::top_up_recvs(uint32_t q) {
  while (recv_outstanding_[q] < s_.rx_depth) {
    const uint32_t n = std::min<uint32_t>(kRecvBatch, s_.rx_depth - recv_outstanding_[q]);
    post_recvs(q, n);
  }
}

void PerfRun::post_recvs(uint32_t q, uint32_t n) {
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

// Timestamp arrays for a run of `iterations` (0: duration mode), before the
// run starts. Latency samples come from one timestamp per iteration: delta of
// consecutive iteration starts, as perftest does.
void PerfRun::reserve_samples(uint64_t iterations) {
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

// --- the two ends -----------------------------------------------------------

int run_server(const Options& options, int port_fd) {
  PerfRun run(options, true);
  run.open();
  auto listener = run.listen(fmt::format("{}:{}", options.bind, options.port));
  if (port_fd >= 0) {
    const uint16_t port = listener->port();
    if (::write(port_fd, &port, sizeof port) != sizeof port)
      fail("cannot report the port");
    ::close(port_fd);
  } else {
    std::fprintf(stderr,
                 "rdmakit-perf: server on %s (provider %s), waiting for a client\n",
                 listener->address().c_str(), run.info().provider.c_str());
  }
  run.server_accept(*listener);
  run.serve();
  return 0;
}

int run_client(const Options& options) {
  PerfRun run(options, false);
  run.open();
  run.client_connect(options.server);
  Reporter reporter(options);
  const RunInfo info = run.info();
  reporter.header(info);
  int failures = 0;
  for (size_t i = 0; i < options.sizes.size(); ++i) {
    reporter.progress(i, options.sizes.size(), options.sizes[i]);
    const Result r = run.client_step(options.sizes[i]);
    reporter.row(info, r);
    if (!r.verified) ++failures;
  }
  reporter.footer();
  run.client_quit();
  if (failures) {
    std::fprintf(stderr, "rdmakit-perf: %d result(s) failed the cross-check\n", failures);
  }
  return failures ? 2 : 0;
}

}  // namespace rdmakit::perf
