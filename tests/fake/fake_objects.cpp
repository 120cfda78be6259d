// The fake provider's objects (fake_provider.hpp): each a thin handle on
// the fabric's state, every call under the fabric's lock.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fake_fabric.hpp"
#include "rdmakit/error.hpp"
#include "rdmakit/testing.hpp"

namespace rdmakit::fake {
namespace {

constexpr const char* kName = "fake";

Fabric& fab() { return Fabric::get(); }

class FakeMr final : public MemoryRegion {
 public:
  FakeMr(void* addr, size_t length, uint32_t key, uint32_t access, ProviderKind kind,
         void* owned)
      : MemoryRegion(addr, length, key, key, access, kind), owned_(owned) {}
  ~FakeMr() override {
    {
      std::lock_guard lock(fab().mu);
      fab().regions.erase(lkey());
    }
    std::free(owned_);
  }

 private:
  void* owned_;
};

class FakeCq final : public CompletionQueue {
 public:
  explicit FakeCq(const CqOptions& o)
      : CompletionQueue(o), core_(std::make_shared<CqCore>()) {
    core_->efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (core_->efd < 0) throw Error("create_cq", kName, "", errno, "eventfd");
  }
  ~FakeCq() override {
    std::lock_guard lock(fab().mu);
    core_->alive = false;
    core_->ring.clear();
    ::close(core_->efd);
  }
  int poll(std::span<Completion> out) noexcept override {
    std::lock_guard lock(fab().mu);
    size_t n = 0;
    while (n < out.size() && !core_->ring.empty()) {
      const CqCore::Entry e = core_->ring.front();
      core_->ring.pop_front();
      out[n++] = e.c;
      if (e.retire == 0) continue;
      if (auto it = fab().qps.find(e.c.qp_num); it != fab().qps.end()) {
        QpCore& qp = *it->second;
        qp.sq_used -= std::min(e.retire, qp.sq_used);
      }
    }
    return static_cast<int>(n);
  }
  int fd() const noexcept override { return core_->efd; }
  bool arm() noexcept override {
    std::lock_guard lock(fab().mu);
    uint64_t v = 0;
    (void)::read(core_->efd, &v, sizeof v);
    if (!core_->ring.empty()) return false;
    core_->armed = true;
    return true;
  }
  const std::shared_ptr<CqCore>& core() const { return core_; }

 private:
  std::shared_ptr<CqCore> core_;
};

class FakeSrq final : public SharedReceiveQueue {
 public:
  explicit FakeSrq(const SrqOptions& o)
      : SharedReceiveQueue(o), core_(std::make_shared<SrqCore>()) {
    core_->max_wr = o.max_wr;
  }
  const std::shared_ptr<SrqCore>& core() const { return core_; }

 protected:
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override {
    std::lock_guard lock(fab().mu);
    uint32_t n = 0;
    for (const RecvWr& r : wrs) {
      if (core_->rq.size() >= core_->max_wr) return {PostStatus::kQueueFull, n};
      core_->rq.push_back(r);
      ++n;
    }
    for (auto& [num, qp] : fab().qps) {  // senders waiting for a RECV of this SRQ
      if (auto peer = qp->peer.lock(); peer && peer->srq == core_) fab().progress(*qp);
    }
    return {PostStatus::kOk, n};
  }

 private:
  std::shared_ptr<SrqCore> core_;
};

PostStatus check(const SendWr& wr, uint32_t max_inline) {
  const bool inl = (wr.flags & kInline) != 0;
  switch (wr.opcode) {
    case Opcode::kSend:
    case Opcode::kSendWithImm:
    case Opcode::kWrite:
    case Opcode::kWriteWithImm:
      if (inl && wr.length > max_inline) return PostStatus::kInlineTooLarge;
      break;
    case Opcode::kRead:
      if (inl) return PostStatus::kInvalidArgument;
      break;
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      if (inl || wr.length != 8 || wr.remote_addr % 8 != 0)
        return PostStatus::kInvalidArgument;
      break;
    default: return PostStatus::kInvalidArgument;
  }
  if (wr.length > 0 && wr.local_addr == nullptr) return PostStatus::kInvalidArgument;
  return PostStatus::kOk;
}

class FakeQp final : public QueuePair {
 public:
  FakeQp(std::shared_ptr<QpCore> core, const QpOptions& o, std::string peer,
         std::vector<std::byte> pd)
      : QueuePair(core->num, o, std::move(peer), std::move(pd)), core_(std::move(core)) {}
  ~FakeQp() override {
    std::lock_guard lock(fab().mu);
    fab().kill_locked(*core_);  // to its peer, a destroyed QP is a gone one
    core_->sq.clear();
    fab().qps.erase(core_->num);
  }
  QpState state() const noexcept override {
    std::lock_guard lock(fab().mu);
    return core_->state;
  }

