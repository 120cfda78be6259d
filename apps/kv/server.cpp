#include "server.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

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
  bool authenticated = false;
  bool closing = false;  // refused: dropped once the refusal is sent
  std::string close_reason;
  std::chrono::steady_clock::time_point deadline;  // to authenticate, or to close
  auth::Nonce client_nonce{};
  auth::Nonce server_nonce{};
  std::unique_ptr<MemoryRegion> mr;  // kMaxOutstanding receive + send slots
  std::unique_ptr<QueuePair> qp;     // declared last: destroyed before mr
  std::string peer;
};

Server::Server(const ServerOptions& options) : options_(options) {
  ContextOptions context_options;
  context_options.provider = options.provider;
  const std::string host = options.address.substr(0, options.address.rfind(':'));
  if (!options.secret && !options.allow_no_auth && !is_loopback_host(host))
    throw std::invalid_argument(
        "refusing to listen on " + options.address +
        " without a secret: any host that reaches it could read and write the table. "
        "Give --secret-file PATH (or RDMAKIT_SECRET_FILE / RDMAKIT_SECRET), bind a "
        "loopback address, or pass --no-auth");
  if (!options.secret)
    std::fprintf(stderr,
                 "rdmakit-kv server: warning: no secret (authentication off): any %s "
                 "can connect, read the whole table and write to it\n",
                 is_loopback_host(host) ? "local user" : "host that reaches the port");
  ctx_ = Context::open(context_options);
  cq_ = ctx_->create_cq(
      CqOptions{.capacity = options.max_clients * 2 * kQueueDepth + 64, .spin = 20us});
  table_ = std::make_unique<Table>(*ctx_, options.table);
  info_blob_ = table_->info().serialize();
  listener_ = ctx_->listen(options.address);
  acceptor_ = std::thread([this] { accept_loop(); });
}

std::string Server::describe() const {
  return fmt::format("{} (provider {}, auth {})", listener_->address(), provider_name(),
                     options_.secret ? "on: secret from " + options_.secret->origin()
                                     : std::string("OFF"));
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
    // A fresh server nonce per connection: a proof recorded on another
    // connection does not verify on this one. Nothing about the table here.
    const Challenge challenge{.auth_required = options_.secret != nullptr,
                              .server_nonce = auth::fresh_nonce()};
    const std::vector<std::byte> reply = encode_challenge(challenge);
    try {
      auto qp = listener_->accept(qp_options, kAcceptWindow, reply);
      if (!accepting_) break;  // the wake-up from stop_acceptor()
      const auto client_nonce = parse_hello(qp->peer_private_data());
      if (!client_nonce) {
        std::fprintf(stderr,
                     "rdmakit-kv server: connection from %s closed: not an rdmakit-kv "
                     "client (no valid hello, %zu bytes of private data)\n",
                     qp->peer().c_str(), qp->peer_private_data().size());
        continue;
      }
      std::lock_guard lock(mutex_);
      pending_.push_back({std::move(qp), *client_nonce, challenge.server_nonce});
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
  std::vector<Pending> fresh;
  {
    std::lock_guard lock(mutex_);
    fresh.swap(pending_);
  }
  for (auto& [qp, client_nonce, server_nonce] : fresh) {
    auto conn = std::make_unique<Conn>();
    conn->id = next_id_++;
    conn->peer = qp->peer();
    conn->client_nonce = client_nonce;
    conn->server_nonce = server_nonce;
    conn->deadline = std::chrono::steady_clock::now() + options_.auth_timeout;
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

void Server::drop(uint32_t id, const char* why, bool loud) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (loud || !options_.quiet)
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
    if (!options_.busy_poll || (polls & 1023) == 1) expire_unauthenticated();
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
    if (!conn.authenticated) {
      if (!conn.closing) ++auth_failures_;
      drop(id, "disconnected before authenticating", true);
      return;
    }
    drop(id, c.status == Status::kWrFlushError
                 ? "disconnected"
                 : fmt::format("dropped: {} on its {}", status_name(c.status),
                               send ? "reply" : "request")
                       .c_str());
    return;
  }
  if (send) {
    if (conn.closing) {
      drop(id, conn.close_reason.c_str());
      return;
    }
    const PostResult r = conn.qp->post_recv({.wr_id = make_wr_id(id, false, slot),
                                             .addr = recv_slot(conn, slot),
                                             .length = static_cast<uint32_t>(kMaxRequest),
                                             .lkey = conn.mr->lkey()});
    if (!r.ok()) drop(id, "dropped: could not repost a receive buffer");
    return;
  }
  if (conn.closing) return;
  if (!conn.authenticated) {
    authenticate(conn, slot, c.byte_len);
    return;
  }
  handle(conn, slot, c.byte_len);
}

void Server::expire_unauthenticated() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_expiry_) return;
  next_expiry_ =
      now + std::min<std::chrono::milliseconds>(options_.auth_timeout / 4, 50ms);
  std::vector<uint32_t> late;
  for (const auto& [id, conn] : conns_)
    if ((!conn->authenticated || conn->closing) && now >= conn->deadline)
      late.push_back(id);
  for (uint32_t id : late) {
    Conn& conn = *conns_.at(id);
    if (conn.closing) {
      drop(id, conn.close_reason.c_str());
      continue;
    }
    ++auth_failures_;
    drop(id,
         fmt::format("dropped: did not authenticate within {} ms",
                     options_.auth_timeout.count())
             .c_str(),
         true);
  }
}

