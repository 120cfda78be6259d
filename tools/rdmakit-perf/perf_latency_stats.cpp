// The end of a latency run on the client: End and the server's Result, the
// cross-check, and the statistics of the samples.
#include <algorithm>
#include <cmath>

#include "perf_clock.hpp"
#include "perf_run.hpp"

namespace rdmakit::perf {
namespace {

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
  s.avg = sum / static_cast<double>(n);
  s.stdev = std::sqrt(std::max(0.0, sq / static_cast<double>(n) - s.avg * s.avg));
  auto pct = [&](double p) {
    size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(n)));
    return us(ticks[std::min(n - 1, k == 0 ? 0 : k - 1)]);
  };
  s.p99 = pct(0.99);
  s.p999 = pct(0.999);
  return s;
}

}  // namespace

// Client: End, Result, checks, latency statistics. `n` samples follow from
// n + 1 iteration start stamps.
Result PerfRun::client_finish_lat(uint64_t size, uint64_t n, double scale,
                                  double seconds) {
  CtrlMsg end;
  end.type = Ctrl::kEnd;
  end.posted = counters_.posted;
  end.bytes = counters_.bytes;
  ctrl_.send(end);
  const CtrlMsg res = ctrl_.recv();
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

}  // namespace rdmakit::perf