 protected:
  PostResult do_post_send(std::span<const SendWr> wrs) noexcept override {
    std::lock_guard lock(fab().mu);
    uint32_t n = 0;
    PostStatus st = PostStatus::kOk;
    for (const SendWr& wr : wrs) {
      st = check(wr, options_.max_inline);
      if (st != PostStatus::kOk) break;
      if (core_->sq_used >= core_->max_send) {
        st = PostStatus::kQueueFull;
        break;
      }
      PendingSend p;
      p.wr = wr;
      if ((wr.flags & kInline) != 0 && wr.length > 0) {
        const auto* b = static_cast<const std::byte*>(wr.local_addr);
        p.inline_copy.assign(b, b + wr.length);
      }
      ++core_->sq_used;
      core_->sq.push_back(std::move(p));
      ++n;
    }
    fab().progress(*core_);
    return {st, n};
  }
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override {
    std::lock_guard lock(fab().mu);
    if (core_->srq) return {PostStatus::kInvalidArgument, 0};
    uint32_t n = 0;
    for (const RecvWr& r : wrs) {
      if (core_->rq.size() >= core_->max_recv) return {PostStatus::kQueueFull, n};
      if (core_->state == QpState::kError && !core_->dead) {
        Completion c;
        c.wr_id = r.wr_id;
        c.qp_num = core_->num;
        c.opcode = Opcode::kRecv;
        c.status = Status::kWrFlushError;
        fab().push(core_->recv_cq, c, 0);
      } else {
        core_->rq.push_back(r);
      }
      ++n;
    }
    if (auto peer = core_->peer.lock()) fab().progress(*peer);
    return {PostStatus::kOk, n};
  }

