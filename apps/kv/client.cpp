#include "client.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace rdmakit::kv {
namespace {

constexpr size_t kSendOffset = 0;
constexpr size_t kRecvOffset = (kMaxRequest + 63) / 64 * 64;
constexpr size_t kReadOffset = kRecvOffset + (kMaxResponse + 63) / 64 * 64;
constexpr size_t kNeighborhoodBytes = kNeighborhood * kSlotSize;
constexpr size_t kBufferBytes = kReadOffset + kNeighborhoodBytes + kBlockSize;

constexpr uint64_t kSendId = 1;
constexpr uint64_t kRecvId = 2;
constexpr uint64_t kReadId = 3;

}  // namespace

Client::Client(const ClientOptions& options) : options_(options) {
  ContextOptions context_options;
  context_options.provider = options.provider;
  ctx_ = Context::open(context_options);
  cq_ = ctx_->create_cq(CqOptions{.capacity = 64});
  mr_ = ctx_->allocate(kBufferBytes, kAccessLocalWrite);
  const auth::Nonce client_nonce = auth::fresh_nonce();
  qp_ = ctx_->connect(options.address,
                      QpOptions{.send_cq = cq_.get(),
                                .recv_cq = cq_.get(),
                                .max_send_wr = 8,
                                .max_recv_wr = 8,
                                // The server adopts a new connection within
                                // its loop's tick; our first SEND may wait.
                                .rnr_timeout = options.timeout},
                      encode_hello(client_nonce), options.timeout);
  authenticate(client_nonce);
}

void Client::authenticate(const auth::Nonce& client_nonce) {
  const auto challenge = parse_challenge(qp_->peer_private_data());
  if (!challenge)
    fail(
        "the server's reply is not an rdmakit-kv handshake (another service, or an "
        "rdmakit-kv too old to authenticate)");
  if (challenge->auth_required && !options_.secret)
    fail("the server requires a secret (--secret-file or RDMAKIT_SECRET)");
  if (!challenge->auth_required && options_.secret)
    fail(
        "the server does not authenticate (it runs without a secret) but this client "
        "has one: refusing to use it (drop the client's secret to connect anyway)");
  ProofMsg proof;
  if (options_.secret) {
    proof.has_secret = true;
    proof.proof = options_.secret->prove(auth::Role::kClient, kAuthLabel, client_nonce,
                                         challenge->server_nonce);
  }
  const auto msg = encode_proof(proof);
  std::memcpy(mr_->data() + kSendOffset, msg.data(), msg.size());
  post_reply_buffer("cannot post the reply buffer");
  send_done_ = recv_done_ = false;
  if (!qp_->post_send({.wr_id = kSendId,
                       .opcode = Opcode::kSend,
                       .flags = kSignaled,
                       .length = static_cast<uint32_t>(msg.size()),
                       .local_addr = mr_->data() + kSendOffset,
                       .lkey = mr_->lkey()})
           .ok())
    fail("cannot post the authentication proof");
  await(kSendId, "authentication");
  await(kRecvId, "authentication");
  const auto welcome = parse_welcome({mr_->data() + kRecvOffset, recv_len_});
  if (!welcome)
    fail(fmt::format("authentication: malformed answer ({} bytes)", recv_len_));
  switch (welcome->status) {
    case AuthStatus::kOk: break;
    case AuthStatus::kWrongSecret: fail("authentication failed: wrong secret");
    case AuthStatus::kNoSecret:
      fail("the server requires a secret (--secret-file or RDMAKIT_SECRET)");
    case AuthStatus::kMalformed:
      fail("authentication failed: the server refused the proof");
  }
  if (options_.secret &&
      !options_.secret->verify(auth::Role::kServer, kAuthLabel, client_nonce,
                               challenge->server_nonce, welcome->server_proof))
    fail(
        "authentication failed: the server did not prove the secret (wrong secret on "
        "the server, or not the server)");
  auto info = TableInfo::deserialize(welcome->table_info);
  if (!info) fail("the server's answer is not an rdmakit-kv table descriptor");
  adopt_table(*info);
  post_reply_buffer("cannot post the reply buffer");
}

Client::~Client() = default;

void Client::post_reply_buffer(const char* failure) {
  if (!qp_->post_recv({.wr_id = kRecvId,
                       .addr = mr_->data() + kRecvOffset,
                       .length = static_cast<uint32_t>(kMaxResponse),
                       .lkey = mr_->lkey()})
           .ok())
    fail(failure);
}

void Client::adopt_table(const TableInfo& info) {
  table_ = info;
  // One byte per bucket (2 MiB at the largest table); the hints of another
  // table say nothing about this one.
  first_read_slots_.assign(table_.buckets, 0);
}

void Client::fail(const std::string& what) {
  broken_ = fmt::format("rdmakit-kv: {} (server {}, provider {})", what, options_.address,
                        ctx_->provider_name());
  throw ClientError(broken_);
}

