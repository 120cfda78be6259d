// read_lat, atomic_lat and write_cpl_lat: the client posts one signaled WR
// and polls it to completion, one at a time; the server only lets it work.
#include "perf_clock.hpp"
#include "perf_run.hpp"

namespace rdmakit::perf {

Result PerfRun::run_rtt(uint64_t size, uint64_t iterations, uint64_t duration_ns) {
  Watchdog wd(o_.timeout_s, fmt::format("{} size {}", test_name(s_.test), size),
              s_.event);
  SendWr wr = make_wr(0, size);
  uint64_t* t = lat_ticks_.data();
  const uint64_t cap = iterations ? iterations : kMaxLatSamples;
  const uint64_t t0 = Clock::now();
  const uint64_t deadline = iterations ? UINT64_MAX : t0 + Clock::ticks(duration_ns);
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
    if (cas) set_swap_operands(wr, i);
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
Result PerfRun::run_passive(uint64_t) {
  Watchdog wd(passive_limit_s_, "waiting for the client's End", s_.event);
  Completion c[16];
  CtrlMsg m;
  uint32_t turn = 0;
  for (;;) {
    // Polling the data CQ drives the tcp provider's target side.
    const int n = poll_target(c);
    for (int i = 0; i < n; ++i) on_completion(c[i]);
    if ((++turn & 255) == 0 || idle_target()) {
      if (ctrl_.try_recv(&m)) break;
      ctrl_.check_peer();
    }
    wd.idle();
  }
  expect(m, Ctrl::kEnd);
  send_result(0, 0, 0);
  return Result{};
}

}  // namespace rdmakit::perf
