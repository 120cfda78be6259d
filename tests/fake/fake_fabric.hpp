#pragma once
// The fake provider's shared state (fake_provider.hpp): one fabric per
// process, one lock around all of it (a test tool: simple before fast), and
// a ticker thread for what time decides (RNR and peer-death deadlines).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_provider.hpp"

namespace rdmakit::fake {

using Clock = std::chrono::steady_clock;

struct CqCore {
  struct Entry {
    Completion c;
    uint32_t retire = 0;  // send queue slots this completion frees when polled
  };
  std::deque<Entry> ring;
  bool armed = false;
  int efd = -1;
  bool alive = true;
};

struct SrqCore {
  std::deque<RecvWr> rq;
  uint32_t max_wr = 0;
};

struct Region {
  uintptr_t addr = 0;
  size_t length = 0;
  uint32_t access = 0;
  uint32_t ctx = 0;
};

struct PendingSend {
  SendWr wr;
  std::vector<std::byte> inline_copy;
  Clock::time_point deadline{};  // its RNR retries run out then (unset: not waiting)
  bool refused = false;          // refuse_recvs(): no RECV will do
};

struct QpCore {
  uint32_t num = 0;
  uint32_t ctx = 0;
  std::shared_ptr<CqCore> send_cq, recv_cq;
  std::shared_ptr<SrqCore> srq;
  std::deque<RecvWr> rq;
  std::deque<PendingSend> sq;
  uint32_t max_send = 0, max_recv = 0;
  uint32_t sq_used = 0;     // posted and not retired by a polled completion
  uint32_t unsignaled = 0;  // executed unsignaled requests since the last signaled one
  QpState state = QpState::kConnected;
  std::weak_ptr<QpCore> peer;
  std::chrono::milliseconds rnr_timeout{1000}, peer_timeout{2000};
  bool dead = false;              // its process is gone: does nothing more
  bool frozen = false;            // its process is stopped: sends wait, completions held
  Clock::time_point peer_gone{};  // when its peer died or was destroyed
  bool peer_gone_set = false;
  uint64_t executed = 0;
  uint64_t kill_at = UINT64_MAX;
  uint32_t refuse = 0;
  bool connector = false;  // made by Context::connect (else by an accept)
};

struct ConnRequest {
  std::vector<std::byte> private_data, reply;
  std::shared_ptr<QpCore> client, server;
  std::string client_address;
  bool accepted = false;
  bool abandoned = false;
};

struct ListenerCore {
  std::deque<std::shared_ptr<ConnRequest>> pending;
};

class Fabric {
 public:
  static Fabric& get();

  std::mutex mu;
  std::condition_variable cv;  // connection requests and answers
  ProviderKind masquerade = ProviderKind::kShm;
  uint32_t next_qp = 1, next_key = 1, next_ctx = 1, next_port = 20000;
  std::map<uint32_t, std::shared_ptr<QpCore>> qps;
  std::map<uint32_t, Region> regions;  // key -> region (lkey == rkey)
  std::map<uint16_t, ListenerCore*> listeners;
  CompletionFilter filter;
  // How long a QP takes to learn its peer died (0: its own peer_timeout, as
  // a transport's retries; shorter: as shm learns it from a closed socket).
  std::chrono::milliseconds death_notice{0};
  struct Held {
    std::weak_ptr<CqCore> cq;
    CqCore::Entry e;
  };
  std::vector<Held> held;

  // All below: mu held.
  void push(const std::shared_ptr<CqCore>& cq, const Completion& c, uint32_t retire);
  void deliver(CqCore& cq, const CqCore::Entry& e);
  // Runs the QP's queued send requests until one must wait.
  void progress(QpCore& qp);
  void to_error(QpCore& qp);
  void kill_locked(QpCore& qp);
  void tick(Clock::time_point now);
  bool local_ok(uint32_t ctx, const SendWr& wr) const;
  const Region* remote_region(uint32_t ctx, uint32_t rkey, uint64_t addr, uint64_t len,
                              uint32_t need) const;

  void start_ticker();
  void stop_ticker();

 private:
  enum class Step { kDone, kWait };
  Step execute(QpCore& qp, PendingSend& p);
  void complete_send(QpCore& qp, const PendingSend& p, Status st);
  bool take_recv(QpCore& target, RecvWr* out);

  std::thread ticker_;
  bool stop_ = false;
};

}  // namespace rdmakit::fake
