// The receiver's slot intake: each slot that arrives, on any lane, has its
// header and records hash checked on the thread that took its notification
// (lane 0: the control thread; every other lane: a thread of its own) and is
// filed in the reorder window for the writer, or nacked.
#include <cstdio>
#include <cstring>
#include <string>

#include "receiver.hpp"
#include "records.hpp"

namespace rdmakit::cp {

bool Receiver::on_chunk(uint32_t lane, uint32_t slot) {
  SlotHeader h{};
  if (slot < kSlots) std::memcpy(&h, slot_mem(lane, slot), sizeof h);
  const std::string where = lanes_.size() == 1 ? std::string()
                                               : " on lane " + std::to_string(lane) +
                                                     " (" + lanes_[lane].peer + ")";
  if (slot >= kSlots || h.magic != kSlotMagic || h.payload_len > kSlotPayload) {
    fatal(Failure::kPeer, "protocol error: malformed chunk header" + where, true);
    return false;
  }
  const std::byte* payload = slot_mem(lane, slot) + sizeof h;
  // The records only (no file data): the writer checks the data, once,
  // as it writes it.
  bool parsed = false;
  const uint64_t records =
      records_hash(std::span<const std::byte>(payload, h.payload_len), &parsed);
  if (!parsed || records != h.records_hash) {
    c_.report->chunks_resent++;
    std::fprintf(stderr,
                 "rdmakit-cp: chunk %u%s: records failed verification (xxh3); asking "
                 "again\n",
                 h.seq, where.c_str());
    send_ack(lane, slot, h.seq, false);
    return true;
  }
  c_.report->chunks++;
  ReorderWindow::Put put = ReorderWindow::Put::kOk;
  {
    std::lock_guard lock(mu_);
    // Any sequence number outside the window, or one filed already, is a
    // lying peer (it could overwrite a slot the writer has not applied).
    put = window_.put(h.seq, {lane, slot});
    cv_.notify_all();
  }
  if (put != ReorderWindow::Put::kOk) {
    fatal(Failure::kPeer,
          "protocol error: chunk sequence " + std::to_string(h.seq) +
              (put == ReorderWindow::Put::kDuplicate ? " twice" : " out of order") +
              where,
          true);
    return false;
  }
  return true;
}

// An extra lane carries slots only: anything else on it is a protocol
// error, and its loss ends the transfer with the lane and peer named.
void Receiver::lane_loop(uint32_t lane) {
  session::Channel* ch = lanes_[lane].channel;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (writer_done_ || abort_) return;
    }
    // A recv cannot be woken: short waits, so that the copy's end (joined
    // on this thread) is not late by a long one begun before it.
    session::Message m;
    const session::OpResult r = ch->recv(&m, std::chrono::milliseconds(5));
    if (r.code == session::Errc::kTimeout) continue;
    if (!r.ok()) {
      {
        std::unique_lock lock(mu_);
        // The sender closes its lanes as soon as it has the final report.
        cv_.wait_for(lock, std::chrono::milliseconds(500),
                     [&] { return writer_done_ || abort_; });
        if (writer_done_ || abort_) return;
      }
      std::string detail = r.detail;
      if (ch->endpoint().closed()) detail = ch->endpoint().disconnect_info().detail;
      fatal(
          Failure::kPeer,
          "lane " + std::to_string(lane) + " (" + lanes_[lane].peer + ") gone: " + detail,
          true);
      return;
    }
    if (!m.is_notification()) {
      fatal(Failure::kPeer,
            "protocol error: a message on lane " + std::to_string(lane) + " (" +
                lanes_[lane].peer + "), which carries slots only",
            true);
      return;
    }
    const uint32_t slot = m.imm();
    m.release();
    if (!on_chunk(lane, slot)) return;
  }
}

}  // namespace rdmakit::cp
