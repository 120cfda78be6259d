// send_lat and write_lat: ping-pong between the two ends, half round trip.
// send_lat answers each SEND with a SEND; write_lat answers a WRITE with a
// WRITE, each end polling the last byte of its target slot for the stamp of
// the peer's iteration, as perftest does.
#include <atomic>

#include "perf_clock.hpp"
#include "perf_run.hpp"
#include "rdmakit/detail/tsan.hpp"

namespace rdmakit::perf {
namespace {

// write_lat polls a byte that the peer's WRITE lands in, as perftest does.
// On a NIC that is DMA; on tcp it is the provider's receive thread doing a
// memcpy, which ThreadSanitizer reports: rdmakit (like verbs) orders WRITE
// data only through completions, and this poll is the benchmark's deliberate
// shortcut. Only that load and the stamp store are hidden from TSan.
uint8_t load_polled(uint8_t* p) noexcept {
#ifdef RDMAKIT_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  const uint8_t v = std::atomic_ref<uint8_t>(*p).load(std::memory_order_acquire);
#ifdef RDMAKIT_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  return v;
}

void store_stamp(uint8_t* p, uint8_t v) noexcept {
#ifdef RDMAKIT_TSAN
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  std::atomic_ref<uint8_t>(*p).store(v, std::memory_order_relaxed);
#ifdef RDMAKIT_TSAN
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
}

}  // namespace

Result PerfRun::run_pingpong(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
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
        if (*end_count == UINT64_MAX && ctrl_.try_recv(&m)) {
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

  uint64_t* t = lat_ticks_.data();
  const uint64_t cap = iterations ? iterations : kMaxLatSamples;
  const uint64_t t0 = Clock::now();
  const uint64_t deadline = iterations ? UINT64_MAX : t0 + Clock::ticks(duration_ns);
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

// Posts one data WR on QP 0 with selective signaling; makes room first.
void PerfRun::post_one(SendWr& wr, uint64_t idx, bool last) {
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
  wr.flags = static_cast<uint8_t>(sig ? (wr.flags | kSignaled) : (wr.flags & ~kSignaled));
  if (wr.opcode == Opcode::kCompareSwap) set_swap_operands(wr, idx);
  check_post(qps_[0]->post_send(wr), "data WR");
  last_wr_signaled_ = sig;
  ++posted_[0];
  ++counters_.posted;
  counters_.bytes += wr.length;
}

// After a run that ended on an unsignaled WR: post a signaled WRITE to the
// peer's scratch so the send queue drains completely. A run whose last WR was
// signaled needs none (an extra completion would be counted in the next size).
void PerfRun::flush_sq(uint32_t q) {
  if (posted_[q] == 0 || last_wr_signaled_) return;
  const SendWr wr = scratch_write((uint64_t{q} << kQpShift) | kFlushBit);
  Completion c[8];
  while (posted_[q] - completed_[q] >= s_.tx_depth) {
    const int n = cq_->poll(c);
    for (int i = 0; i < n; ++i) on_completion(c[i]);
  }
  check_post(qps_[q]->post_send(wr), "flush WRITE");
}

// Reaps the send queue after the loop so that every signaled WR is
// accounted for before the counts are reported.
void PerfRun::drain_sends(Watchdog& wd) {
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

// Server after its part of a ping-pong: all replies reaped, then End and
// Result.
void PerfRun::finish_server(Watchdog& wd) {
  drain_sends(wd);
  // End may have been consumed already in duration mode; wait otherwise.
  if (!end_seen_) {
    const CtrlMsg m = ctrl_.recv();
    expect(m, Ctrl::kEnd);
  }
  end_seen_ = false;
  send_result(0, 0, 0);
}

}  // namespace rdmakit::perf
