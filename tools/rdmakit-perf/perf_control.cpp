#include "perf_control.hpp"

#include <algorithm>
#include <cstring>

#include "perf_check.hpp"

namespace rdmakit::perf {
namespace {

using namespace std::chrono_literals;

// A data completion outside a measured loop: only errors matter.
void handle_stray(const Completion& c) {
  check_completion(c);
  if (is_recv_opcode(c.opcode)) {
    fail("protocol: unexpected data receive outside a test");
  }
}

}  // namespace

void ControlChannel::open(Context& ctx) {
  cq_ = ctx.create_cq(CqOptions{.capacity = 64});
}

QpOptions ControlChannel::qp_options() {
  QpOptions q;
  q.send_cq = cq_.get();
  q.recv_cq = cq_.get();
  q.max_send_wr = 16;
  q.max_recv_wr = kCtrlRecvs;
  return q;
}

void ControlChannel::start(MemoryRegion& region) {
  region_ = &region;
  for (uint32_t i = 0; i < kCtrlRecvs; ++i) post_recv(i);
}

void ControlChannel::post_recv(uint32_t i) {
  check_post(qp_->post_recv(RecvWr{.wr_id = i,
                                   .addr = region_->data() + kCtrlSlot * (1 + i),
                                   .length = kCtrlSlot,
                                   .lkey = region_->lkey()}),
             "control RECV");
}

bool ControlChannel::take(const Completion& c, CtrlMsg* out) {
  check_completion(c);
  if (c.opcode != Opcode::kRecv) {
    send_done_ = true;
    return false;
  }
  const uint32_t i = static_cast<uint32_t>(c.wr_id);
  if (i >= kCtrlRecvs || c.byte_len != sizeof(CtrlMsg))
    fail("protocol: bad control message");
  std::memcpy(out, region_->data() + kCtrlSlot * (1 + i), sizeof(CtrlMsg));
  post_recv(i);
  return true;
}

bool ControlChannel::try_recv(CtrlMsg* out) {
  if (pending_count_ > 0) {
    *out = pending_[pending_head_];
    pending_head_ = (pending_head_ + 1) % kCtrlRecvs;
    --pending_count_;
    return true;
  }
  Completion c;
  while (cq_->poll({&c, 1}) == 1) {
    if (take(c, out)) return true;
  }
  return false;
}

CtrlMsg ControlChannel::recv(double timeout_s) {
  Watchdog wd(timeout_s > 0 ? timeout_s : std::max(timeout_s_, 30.0),
              "waiting for the peer's control message", true);
  CtrlMsg m;
  for (;;) {
    if (try_recv(&m)) return m;
    // Keep polling the data CQ too: software providers progress there.
    Completion c[16];
    const int n = data_cq_ ? data_cq_->poll(c) : 0;
    for (int i = 0; i < n; ++i) handle_stray(c[i]);
    Completion cc;
    if (cq_->wait({&cc, 1}, 2ms) == 1) {
      if (take(cc, &m)) return m;
    }
    wd.idle();
  }
}

void ControlChannel::send(const CtrlMsg& m) {
  std::memcpy(region_->data(), &m, sizeof m);
  send_done_ = false;
  check_post(qp_->post_send(SendWr{.wr_id = 1000,
                                   .opcode = Opcode::kSend,
                                   .flags = kSignaled,
                                   .length = sizeof(CtrlMsg),
                                   .local_addr = region_->data(),
                                   .lkey = region_->lkey()}),
             "control SEND");
  Watchdog wd(std::max(timeout_s_, 30.0), "sending a control message", true);
  while (!send_done_) {
    Completion c;
    if (cq_->wait({&c, 1}, 2ms) == 1) {
      CtrlMsg in;
      if (take(c, &in)) {
        if (pending_count_ == kCtrlRecvs) fail("protocol: too many control messages");
        pending_[(pending_head_ + pending_count_) % kCtrlRecvs] = in;
        ++pending_count_;
      }
    }
    wd.idle();
  }
}

void ControlChannel::check_peer() const {
  if (qp_->state() != QpState::kConnected) {
    fail(fmt::format("peer lost (control QP {})", qp_state_name(qp_->state())));
  }
}

void expect(const CtrlMsg& m, Ctrl type) {
  if (m.type != type) {
    fail(fmt::format("protocol: expected message {}, got {}", static_cast<int>(type),
                     static_cast<int>(m.type)));
  }
}

}  // namespace rdmakit::perf
