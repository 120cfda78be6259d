#pragma once
// The control channel of a run: one SEND/RECV QP beside the data QPs, on its
// own CQ, that carries Start/Ready/End/Result/Quit (perf_wire.hpp). Its
// buffers are the control area at the start of the run's region.
#include <memory>

#include "perf_wire.hpp"

namespace rdmakit::perf {

class ControlChannel {
 public:
  explicit ControlChannel(double timeout_s) : timeout_s_(timeout_s) {}

  void open(Context& ctx);
  // Options of the control QP, for connect or accept.
  QpOptions qp_options();
  void attach(std::unique_ptr<QueuePair> qp) { qp_ = std::move(qp); }
  // Destroys the QP (the CQ goes with this object): the owner closes it
  // after its data QPs and before their region.
  void close() { qp_.reset(); }
  std::span<const std::byte> peer_private_data() const {
    return qp_->peer_private_data();
  }
  // Posts the control RECVs into `region`'s control area; before the peer
  // may speak.
  void start(MemoryRegion& region);
  // The data CQ, polled while waiting so that software providers progress
  // (and a data completion error surfaces).
  void set_data_cq(CompletionQueue* cq) { data_cq_ = cq; }

  // Non-blocking: a queued or newly arrived control message.
  bool try_recv(CtrlMsg* out);
  // Waits for the next message (timeout_s <= 0: the run's timeout, at least
  // 30 s).
  CtrlMsg recv(double timeout_s = -1);
  // Sends and waits for the SEND's completion; messages arriving meanwhile
  // are queued for try_recv / recv.
  void send(const CtrlMsg& m);
  // A waiting side notices a dead peer through the control QP's state.
  void check_peer() const;

 private:
  void post_recv(uint32_t i);
  // Handles one control completion; returns true if it delivered a message.
  bool take(const Completion& c, CtrlMsg* out);

  double timeout_s_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<QueuePair> qp_;
  MemoryRegion* region_ = nullptr;
  CompletionQueue* data_cq_ = nullptr;
  bool send_done_ = false;
  CtrlMsg pending_[kCtrlRecvs];
  uint32_t pending_head_ = 0, pending_count_ = 0;
};

void expect(const CtrlMsg& m, Ctrl type);

}  // namespace rdmakit::perf