 private:
  std::shared_ptr<QpCore> core_;
};

std::shared_ptr<CqCore> cq_core(CompletionQueue* cq) {
  auto* f = dynamic_cast<FakeCq*>(cq);
  if (f == nullptr)
    throw Error("create_qp", kName, "", EINVAL, "a fake QP needs fake CQs");
  return f->core();
}

// mu held.
std::shared_ptr<QpCore> new_core(uint32_t ctx, const QpOptions& o) {
  auto core = std::make_shared<QpCore>();
  core->num = fab().next_qp++;
  core->ctx = ctx;
  core->send_cq = cq_core(o.send_cq);
  core->recv_cq = cq_core(o.recv_cq);
  if (o.srq != nullptr) {
    auto* s = dynamic_cast<FakeSrq*>(o.srq);
    if (s == nullptr)
      throw Error("create_qp", kName, "", EINVAL, "a fake QP needs a fake SRQ");
    core->srq = s->core();
  }
  core->max_send = o.max_send_wr;
  core->max_recv = o.max_recv_wr;
  core->rnr_timeout = o.rnr_timeout;
  core->peer_timeout = o.peer_timeout;
  fab().qps[core->num] = core;
  return core;
}

uint16_t port_of(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos)
    throw Error("address", kName, address, EINVAL, "no port");
  return static_cast<uint16_t>(std::strtoul(address.c_str() + colon + 1, nullptr, 10));
}

class FakeListener final : public Listener {
 public:
  FakeListener(uint32_t ctx, std::string host, uint16_t port)
      : ctx_(ctx), host_(std::move(host)), port_(port) {}
  ~FakeListener() override {
    std::lock_guard lock(fab().mu);
    fab().listeners.erase(port_);
    for (auto& r : core_.pending) r->abandoned = true;
    fab().cv.notify_all();
  }
  std::unique_ptr<QueuePair> accept(const QpOptions& o, std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override {
    std::unique_lock lock(fab().mu);
    const auto until = Clock::now() + timeout;
    for (;;) {
      while (!core_.pending.empty() && core_.pending.front()->abandoned)
        core_.pending.pop_front();
      if (!core_.pending.empty()) break;
      if (fab().cv.wait_until(lock, until) == std::cv_status::timeout &&
          core_.pending.empty())
        throw Error("accept", kName, address(), ETIMEDOUT, "no connection request");
    }
    auto req = core_.pending.front();
    core_.pending.pop_front();
    auto server = new_core(ctx_, o);
    server->peer = req->client;
    req->client->peer = server;
    req->reply.assign(reply.begin(), reply.end());
    req->server = server;
    req->accepted = true;
    fab().cv.notify_all();
    return std::make_unique<FakeQp>(server, o, req->client_address, req->private_data);
  }
  std::string address() const override { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const override { return port_; }
  ListenerCore* core() { return &core_; }

 private:
  uint32_t ctx_;
  std::string host_;
  uint16_t port_;
  ListenerCore core_;
};

class FakeContext final : public Context {
 public:
  explicit FakeContext(ProviderKind kind) : Context(kind), kind_(kind) {
    std::lock_guard lock(fab().mu);
    id_ = fab().next_ctx++;
  }
  std::string device_name() const override { return kName; }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override {
    return add_region(addr, length, access, nullptr);
  }
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override {
    const size_t rounded = (std::max<size_t>(length, 1) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) throw Error("allocate", kName, "", ENOMEM, "aligned_alloc");
    std::memset(p, 0, rounded);
    return add_region(p, length, access, p);
  }
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& o) override {
    return std::make_unique<FakeCq>(o);
  }
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& o) override {
    return std::make_unique<FakeSrq>(o);
  }
  std::unique_ptr<Listener> listen(const std::string& address) override {
    std::lock_guard lock(fab().mu);
    uint16_t port = port_of(address);
    if (port == 0) {
      while (fab().listeners.count(fab().next_port) != 0) ++fab().next_port;
      port = static_cast<uint16_t>(fab().next_port++);
    } else if (fab().listeners.count(port) != 0) {
      throw Error("listen", kName, address, EADDRINUSE, "port taken");
    }
    auto l =
        std::make_unique<FakeListener>(id_, address.substr(0, address.rfind(':')), port);
    fab().listeners[port] = l->core();
    return l;
  }
  std::unique_ptr<QueuePair> connect(const std::string& address, const QpOptions& o,
                                     std::span<const std::byte> pd,
                                     std::chrono::milliseconds timeout) override {
    std::unique_lock lock(fab().mu);
    auto it = fab().listeners.find(port_of(address));
    if (it == fab().listeners.end())
      throw Error("connect", kName, address, ECONNREFUSED, "nothing listens there");
    auto req = std::make_shared<ConnRequest>();
    req->private_data.assign(pd.begin(), pd.end());
    req->client = new_core(id_, o);
    req->client->connector = true;
    req->client_address = "fake-client:" + std::to_string(req->client->num);
    it->second->pending.push_back(req);
    fab().cv.notify_all();
    const bool answered =
        fab().cv.wait_for(lock, timeout, [&] { return req->accepted || req->abandoned; });
    if (!answered || !req->accepted) {
      req->abandoned = true;
      fab().qps.erase(req->client->num);
      throw Error("connect", kName, address, answered ? ECONNREFUSED : ETIMEDOUT,
                  answered ? "the listener closed" : "not accepted in time");
    }
    return std::make_unique<FakeQp>(req->client, o, address, req->reply);
  }

 private:
  std::unique_ptr<MemoryRegion> add_region(void* addr, size_t length, uint32_t access,
                                           void* owned) {
    std::lock_guard lock(fab().mu);
    const uint32_t key = fab().next_key++;
    fab().regions[key] = Region{reinterpret_cast<uintptr_t>(addr), length, access, id_};
    return std::make_unique<FakeMr>(addr, length, key, access, kind_, owned);
  }

