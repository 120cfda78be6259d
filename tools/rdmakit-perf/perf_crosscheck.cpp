// What the server reports after each size (Result) and what the client checks
// it against: counts of WRs, receives and bytes, the completions selective
// signaling must produce, and the contents of the target memory.
#include <algorithm>
#include <cstring>

#include "perf_run.hpp"

namespace rdmakit::perf {
namespace {

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

}  // namespace

void PerfRun::send_result(double bw_avg, double bw_peak, double msg_rate) {
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
  ctrl_.send(res);
}

// What the server reports about its target slots after a run.
uint64_t PerfRun::target_digest() const {
  const uint64_t size = cur_size_;
  uint64_t sum = 0;
  for (uint32_t q = 0; q < s_.num_qps; ++q) {
    if (is_atomic(s_.test)) {
      sum += load_counter(target(q));
    } else {
      sum += checksum(target(q), size);
    }
  }
  return sum;
}

// What the client expects the server's digest to be.
uint64_t PerfRun::expected_digest() const {
  const uint64_t size = cur_size_;
  uint64_t sum = 0;
  for (uint32_t q = 0; q < s_.num_qps; ++q) {
    if (is_atomic(s_.test)) {
      sum += expected_counter(posted_[q]);
    } else {
      sum += checksum(local(q), size);
    }
  }
  return sum;
}

Result PerfRun::base_result(uint64_t size, const CtrlMsg& res) const {
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
void PerfRun::verify(Result& r, const CtrlMsg& res) const {
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
  if (s_.bidirectional && consumes_recv(t) && counters_.recv_completions != res.posted) {
    why += fmt::format("client received {} messages, server posted {}; ",
                       counters_.recv_completions, res.posted);
  }
  if (counters_.errors)
    why += fmt::format("{} compare-and-swaps did not swap; ", counters_.errors);
  const bool memory_check = t == Test::kWriteBw || t == Test::kWriteLat ||
                            t == Test::kWriteCplLat || t == Test::kWriteImmBw ||
                            is_atomic(t);
  if (memory_check && counters_.posted > 0 && res.checksum != expected_digest()) {
    why += is_atomic(t) ? fmt::format("server counters sum to {}, expected {}; ",
                                      res.checksum, expected_digest())
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

}  // namespace rdmakit::perf
