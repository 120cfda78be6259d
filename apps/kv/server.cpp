#include "server.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "fmt/format.h"

namespace rdmakit::kv {
namespace {

using namespace std::chrono_literals;

constexpr size_t kRecvStride = (kMaxRequest + 63) / 64 * 64;
constexpr size_t kSendStride = (kMaxResponse + 63) / 64 * 64;
constexpr uint32_t kQueueDepth = 2 * kMaxOutstanding;
// Listener::accept's timeout also bounds the handshake of a request that
// arrives near its end (that connection then fails on both sides; seen on
// verbs under emulation with a 200 ms window). So the acceptor waits in long
// windows, and stop_acceptor() wakes it by connecting to the server itself.
constexpr std::chrono::seconds kAcceptWindow{10};

// wr_id: connection id | send bit | slot. Completions of a connection already
// dropped carry an id no longer in the map and are ignored.
uint64_t make_wr_id(uint32_t id, bool send, uint32_t slot) {
  return (uint64_t{id} << 16) | (send ? 0x100u : 0u) | slot;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 32 && c < 127) ? c : '?';
  if (s.size() > 64) out += fmt::format("...({} B)", s.size());
  return out;
}

}  // namespace

struct Server::Conn {
  uint32_t id = 0;
  std::unique_ptr<MemoryRegion> mr;  // kMaxOutstanding receive + send slots
  std::unique_ptr<QueuePair> qp;     // declared last: destroyed before mr
  std::string peer;
};

Server::Server(const ServerOptions& options) : options_(options) {
  ContextOptions context_options;
  context_options.provider = options.provider;
  ctx_ = Context::open(context_options);
  cq_ = ctx_->create_cq(
      CqOptions{.capacity = options.max_clients * 2 * kQueueDepth + 64, .spin = 20us});
  table_ = std::make_unique<Table>(*ctx_, options.table);
  info_blob_ = table_->info().serialize();
  listener_ = ctx_->listen(options.address);
  acceptor_ = std::thread([this] { accept_loop(); });
}

Server::~Server() {
  stop_acceptor();
  conns_.clear();
  pending_.clear();
}

void Server::stop_acceptor() {
  if (!acceptor_.joinable()) return;
  accepting_ = false;
  // Wakes the acceptor out of its window by connecting to ourselves.
  try {
    std::string address = listener_->address();
    const size_t colon = address.rfind(':');
    const std::string host = address.substr(0, colon);
    if (host.empty() || host == "0.0.0.0") address = "127.0.0.1" + address.substr(colon);
    auto cq = ctx_->create_cq(CqOptions{.capacity = 8});
    auto qp = ctx_->connect(
        address,
        QpOptions{
            .send_cq = cq.get(), .recv_cq = cq.get(), .max_send_wr = 1, .max_recv_wr = 1},
        {}, 2s);
  } catch (const Error& e) {
    std::fprintf(
        stderr,
        "rdmakit-kv server: could not wake the acceptor (%s); it stops within %lld s\n",
        e.what(), static_cast<long long>(kAcceptWindow.count()));
  }
  acceptor_.join();
}

void Server::accept_loop() {
  const QpOptions qp_options{.send_cq = cq_.get(),
                             .recv_cq = cq_.get(),
                             .max_send_wr = kQueueDepth,
                             .max_recv_wr = kQueueDepth};
  while (accepting_) {
    if (live_clients_.load(std::memory_order_relaxed) >= options_.max_clients) {
      // Full: new clients wait in the listen backlog (and time out) instead
      // of overrunning the completion queue.
      std::this_thread::sleep_for(20ms);
      continue;
    }
    std::vector<std::byte> reply;
    {
      std::lock_guard lock(mutex_);
      reply = info_blob_;
    }
    try {
      auto qp = listener_->accept(qp_options, kAcceptWindow, reply);
      if (!accepting_) break;  // the wake-up from stop_acceptor()
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(qp));
      live_clients_.fetch_add(1, std::memory_order_relaxed);
    } catch (const Error& e) {
      if (e.sys_errno() == ETIMEDOUT) continue;
      // A client that fails its handshake costs us nothing but this line.
      std::fprintf(stderr, "rdmakit-kv server: accept failed: %s\n", e.what());
      std::this_thread::sleep_for(50ms);
    }
  }
}

void Server::publish_table_info() {
  std::lock_guard lock(mutex_);
  info_blob_ = table_->info().serialize();
}

void Server::adopt_pending() {
  std::vector<std::unique_ptr<QueuePair>> fresh;
  {
    std::lock_guard lock(mutex_);
    fresh.swap(pending_);
  }
  for (auto& qp : fresh) {
    auto conn = std::make_unique<Conn>();
    conn->id = next_id_++;
    conn->peer = qp->peer();
    conn->mr =
        ctx_->allocate(kMaxOutstanding * (kRecvStride + kSendStride), kAccessLocalWrite);
    conn->qp = std::move(qp);
    bool ok = true;
    for (uint32_t s = 0; s < kMaxOutstanding && ok; ++s) {
      ok = conn->qp
               ->post_recv({.wr_id = make_wr_id(conn->id, false, s),
                            .addr = recv_slot(*conn, s),
                            .length = static_cast<uint32_t>(kMaxRequest),
                            .lkey = conn->mr->lkey()})
               .ok();
    }
    if (!options_.quiet)
      std::fprintf(stderr, "rdmakit-kv server: client %u connected from %s\n", conn->id,
                   conn->peer.c_str());
    const uint32_t id = conn->id;
    conns_.emplace(id, std::move(conn));
    if (!ok) drop(id, "could not post its receive buffers");
  }
}