  ProviderKind kind_;
  uint32_t id_ = 0;
};

std::unique_ptr<Context> make_context(const ContextOptions& /*options*/) {
  ProviderKind kind;
  {
    std::lock_guard lock(fab().mu);
    kind = fab().masquerade;
  }
  return std::make_unique<FakeContext>(kind);
}

void clear_faults() {
  std::lock_guard lock(fab().mu);
  fab().filter = nullptr;
  fab().held.clear();
  fab().death_notice = std::chrono::milliseconds(0);
}

}  // namespace

Scope::Scope(ProviderKind masquerade) {
  clear_faults();
  {
    std::lock_guard lock(fab().mu);
    fab().masquerade = masquerade;
  }
  fab().start_ticker();
  testing::set_context_factory(&make_context);
}

Scope::~Scope() {
  testing::set_context_factory(nullptr);
  fab().stop_ticker();
  clear_faults();
}

void set_filter(CompletionFilter filter) {
  std::lock_guard lock(fab().mu);
  fab().filter = std::move(filter);
}

size_t release_held(bool reverse_qps) {
  std::lock_guard lock(fab().mu);
  auto held = std::move(fab().held);
  fab().held.clear();
  if (reverse_qps) {
    std::vector<uint32_t> order;
    for (const auto& h : held) {
      if (std::find(order.begin(), order.end(), h.e.c.qp_num) == order.end())
        order.push_back(h.e.c.qp_num);
    }
    std::stable_sort(held.begin(), held.end(), [&](const auto& a, const auto& b) {
      const auto pa = std::find(order.begin(), order.end(), a.e.c.qp_num) - order.begin();
      const auto pb = std::find(order.begin(), order.end(), b.e.c.qp_num) - order.begin();
      return pa > pb;
    });
  }
  size_t n = 0;
  for (const auto& h : held) {
    if (auto cq = h.cq.lock(); cq && cq->alive) {
      fab().deliver(*cq, h.e);
      ++n;
    }
  }
  return n;
}

size_t held_count() {
  std::lock_guard lock(fab().mu);
  return fab().held.size();
}

void set_death_notice(std::chrono::milliseconds notice) {
  std::lock_guard lock(fab().mu);
  fab().death_notice = notice;
}

void kill(uint32_t qp_num) {
  std::lock_guard lock(fab().mu);
  if (auto it = fab().qps.find(qp_num); it != fab().qps.end())
    fab().kill_locked(*it->second);
}

void kill_after(uint32_t qp_num, uint64_t send_requests) {
  std::lock_guard lock(fab().mu);
  if (auto it = fab().qps.find(qp_num); it != fab().qps.end())
    it->second->kill_at = it->second->executed + send_requests;
}

void refuse_recvs(uint32_t qp_num, uint32_t messages) {
  std::lock_guard lock(fab().mu);
  if (auto it = fab().qps.find(qp_num); it != fab().qps.end())
    it->second->refuse += messages;
}

void freeze(uint32_t qp_num) {
  std::lock_guard lock(fab().mu);
  if (auto it = fab().qps.find(qp_num); it != fab().qps.end()) it->second->frozen = true;
}

void thaw(uint32_t qp_num) {
  std::lock_guard lock(fab().mu);
  auto it = fab().qps.find(qp_num);
  if (it == fab().qps.end()) return;
  it->second->frozen = false;
  auto& held = fab().held;
  for (auto h = held.begin(); h != held.end();) {
    if (h->e.c.qp_num != qp_num) {
      ++h;
      continue;
    }
    if (auto cq = h->cq.lock(); cq && cq->alive) fab().deliver(*cq, h->e);
    h = held.erase(h);
  }
  fab().progress(*it->second);
}

uint64_t executed(uint32_t qp_num) {
  std::lock_guard lock(fab().mu);
  auto it = fab().qps.find(qp_num);
  return it != fab().qps.end() ? it->second->executed : 0;
}

std::vector<uint32_t> live_qps(Side side) {
  std::lock_guard lock(fab().mu);
  std::vector<uint32_t> out;
  for (const auto& [num, qp] : fab().qps) {
    if (qp->dead) continue;
    if (side == Side::kAny || qp->connector == (side == Side::kConnecting))
      out.push_back(num);
  }
  return out;
}

}  // namespace rdmakit::fake
