// The timers, run by the progress thread once per tick (keepalive / 4,
// 5 .. 100 ms): liveness from message counts, keepalives, dead peers,
// linger, and the receives and readiness a stream left waiting.
#include <cerrno>
#include <cstdio>

#include "stream/engine.hpp"

namespace rdmakit::stream::detail {

void EngineImpl::timers(Clock::time_point now) noexcept {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i]) continue;
    const std::shared_ptr<StreamCore> keep = slots_[i];
    StreamCore& s = *keep;
    s.note_traffic(now);
    // Receives a batch left waiting: an idle stream gives them back here.
    if (s.error() == 0 && s.receives_waiting()) (void)flush_reposts(s);
    // A deferred readable signal whose read never came (a zero-length
    // read): the fd shows the data from here on.
    if (s.readiness_stale()) s.update();
    if (s.error() == 0) {
      if (s.linger_expired(now)) {
        s.fail(ETIMEDOUT, Status::kSuccess);
      } else if (s.silent_for(now) >= s.opt.peer_timeout) {
        std::fprintf(
            stderr, "rdmakit stream: peer %s (%s) silent for %lld ms: ETIMEDOUT\n",
            s.peer().c_str(), ctx->provider_name(),
            static_cast<long long>(
                std::chrono::duration_cast<std::chrono::milliseconds>(s.silent_for(now))
                    .count()));
        s.fail(ETIMEDOUT, Status::kSuccess);
      } else if (s.keepalive_due(now)) {
        (void)s.send_keepalive();
      }
    }
    pump(s);
    maybe_finalize(s);
  }
}

}  // namespace rdmakit::stream::detail