bool Server::post_reply(Conn& conn, uint32_t slot, size_t len) {
  const PostResult r = conn.qp->post_send({.wr_id = make_wr_id(conn.id, true, slot),
                                           .opcode = Opcode::kSend,
                                           .flags = kSignaled,
                                           .length = static_cast<uint32_t>(len),
                                           .local_addr = send_slot(conn, slot),
                                           .lkey = conn.mr->lkey()});
  if (r.ok()) return true;
  drop(conn.id, "dropped: could not post a reply");
  return false;
}

void Server::refuse(Conn& conn, uint32_t slot, AuthStatus status,
                    const std::string& why) {
  ++auth_failures_;
  // Logged whatever --quiet says: someone tried the door.
  std::fprintf(stderr, "rdmakit-kv server: client %u (%s) refused: %s\n", conn.id,
               conn.peer.c_str(), why.c_str());
  // The refusal tells the client why; the connection is closed once it is
  // sent (or after a second, whichever comes first).
  const auto msg = encode_welcome(status, {}, {});
  std::memcpy(send_slot(conn, slot), msg.data(), msg.size());
  conn.closing = true;
  conn.close_reason = "closed after its refusal";
  conn.deadline = std::chrono::steady_clock::now() + 1s;
  post_reply(conn, slot, msg.size());
}

void Server::authenticate(Conn& conn, uint32_t slot, uint32_t byte_len) {
  const auto proof = parse_proof({recv_slot(conn, slot), byte_len});
  if (!proof) {
    refuse(conn, slot, AuthStatus::kMalformed,
           fmt::format("its first message ({} bytes) is not an authentication proof",
                       byte_len));
    return;
  }
  const AuthStatus status =
      check_proof(options_.secret.get(), conn.client_nonce, conn.server_nonce, *proof);
  if (status == AuthStatus::kNoSecret) {
    refuse(conn, slot, status, "authentication failed: the client has no secret");
    return;
  }
  if (status != AuthStatus::kOk) {
    refuse(conn, slot, status,
           "authentication failed: wrong secret (or a proof replayed from another "
           "connection)");
    return;
  }
  conn.authenticated = true;
  auth::Proof server_proof{};
  if (options_.secret)
    server_proof = options_.secret->prove(auth::Role::kServer, kAuthLabel,
                                          conn.client_nonce, conn.server_nonce);
  std::vector<std::byte> msg;
  {
    std::lock_guard lock(mutex_);
    msg = encode_welcome(AuthStatus::kOk, server_proof, info_blob_);
  }
  std::memcpy(send_slot(conn, slot), msg.data(), msg.size());
  if (!options_.quiet)
    std::fprintf(stderr, "rdmakit-kv server: client %u (%s) %s\n", conn.id,
                 conn.peer.c_str(),
                 options_.secret ? "authenticated" : "admitted (authentication off)");
  post_reply(conn, slot, msg.size());
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
  const size_t len = encode_response({send_slot(conn, slot), kSendStride}, op, status,
                                     table_->epoch(), id, payload);
  post_reply(conn, slot, len);
}

}  // namespace rdmakit::kv