std::byte* Server::recv_slot(Conn& conn, uint32_t slot) const {
  return conn.mr->data() + slot * kRecvStride;
}

std::byte* Server::send_slot(Conn& conn, uint32_t slot) const {
  return conn.mr->data() + kMaxOutstanding * kRecvStride + slot * kSendStride;
}

void Server::drop(uint32_t id, const char* why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (!options_.quiet)
    std::fprintf(stderr, "rdmakit-kv server: client %u (%s) %s\n", id,
                 it->second->peer.c_str(), why);
  conns_.erase(it);
  ++finished_clients_;
  live_clients_.fetch_sub(1, std::memory_order_relaxed);
}

void Server::run(const std::atomic<bool>& stop) {
  Completion batch[32];
  uint32_t polls = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    int n = 0;
    if (options_.busy_poll) {
      // New connections are looked for between polls, not on every one.
      if ((polls++ & 1023) == 0) adopt_pending();
      n = cq_->poll(batch);
    } else {
      adopt_pending();
      n = cq_->wait(batch, 20ms);
    }
    for (int i = 0; i < n; ++i) on_completion(batch[i]);
    if (options_.exit_after_clients > 0 &&
        finished_clients_ >= options_.exit_after_clients && conns_.empty())
      break;
  }
}

void Server::on_completion(const Completion& c) {
  const auto id = static_cast<uint32_t>(c.wr_id >> 16);
  const bool send = (c.wr_id & 0x100u) != 0;
  const auto slot = static_cast<uint32_t>(c.wr_id & 0xffu);
  auto it = conns_.find(id);
  if (it == conns_.end() || slot >= kMaxOutstanding) return;
  Conn& conn = *it->second;
  if (!c.ok()) {
    // A client that closed flushes our RECVs; one that sent more than a RECV
    // holds fails with a length error. Either way only that client goes.
    drop(id, c.status == Status::kWrFlushError
                 ? "disconnected"
                 : fmt::format("dropped: {} on its {}", status_name(c.status),
                               send ? "reply" : "request")
                       .c_str());
    return;
  }
  if (send) {
    const PostResult r = conn.qp->post_recv({.wr_id = make_wr_id(id, false, slot),
                                             .addr = recv_slot(conn, slot),
                                             .length = static_cast<uint32_t>(kMaxRequest),
                                             .lkey = conn.mr->lkey()});
    if (!r.ok()) drop(id, "dropped: could not repost a receive buffer");
    return;
  }
  handle(conn, slot, c.byte_len);
}

void Server::handle(Conn& conn, uint32_t slot, uint32_t byte_len) {
  ++requests_;
  KvStatus status = KvStatus::kOk;
  std::string why;
  uint64_t id = 0;
  std::string value;
  std::string_view payload;
  Op op = Op::kGet;
  const auto req = parse_request({recv_slot(conn, slot), byte_len}, &status, &why, &id);
  if (!req) {
    ++malformed_;
    payload = why;
    std::fprintf(stderr, "rdmakit-kv server: client %u (%s): bad request: %s: %s\n",
                 conn.id, conn.peer.c_str(), kv_status_name(status), why.c_str());
  } else {
    op = req->op;
    switch (req->op) {
      case Op::kPut: {
        const uint32_t epoch = table_->epoch();
        const PutOutcome r = table_->put(req->key, req->value);
        if (r != PutOutcome::kOk) {
          status = KvStatus::kTableFull;
          why = table_->full_reason(r);
          payload = why;
        }
        if (table_->epoch() != epoch) {
          publish_table_info();
          std::fprintf(
              stderr,
              "rdmakit-kv server: table grew to %lu buckets, %lu blocks (epoch %u)\n",
              static_cast<unsigned long>(table_->info().buckets),
              static_cast<unsigned long>(table_->info().block_count), table_->epoch());
        }
        break;
      }
      case Op::kGet:
        if (table_->get(req->key, &value)) {
          payload = value;
        } else {
          status = KvStatus::kNotFound;
        }
        break;
      case Op::kDel:
        if (!table_->erase(req->key)) status = KvStatus::kNotFound;
        break;
      case Op::kTable: {
        std::lock_guard lock(mutex_);
        value.assign(reinterpret_cast<const char*>(info_blob_.data()), info_blob_.size());
        payload = value;
        break;
      }
    }
    if (!options_.quiet)
      std::fprintf(stderr, "rdmakit-kv server: client %u %s %s -> %s\n", conn.id,
                   op_name(op), printable(req->key).c_str(), kv_status_name(status));
  }
  std::byte* out = send_slot(conn, slot);
  const size_t len =
      encode_response({out, kSendStride}, op, status, table_->epoch(), id, payload);
  const PostResult r = conn.qp->post_send({.wr_id = make_wr_id(conn.id, true, slot),
                                           .opcode = Opcode::kSend,
                                           .flags = kSignaled,
                                           .length = static_cast<uint32_t>(len),
                                           .local_addr = out,
                                           .lkey = conn.mr->lkey()});
  if (!r.ok()) drop(conn.id, "dropped: could not post a reply");
}

}  // namespace rdmakit::kv