void Client::await(uint64_t wr_id, const char* what) {
  std::chrono::steady_clock::time_point deadline{};  // read only once we have to wait
  for (;;) {
    if (wr_id == kSendId && send_done_) return;
    if (wr_id == kRecvId && recv_done_) return;
    if (wr_id == kReadId && read_done_) return;
    // Everything ready at once (a reply brings the request's SEND and the
    // reply's RECV completions together): one poll, so no second poll drives
    // the QP in between. On tcp such a poll would send the reply's ACK on
    // its own; without it the ACK rides on our next request. The batch is a
    // member: a local array of Completions is zeroed on every call (its
    // default member initializers), a `rep stos` that cost a shm READ-GET
    // about a tenth of its time.
    int n = cq_->poll(batch_);
    if (n == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (deadline == std::chrono::steady_clock::time_point{})
        deadline = now + options_.timeout;
      if (now >= deadline || (n = cq_->wait(batch_, deadline - now)) == 0)
        fail(fmt::format("no answer to {} within {} ms", what, options_.timeout.count()));
    }
    for (int i = 0; i < n; ++i) {
      const Completion& c = batch_[i];
      if (!c.ok())
        fail(fmt::format("{} failed: {} (the server is gone or refused the request)",
                         what, status_name(c.status)));
      if (c.wr_id == kSendId) send_done_ = true;
      if (c.wr_id == kRecvId) {
        recv_done_ = true;
        recv_len_ = c.byte_len;
      }
      if (c.wr_id == kReadId) read_done_ = true;
    }
  }
}

KvStatus Client::check_local(std::string_view key, std::string_view value,
                             std::string* why) const {
  // The common case without building the reason text (a READ-GET's path).
  if (!key.empty() && key.size() <= kMaxKey && value.size() <= kMaxValue) {
    if (why != nullptr) why->clear();
    return KvStatus::kOk;
  }
  KvStatus s = KvStatus::kOk;
  std::string text;
  if (key.empty() || key.size() > kMaxKey) {
    s = KvStatus::kKeyTooLong;
    text = fmt::format("key of {} bytes (1..{} allowed)", key.size(), kMaxKey);
  } else if (value.size() > kMaxValue) {
    s = KvStatus::kValueTooLong;
    text = fmt::format("value of {} bytes (at most {})", value.size(), kMaxValue);
  }
  if (why != nullptr) *why = text;
  return s;
}

KvStatus Client::rpc(Op op, std::string_view key, std::string_view value,
                     std::string* payload) {
  if (!broken_.empty()) throw ClientError(broken_);
  const uint64_t id = next_id_++;
  const size_t len =
      encode_request({mr_->data() + kSendOffset, kMaxRequest}, op, id, key, value);
  const bool inl = options_.inline_sends && len <= qp_->max_inline();
  send_done_ = recv_done_ = false;
  const PostResult r =
      qp_->post_send({.wr_id = kSendId,
                      .opcode = Opcode::kSend,
                      .flags = static_cast<uint8_t>(kSignaled | (inl ? kInline : 0)),
                      .length = static_cast<uint32_t>(len),
                      .local_addr = mr_->data() + kSendOffset,
                      .lkey = mr_->lkey()});
  if (!r.ok())
    fail(fmt::format("{} not posted: {}", op_name(op), post_status_name(r.status)));
  const std::string what = std::string(op_name(op)) + " request";
  await(kSendId, what.c_str());
  await(kRecvId, what.c_str());
  auto resp = parse_response({mr_->data() + kRecvOffset, recv_len_});
  if (!resp || resp->id != id)
    fail(fmt::format("{}: malformed or unexpected reply ({} bytes)", what, recv_len_));
  payload->assign(resp->payload);
  if (resp->epoch != table_.epoch) table_stale_ = true;
  post_reply_buffer("cannot repost the reply buffer");
  return resp->status;
}

KvStatus Client::put(std::string_view key, std::string_view value, std::string* why) {
  if (KvStatus s = check_local(key, value, why); s != KvStatus::kOk) return s;
  std::string payload;
  const KvStatus s = rpc(Op::kPut, key, value, &payload);
  if (why != nullptr) *why = payload;
  return s;
}

KvStatus Client::del(std::string_view key, std::string* why) {
  if (KvStatus s = check_local(key, {}, why); s != KvStatus::kOk) return s;
  std::string payload;
  const KvStatus s = rpc(Op::kDel, key, {}, &payload);
  if (why != nullptr) *why = payload;
  return s;
}

