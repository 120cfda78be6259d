// Bandwidth tests (send_bw, write_bw, write_imm_bw, read_bw, atomic_bw): every
// send queue kept full with batched, selectively signaled posts; both ends run
// this loop (the server as a receiver, or as a second sender when
// bidirectional).
#include <algorithm>

#include "perf_clock.hpp"
#include "perf_run.hpp"

namespace rdmakit::perf {

Result PerfRun::run_bw(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
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
      (iterations || !sending) ? UINT64_MAX : t0 + Clock::ticks(duration_ns);
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
          if (w.opcode == Opcode::kCompareSwap) set_swap_operands(w, idx);
        }
        const PostResult pr = qps_[q]->post_send(std::span<const SendWr>(wrs_.data(), n));
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
      ctrl_.send(end);
      end_sent = true;
    }
    if (!peer_end && ((++turn & 63) == 0 || !active)) {
      CtrlMsg m;
      if ((turn & 4095) == 0) ctrl_.check_peer();
      if (ctrl_.try_recv(&m)) {
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
    msg_rate = static_cast<double>(ops) / seconds / 1e6;
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
    ctrl_.send(end);
  }
  const CtrlMsg res = ctrl_.recv();
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
double PerfRun::peak(size_t nstamps, uint64_t wr_len) const {
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
    const double bytes =
        static_cast<double>(stamp_ops_[j] - stamp_ops_[k]) * static_cast<double>(wr_len);
    best = std::max(best, bytes / (Clock::ns(stamps_[j] - stamps_[k]) / 1e9) / 1e6);
  }
  return best;
}

}  // namespace rdmakit::perf
