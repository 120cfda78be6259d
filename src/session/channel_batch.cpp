// Batches: many WRITEs to one remote buffer posted as lists, one doorbell
// each, with one callback for the whole batch.
#include <array>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>

#include "channel_core.hpp"
#include "engine.hpp"
#include "fmt/format.h"
#include "wire.hpp"

namespace rdmakit::session {

using detail::ChannelCore;
using detail::core;
using detail::WrKind;
using Clock = std::chrono::steady_clock;

OpResult Channel::write_batch(const RemoteBuffer& remote,
                              std::span<const WriteSegment> segments, OpCallback done) {
  ChannelCore& c = core(*this);
  const char* what = "WRITE";
  if (!remote) {
    return c.fail(Errc::kNoSuchBuffer, what,
                  "the remote buffer handle is empty (unresolved)");
  }
  const RemoteRegion& region = remote.region();
  for (const WriteSegment& s : segments) {
    if (s.offset > region.length || s.length > region.length - s.offset) {
      return c.fail(Errc::kOutOfRange, what,
                    fmt::format("[{}, +{}) is outside the peer's buffer '{}' of {} bytes",
                                s.offset, s.length, remote.name(), region.length));
    }
    if (s.src.addr == nullptr || s.length > s.src.length || s.length > UINT32_MAX) {
      return c.fail(Errc::kOutOfRange, what,
                    std::to_string(s.length) + " bytes do not fit the local buffer of " +
                        std::to_string(s.src.length) + " bytes");
    }
  }
  if (segments.empty()) {
    if (done) done(OpResult{});
    return {};
  }
  // Posted in lists of up to kList; only the very last WR carries `done`.
  constexpr size_t kList = 32;
  const bool with_callback = static_cast<bool>(done);
  std::array<SendWr, kList> wrs;
  std::unique_lock lock(c.mu_);
  Clock::time_point deadline{};
  size_t next = 0;
  for (uint32_t spins = 0; next < segments.size();) {
    if (c.closed_) return c.closed_result(what);
    const size_t n = std::min(kList, segments.size() - next);
    const bool has_last = next + n == segments.size();
    ChannelCore::Pending* entry = nullptr;
    uint32_t entry_index = 0;
    if (has_last && with_callback) {
      entry_index = c.next_pending_ % static_cast<uint32_t>(c.pending_.size());
      entry = &c.pending_[entry_index];
    }
    OpResult blocked;
    size_t posted = 0;
    if (entry != nullptr && entry->busy) {
      blocked = c.fail(Errc::kQueueFull, what,
                       std::to_string(c.pending_.size()) + " operations outstanding");
    } else {
      uint32_t unsignaled = c.unsignaled_;
      for (size_t i = 0; i < n; ++i) {
        const WriteSegment& s = segments[next + i];
        const bool with_done = entry != nullptr && i + 1 == n;
        const bool signaled = with_done || unsignaled + 1 >= detail::kSignalEvery;
        unsignaled = signaled ? 0 : unsignaled + 1;
        wrs[i] = SendWr{.wr_id = c.wr_id_for(with_done ? WrKind::kOp : WrKind::kOpQuiet,
                                             with_done ? entry_index : 0),
                        .opcode = Opcode::kWrite,
                        .flags = static_cast<uint8_t>(signaled ? kSignaled : 0),
                        .length = static_cast<uint32_t>(s.length),
                        .local_addr = s.src.addr,
                        .lkey = s.src.lkey,
                        .remote_addr = region.addr_at(s.offset),
                        .rkey = region.rkey};
      }
      const PostResult pr = c.qp_->post_send(std::span<const SendWr>(wrs.data(), n));
      posted = pr.posted;
      for (size_t i = 0; i < posted; ++i) {
        c.unsignaled_ = (wrs[i].flags & kSignaled) != 0 ? 0 : c.unsignaled_ + 1;
      }
      next += posted;
      if (posted == n && entry != nullptr) {
        ++c.next_pending_;
        entry->busy = true;
        entry->kind = static_cast<uint8_t>(WrKind::kOp);
        entry->opcode = Opcode::kWrite;
        entry->done = std::move(done);
        break;  // that was the last list
      }
      if (!pr.ok() && pr.status != PostStatus::kQueueFull) {
        return c.fail(Errc::kInvalid, what,
                      fmt::format("post failed after {} of {} WRITEs: {}", next,
                                  segments.size(), post_status_name(pr.status)));
      }
      if (posted == n) continue;
      blocked = c.fail(Errc::kQueueFull, what, "send queue full");
    }
    // Queue full: make progress, then post the rest.
    if (posted > 0) spins = 0;
    if (spins == 0) {
      deadline = Clock::now() + c.op_timeout();
    } else if (Clock::now() >= deadline) {
      blocked.detail += fmt::format(" ({} of {} WRITEs posted)", next, segments.size());
      return blocked;
    }
    ++spins;
    lock.unlock();
    c.progress_or_pause(spins);
    lock.lock();
  }
  return {};
}

}  // namespace rdmakit::session