KvStatus Client::get(std::string_view key, std::string* value, GetMode mode,
                     std::string* why) {
  if (KvStatus s = check_local(key, {}, why); s != KvStatus::kOk) return s;
  if (mode == GetMode::kRead) return get_by_read(key, value);
  std::string payload;
  const KvStatus s = rpc(Op::kGet, key, {}, &payload);
  if (s == KvStatus::kOk) {
    *value = std::move(payload);
  } else if (why != nullptr) {
    *why = payload;
  }
  return s;
}

void Client::refresh_table() {
  std::string payload;
  const KvStatus s = rpc(Op::kTable, {}, {}, &payload);
  auto info = TableInfo::deserialize(
      {reinterpret_cast<const std::byte*>(payload.data()), payload.size()});
  if (s != KvStatus::kOk || !info)
    fail(fmt::format("TABLE request answered {} with an unusable descriptor",
                     kv_status_name(s)));
  if (info->epoch != table_.epoch) ++stats_.table_moves;
  adopt_table(*info);
  table_stale_ = false;
}

void Client::read(uint64_t offset, uint32_t len, size_t at) {
  if (!broken_.empty()) throw ClientError(broken_);
  ++stats_.reads;
  stats_.bytes += len;
  read_done_ = false;
  const PostResult r = qp_->post_send({.wr_id = kReadId,
                                       .opcode = Opcode::kRead,
                                       .flags = kSignaled,
                                       .length = len,
                                       .local_addr = mr_->data() + kReadOffset + at,
                                       .lkey = mr_->lkey(),
                                       .remote_addr = table_.region.addr_at(offset),
                                       .rkey = table_.region.rkey});
  if (!r.ok()) fail(fmt::format("READ not posted: {}", post_status_name(r.status)));
  await(kReadId, "READ of the table");
}

uint32_t Client::read_home(uint64_t slot, uint32_t slots) {
  // A neighborhood never wraps (slot_count = buckets + kNeighborhood - 1).
  slots = static_cast<uint32_t>(
      std::min<uint64_t>(slots, table_.slot_count - std::min(slot, table_.slot_count)));
  const auto len = static_cast<uint32_t>(slots * kSlotSize);
  read(table_.slot_offset(slot), len, 0);
  return len;
}

std::span<const std::byte> Client::read_buffer() const noexcept {
  return {mr_->data() + kReadOffset, kFirstReadSlots * kSlotSize};
}

void Client::read_raw(std::string_view key) {
  const uint64_t home = table_.home_bucket(key_hash(key));
  read_home(home, first_read(home));
}

KvStatus Client::get_by_read(std::string_view key, std::string* value) {
  const uint64_t hash = key_hash(key);
  std::chrono::steady_clock::time_point deadline{};  // read only once we retry
  for (uint64_t attempt = 0;; ++attempt) {
    if (table_stale_) refresh_table();
    if (attempt == 1) deadline = std::chrono::steady_clock::now() + options_.timeout;
    if (attempt > 0 && (attempt & 63) == 0 && std::chrono::steady_clock::now() > deadline)
      fail(fmt::format("READ-GET: the key's slots kept changing for {} ms ({} retries)",
                       options_.timeout.count(), attempt));
    const uint64_t home = table_.home_bucket(hash);
    // The home slot and the next few; the home slot's reach says whether the
    // key may lie further (then one more READ of the rest).
    uint32_t len = read_home(home, first_read(home));
    ProbeResult p =
        probe_neighborhood({mr_->data() + kReadOffset, len}, key, hash, value);
    // A reach is at most kNeighborhood in any answer but kRetry.
    if (p.probe != Probe::kRetry)
      first_read_slots_[home] = static_cast<uint8_t>(std::max<uint32_t>(p.reach, 1));
    if (p.probe == Probe::kMore) {
      ++stats_.wide;
      const uint32_t have = len / kSlotSize;
      read(table_.slot_offset(home + have), (p.reach - have) * kSlotSize, len);
      len = p.reach * kSlotSize;
      p = probe_neighborhood({mr_->data() + kReadOffset, len}, key, hash, value);
    }
    switch (p.probe) {
      case Probe::kFound: return KvStatus::kOk;
      case Probe::kAbsent: return KvStatus::kNotFound;
      case Probe::kRetry:
      case Probe::kMore:  // the reach grew between the two READs
        ++stats_.retries;
        continue;
      case Probe::kMoved: table_stale_ = true; continue;
      case Probe::kIndirect: break;
    }
    if (p.block >= table_.block_count ||
        p.value_len > kMaxValue) {  // never in a checked slot
      ++stats_.retries;
      continue;
    }
    const auto block_len = static_cast<uint32_t>(kBlockHeader + key.size() + p.value_len);
    read(table_.block_offset(p.block), block_len, kNeighborhoodBytes);
    if (verify_block({mr_->data() + kReadOffset + kNeighborhoodBytes, block_len}, key,
                     p.seq, value))
      return KvStatus::kOk;
    ++stats_.retries;  // the block was reused since the slot was copied
  }
}

}  // namespace rdmakit::kv
