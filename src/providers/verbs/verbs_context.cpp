// Context, memory, listener and connection setup over rdma_cm. We create and
// move the QPs through INIT/RTR/RTS ourselves (rdma_init_qp_attr supplies the
// addressing) so the path MTU, retry and RNR settings are ours to choose.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/address.hpp"
#include "core/deadline.hpp"
#include "core/little_endian.hpp"
#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "providers/verbs/verbs_provider.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {
namespace {

using core::Clock;

// ---------------------------------------------------------------- addresses

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
};

SockAddr resolve(const core::HostPort& hp, bool passive, const char* operation,
                 const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const std::string port = std::to_string(hp.port);
  if (int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &result); rc != 0) {
    throw Error(operation, kProvider, peer, rc == EAI_SYSTEM ? errno : EHOSTUNREACH,
                fmt::format("getaddrinfo({}): {}", hp.host, gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

// ---------------------------------------------------------------- rdma_cm events

struct CmEvent {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<std::byte> private_data;
  uint8_t initiator_depth = 0;
  uint8_t responder_resources = 0;
};

// Waits for the next event, copies what we need and acknowledges it at once
// (an unacknowledged event blocks rdma_destroy_id and rdma_migrate_id).
CmEvent next_event(rdma_event_channel* channel, Clock::time_point deadline,
                   const char* operation, const char* waiting_for,
                   const std::string& peer) {
  pollfd pfd{channel->fd, POLLIN, 0};
  rdma_cm_event* event = nullptr;
  for (;;) {
    const int rc = ::poll(&pfd, 1, core::ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0)
      throw Error(operation, kProvider, peer, errno, "poll on the rdma_cm channel");
    if (rc == 0) {
      throw Error(operation, kProvider, peer, ETIMEDOUT,
                  fmt::format("no {} before the deadline", waiting_for));
    }
    // The channel is non-blocking: an announced event may have been dropped
    // with its id (EAGAIN), so go back to waiting.
    if (rdma_get_cm_event(channel, &event) == 0) break;
    if (errno != EAGAIN && errno != EINTR) {
      throw Error(operation, kProvider, peer, errno, "rdma_get_cm_event");
    }
  }
  CmEvent out;
  out.type = event->event;
  out.status = event->status;
  out.id = event->id;
  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
      event->event == RDMA_CM_EVENT_CONNECT_RESPONSE ||
      event->event == RDMA_CM_EVENT_ESTABLISHED ||
      event->event == RDMA_CM_EVENT_REJECTED) {
    const auto& conn = event->param.conn;
    const auto* bytes = static_cast<const std::byte*>(conn.private_data);
    if (bytes != nullptr) out.private_data.assign(bytes, bytes + conn.private_data_len);
    out.initiator_depth = conn.initiator_depth;
    out.responder_resources = conn.responder_resources;
  }
  rdma_ack_cm_event(event);
  return out;
}

// Turns an unexpected rdma_cm event into an Error naming the verb, the
// event, its status and the peer.
[[noreturn]] void throw_cm_failure(const CmEvent& event, const char* operation,
                                   const char* verb, const std::string& peer) {
  int err = EPROTO;
  std::string why;
  switch (event.type) {
    case RDMA_CM_EVENT_REJECTED:
      err = ECONNREFUSED;
      // IB CM reject reasons: 8 = invalid service ID (nobody listens on that
      // port), 28 = consumer defined (the peer's application said no).
      why = event.status == 8    ? ": no listener on that port"
            : event.status == 28 ? ": refused by the peer"
                                 : "";
      break;
    case RDMA_CM_EVENT_UNREACHABLE:
      err = ECONNREFUSED;
      why = ": the peer's connection manager did not answer";
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      err = EHOSTUNREACH;
      why = ": no RDMA route to that address";
      break;
    case RDMA_CM_EVENT_CONNECT_ERROR: err = ECONNABORTED; break;
    case RDMA_CM_EVENT_DISCONNECTED: err = ECONNRESET; break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: err = ENODEV; break;
    default: break;
  }
  throw Error(operation, kProvider, peer, err,
              fmt::format("{}: {} (status {}){}", verb, rdma_event_str(event.type),
                          event.status, why));
}

CmEvent expect_event(rdma_event_channel* channel, Clock::time_point deadline,
                     rdma_cm_event_type want, const char* operation, const char* verb,
                     const std::string& peer) {
  CmEvent event = next_event(channel, deadline, operation, rdma_event_str(want), peer);
  if (event.type != want) throw_cm_failure(event, operation, verb, peer);
  return event;
}

EventChannelHandle make_channel(const char* operation, const std::string& peer) {
  EventChannelHandle channel(rdma_create_event_channel());
  if (!channel)
    throw Error(operation, kProvider, peer, errno, "rdma_create_event_channel");
  const int flags = fcntl(channel->fd, F_GETFL);
  if (flags < 0 || fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error(operation, kProvider, peer, errno,
                "fcntl(O_NONBLOCK) on the rdma_cm channel");
  }
  return channel;
}

// ---------------------------------------------------------------- handshake

// `user` is what fits in this message; `total` the caller's full length.
std::vector<std::byte> make_handshake(ibv_mtu mtu, std::span<const std::byte> user,
                                      size_t total) {
  std::vector<std::byte> out(kHandshakeSize + user.size());
  out[0] = std::byte{kHandshakeMagic};
  out[1] = std::byte{kHandshakeVersion};
  out[2] = static_cast<std::byte>(mtu);
  out[3] = static_cast<std::byte>(total);
  std::copy(user.begin(), user.end(), out.begin() + kHandshakeSize);
  return out;
}

struct Handshake {
  ibv_mtu mtu = IBV_MTU_1024;
  size_t total = 0;             // the caller's full private data length
  std::vector<std::byte> user;  // the part carried by the CM message
};

std::optional<Handshake> parse_handshake(const std::vector<std::byte>& in) {
  if (in.size() < kHandshakeSize || in[0] != std::byte{kHandshakeMagic} ||
      in[1] != std::byte{kHandshakeVersion}) {
    return std::nullopt;
  }
  const auto mtu = static_cast<int>(in[2]);
  const auto total = static_cast<size_t>(in[3]);
  if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096 || total > Context::kMaxPrivateData) {
    return std::nullopt;
  }
  Handshake out;
  out.mtu = static_cast<ibv_mtu>(mtu);
  out.total = total;
  const size_t present = std::min(total, in.size() - kHandshakeSize);
  const auto user = std::span(in).subspan(kHandshakeSize, present);
  out.user.assign(user.begin(), user.end());
  return out;
}

// ---------------------------------------------------------------- QP setup

VerbsCq* as_verbs_cq(CompletionQueue* cq, const Device& device, const char* which,
                     const std::string& peer) {
  auto* verbs_cq = dynamic_cast<VerbsCq*>(cq);
  if (verbs_cq == nullptr || &verbs_cq->device() != &device) {
    throw Error(
        "create_qp", kProvider, peer, EINVAL,
        fmt::format("QpOptions::{} must be a completion queue of this verbs context",
                    which));
  }
  return verbs_cq;
}

VerbsSrq* as_verbs_srq(SharedReceiveQueue* srq, const Device& device,
                       const std::string& peer) {
  auto* verbs_srq = dynamic_cast<VerbsSrq*>(srq);
  if (verbs_srq == nullptr || &verbs_srq->device() != &device) {
    throw Error(
        "create_qp", kProvider, peer, EINVAL,
        fmt::format("QpOptions::srq must be a shared receive queue of this verbs "
                    "context (its create_srq), not one of {}",
                    verbs_srq == nullptr ? "another provider"
                                         : "another context (protection domain)"));
  }
  return verbs_srq;
}

VerbsQp::Parts create_qp(Device& device, const QpOptions& options,
                         const std::string& peer) {
  VerbsQp::Parts parts;
  parts.send_cq = as_verbs_cq(options.send_cq, device, "send_cq", peer);
  parts.recv_cq = as_verbs_cq(options.recv_cq, device, "recv_cq", peer);
  VerbsSrq* srq =
      options.srq != nullptr ? as_verbs_srq(options.srq, device, peer) : nullptr;
  // On an SRQ the QP has no receive queue of its own (max_recv_wr is ignored).
  const uint32_t recv_depth = srq != nullptr ? 0 : options.max_recv_wr;
  const auto max_wr = static_cast<uint32_t>(device.info.attr.max_qp_wr);
  for (uint32_t depth : {options.max_send_wr, recv_depth}) {
    if (depth == 0 && srq != nullptr) continue;
    if (depth == 0 || depth >= max_wr) {
      throw Error(
          "create_qp", kProvider, peer, EINVAL,
          fmt::format("queue depth {} is outside 1..{} (max_qp_wr of {}, less one "
                      "slot for the connection handshake)",
                      depth, max_wr - 1, device.name()));
    }
  }
  ibv_qp_init_attr init{};
  init.send_cq = parts.send_cq->cq();
  init.recv_cq = parts.recv_cq->cq();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;                             // selective signaling
  init.cap.max_send_wr = options.max_send_wr + 1;  // + the handshake slot
  init.cap.max_recv_wr = srq != nullptr ? 0 : recv_depth + 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = srq != nullptr ? 0 : 1;
  if (srq != nullptr) {
    init.srq = srq->srq();
    parts.srq = srq->core();
  }
  // Verbs does not publish the inline limit: ask for what the caller wants
  // and halve until the device agrees; it reports what it granted (often more).
  uint32_t want_inline = options.max_inline;
  int err = 0;
  for (;;) {
    ibv_qp_init_attr attempt = init;
    attempt.cap.max_inline_data = want_inline;
    parts.qp.reset(ibv_create_qp(device.pd.get(), &attempt));
    if (parts.qp) {
      init = attempt;
      break;
    }
    err = errno;
    if (want_inline == 0) {
      throw Error("ibv_create_qp", kProvider, peer, err,
                  fmt::format("RC QP with {} send / {} recv work requests{} on {}",
                              options.max_send_wr, recv_depth,
                              srq != nullptr ? " (SRQ)" : "", device.name()));
    }
    want_inline /= 2;
  }
  parts.options = options;
  parts.options.max_inline = init.cap.max_inline_data;
  parts.core =
      std::make_unique<QpCore>(parts.qp->qp_num, options.max_send_wr, recv_depth);
  parts.attachment = std::make_unique<CqAttachment>(parts.send_cq, parts.recv_cq,
                                                    parts.core.get(), parts.srq, peer);
  return parts;
}

// Registers parts.handshake_buf (already sized) for the overflow transfer:
// the client's for the peer to READ, the server's as the READ's sink.
void register_handshake(Device& device, VerbsQp::Parts& parts, int access,
                        const std::string& peer) {
  parts.handshake_mr.reset(ibv_reg_mr(device.pd.get(), parts.handshake_buf.data(),
                                      parts.handshake_buf.size(), access));
  if (!parts.handshake_mr) {
    throw Error("ibv_reg_mr", kProvider, peer, errno, "private data overflow buffer");
  }
}

void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* state,
            const std::string& peer) {
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) {
    throw Error("ibv_modify_qp", kProvider, peer, rc,
                fmt::format("qp {} to {}", qp->qp_num, state));
  }
}

ibv_qp_attr cm_attr(rdma_cm_id* id, ibv_qp_state state, int* mask, const char* name,
                    const std::string& peer) {
  ibv_qp_attr attr{};
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, mask) != 0) {
    throw Error("rdma_init_qp_attr", kProvider, peer, errno, fmt::format("for {}", name));
  }
  return attr;
}

struct Negotiated {
  ibv_mtu mtu;
  uint8_t sgid_index;
  uint32_t dest_qp_num;
  uint8_t max_dest_rd_atomic = 0;  // READs/atomics the peer may have in flight to us
  uint8_t max_rd_atomic = 0;       // ours in flight to the peer
};

// INIT -> RTR -> RTS with rdma_cm's addressing and our own MTU / retry choices.
Negotiated bring_up(Device& device, rdma_cm_id* id, ibv_qp* qp, ibv_mtu mtu,
                    const QpOptions& options, const std::string& peer) {
  const RetrySettings retry = retry_settings(options);
  int mask = 0;
  ibv_qp_attr attr = cm_attr(id, IBV_QPS_RTR, &mask, "RTR", peer);
  attr.path_mtu = mtu;
  attr.min_rnr_timer = retry.min_rnr_timer;
  if (device.gid_overridden)
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device.gid.index);
  Negotiated out{mtu, attr.ah_attr.grh.sgid_index, attr.dest_qp_num};
  out.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  modify(qp, attr, mask | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER, "RTR", peer);
  attr = cm_attr(id, IBV_QPS_RTS, &mask, "RTS", peer);
  out.max_rd_atomic = attr.max_rd_atomic;
  attr.timeout = retry.timeout;
  attr.retry_cnt = retry.retry_cnt;
  attr.rnr_retry = retry.rnr_retry;
  modify(qp, attr, mask | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, "RTS",
         peer);
  return out;
}

void to_init(rdma_cm_id* id, ibv_qp* qp, const std::string& peer) {
  int mask = 0;
  ibv_qp_attr attr = cm_attr(id, IBV_QPS_INIT, &mask, "INIT", peer);
  attr.qp_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  modify(qp, attr, mask | IBV_QP_ACCESS_FLAGS, "INIT", peer);
}

void check_device(const Device& device, rdma_cm_id* id, const char* operation,
                  const std::string& peer) {
  if (id->verbs != device.context) {
    throw Error(operation, kProvider, peer, ENODEV,
                fmt::format("the address is on device {}, but this context uses {}",
                            id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)",
                            device.name()));
  }
}

void log_connected(const Device& device, const char* role, const std::string& peer,
                   const VerbsQp::Parts& parts, const Negotiated& n, ibv_mtu peer_mtu) {
  std::string gid_text = "?";
  for (const auto& gid : device.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
                             ? device.info.ports[device.port - 1].gids
                             : std::vector<GidInfo>{}) {
    if (gid.index == n.sgid_index)
      gid_text = fmt::format("{} {}", gid_type_name(gid.type), gid.address);
  }
  const RetrySettings r = retry_settings(parts.options);
  core::log().info(
      "verbs: {} {}: qp {} -> {}, {} port {}, sgid_index {} ({}{}), path MTU {} (local "
      "port "
      "{}, peer port {}), max_inline {}, ack timeout 2^{}x4.096us x{} retries, RNR timer "
      "code {} x{}, READ/atomic depth {} out / {} in{}",
      role, peer, parts.qp->qp_num, n.dest_qp_num, device.name(), device.port,
      n.sgid_index, gid_text, device.gid_overridden ? ", override" : "", mtu_bytes(n.mtu),
      mtu_bytes(device.port_attr.active_mtu), mtu_bytes(peer_mtu),
      parts.options.max_inline, r.timeout, r.retry_cnt, r.min_rnr_timer, r.rnr_retry,
      n.max_rd_atomic, n.max_dest_rd_atomic, parts.srq ? ", receives from an SRQ" : "");
}

rdma_conn_param conn_param(const Device& device, const std::vector<std::byte>& data,
                           uint32_t qp_num) {
  rdma_conn_param param{};
  param.private_data = data.data();
  param.private_data_len = static_cast<uint8_t>(data.size());
  param.responder_resources =
      static_cast<uint8_t>(std::min(device.info.attr.max_qp_rd_atom, 255));
  param.initiator_depth =
      static_cast<uint8_t>(std::min(device.info.attr.max_qp_init_rd_atom, 255));
  param.retry_count = 7;  // CM-level; the QP's own values are set in bring_up
  param.rnr_retry_count = 7;
  param.qp_num = qp_num;
  return param;
}

// ---------------------------------------------------------------- memory

class Mapping {
 public:
  Mapping(void* addr, size_t length) : addr_(addr), length_(length) {}
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, length_);
  }
  void* release() { return std::exchange(addr_, nullptr); }

 private:
  void* addr_;
  size_t length_;
};

int ibv_access(uint32_t access) {
  int flags = 0;
  if (access & kAccessLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kAccessRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kAccessRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kAccessRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  // Verbs insists: a region the peer may write must be locally writable.
  if (flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
    flags |= IBV_ACCESS_LOCAL_WRITE;
  return flags;
}

// ---------------------------------------------------------------- listener

class VerbsListener final : public Listener {
 public:
  VerbsListener(std::shared_ptr<Device> device, EventChannelHandle channel, CmIdHandle id,
                std::string host, uint16_t port)
      : device_(std::move(device)),
        channel_(std::move(channel)),
        id_(std::move(id)),
        host_(std::move(host)),
        port_(port) {}

  std::unique_ptr<QueuePair> accept(const QpOptions& options,
                                    std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override;
  std::string address() const override {
    return core::HostPort{host_, port_}.to_string();
  }
  uint16_t port() const override { return port_; }

 private:
  std::shared_ptr<Device> device_;
  EventChannelHandle channel_;
  CmIdHandle id_;
  std::string host_;
  uint16_t port_;
};

std::unique_ptr<QueuePair> VerbsListener::accept(const QpOptions& options,
                                                 std::chrono::milliseconds timeout,
                                                 std::span<const std::byte> reply) {
  const auto deadline = Clock::now() + timeout;
  const std::string self = address();
  if (reply.size() > Context::kMaxPrivateData) {
    throw Error("accept", kProvider, self, EINVAL,
                fmt::format("reply private data is {} bytes; at most {}", reply.size(),
                            Context::kMaxPrivateData));
  }
  CmEvent request;
  for (;;) {
    request = next_event(channel_.get(), deadline, "accept", "connection request", self);
    if (request.type == RDMA_CM_EVENT_CONNECT_REQUEST) break;
    core::log().debug("verbs: listener {} ignores {}", self,
                      rdma_event_str(request.type));
  }
  // Declared before the id, so it is destroyed after it: rdma_destroy_id
  // writes to its id's channel (a use-after-free when accept() threw).
  EventChannelHandle channel;
  CmIdHandle id(request.id);
  const std::string peer = core::sockaddr_string(rdma_get_peer_addr(id.get()));
  auto refuse = [&](int err, const std::string& why) {
    rdma_reject(id.get(), nullptr, 0);
    return Error("accept", kProvider, peer, err, why);
  };
  auto hello = parse_handshake(request.private_data);
  if (!hello) throw refuse(EPROTO, "the connection request carries no rdmakit handshake");
  // Private data beyond the REQ: its first bytes, then where to READ the rest.
  const bool overflow = hello->total > kReqUserData;
  uint64_t overflow_addr = 0;
  uint32_t overflow_rkey = 0;
  if (overflow) {
    if (hello->user.size() < kReqUserData) {
      throw refuse(EPROTO,
                   "the connection request's private data overflow is incomplete");
    }
    const std::byte* desc = hello->user.data() + kReqOverflowUserData;
    overflow_addr = core::get_le<uint64_t>(desc);
    overflow_rkey = core::get_le<uint32_t>(desc + 8);
    hello->user.resize(kReqOverflowUserData);
  }
  if (id->verbs != device_->context) {
    throw refuse(ENODEV,
                 fmt::format("request arrived on {}, this context uses {}",
                             ibv_get_device_name(id->verbs->device), device_->name()));
  }
  // Until established the id gets its own channel; then the monitor's.
  try {
    channel = make_channel("accept", peer);
  } catch (const Error&) {
    rdma_reject(id.get(), nullptr, 0);
    throw;
  }
  if (rdma_migrate_id(id.get(), channel.get()) != 0)
    throw refuse(errno, "rdma_migrate_id");
  VerbsQp::Parts parts;
  Negotiated negotiated{};
  std::vector<std::byte> answer;
  try {
    parts = create_qp(*device_, options, peer);
    to_init(id.get(), parts.qp.get(), peer);
    if (overflow) {
      // The rest of the client's private data is READ once connected.
      parts.handshake_buf.resize(hello->total - kReqOverflowUserData);
      register_handshake(*device_, parts, IBV_ACCESS_LOCAL_WRITE, peer);
    }
    const ibv_mtu mtu = std::min(device_->port_attr.active_mtu, hello->mtu);
    negotiated = bring_up(*device_, id.get(), parts.qp.get(), mtu, parts.options, peer);
    answer = make_handshake(mtu, reply, reply.size());
  } catch (const Error&) {
    rdma_reject(id.get(), nullptr, 0);
    throw;
  }
  rdma_conn_param param = conn_param(*device_, answer, parts.qp->qp_num);
  // Never grant more reads in flight than the initiator asked for, and never
  // ask for more than the initiator can serve.
  param.responder_resources =
      std::min(param.responder_resources, request.initiator_depth);
  param.initiator_depth = std::min(param.initiator_depth, request.responder_resources);
  if (rdma_accept(id.get(), &param) != 0) {
    throw Error("accept", kProvider, peer, errno, "rdma_accept");
  }
  expect_event(channel.get(), deadline, RDMA_CM_EVENT_ESTABLISHED, "accept",
               "rdma_accept", peer);
  if (overflow) {
    ibv_sge sge{reinterpret_cast<uint64_t>(parts.handshake_buf.data()),
                static_cast<uint32_t>(parts.handshake_buf.size()),
                parts.handshake_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 0;  // sequence 0: the extra send slot the QP was created with
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = overflow_addr;
    wr.wr.rdma.rkey = overflow_rkey;
    parts.core->send_ring[0] = {UINT64_MAX, Opcode::kRead};
    parts.core->handshake_status.store(QpCore::kHandshakePending,
                                       std::memory_order_release);
    parts.core->send_published.store(1, std::memory_order_release);
    parts.core->send_posted = 1;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(parts.qp.get(), &wr, &bad); rc != 0) {
      throw Error("ibv_post_send", kProvider, peer, rc,
                  "READ of the private data overflow");
    }
    const ibv_wc wc = parts.send_cq->wait_handshake(parts.core.get(), 0, deadline);
    if (wc.status != IBV_WC_SUCCESS) {
      throw Error(
          "accept", kProvider, peer, EPROTO,
          fmt::format("READ of the rest of the connect private data ({} bytes) "
                      "failed: {}",
                      parts.handshake_buf.size(), status_name(map_wc_status(wc.status))));
    }
    hello->user.insert(hello->user.end(), parts.handshake_buf.begin(),
                       parts.handshake_buf.end());
  }
  log_connected(*device_, "accepted", peer, parts, negotiated, hello->mtu);
  auto conn = std::make_shared<ConnState>();
  ibv_qp* qp = parts.qp.get();
  rdma_cm_id* raw_id = id.get();
  auto result = std::make_unique<VerbsQp>(device_, std::move(id), std::move(parts), peer,
                                          std::move(hello->user), conn);
  device_->get_monitor().adopt(raw_id, qp, conn, peer);
  return result;
}

// ---------------------------------------------------------------- context

class VerbsContext final : public Context {
 public:
  explicit VerbsContext(std::shared_ptr<Device> device)
      : Context(ProviderKind::kVerbs), device_(std::move(device)) {}

  std::string device_name() const override { return device_->name(); }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override;
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override;
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options) override {
    return std::make_unique<VerbsCq>(device_, options);
  }
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& options) override {
    return std::make_unique<VerbsSrq>(device_, options);
  }
  std::unique_ptr<Listener> listen(const std::string& address) override;
  std::unique_ptr<QueuePair> connect(const std::string& address, const QpOptions& options,
                                     std::span<const std::byte> private_data,
                                     std::chrono::milliseconds timeout) override;

 private:
  std::unique_ptr<MemoryRegion> register_mapping(void* addr, size_t length,
                                                 uint32_t access, Mapping* mapping,
                                                 size_t mapping_length);
  std::shared_ptr<Device> device_;
};

std::unique_ptr<MemoryRegion> VerbsContext::register_mapping(void* addr, size_t length,
                                                             uint32_t access,
                                                             Mapping* mapping,
                                                             size_t mapping_length) {
  if (auto shortfall = memlock_shortfall(addr, length)) {
    throw Error("register_memory", kProvider, "", ENOMEM, *shortfall);
  }
  MrHandle mr(ibv_reg_mr(device_->pd.get(), addr, length, ibv_access(access)));
  if (!mr) {
    const int err = errno;
    std::string detail = fmt::format("ibv_reg_mr({} at {}) on {}", format_bytes(length),
                                     addr, device_->name());
    if (err == ENOMEM || err == EPERM) {
      detail += fmt::format(
          "; RLIMIT_MEMLOCK is {}: raise it (ulimit -l unlimited) if it "
          "is the limit",
          memlock_limit_text());
    }
    throw Error("register_memory", kProvider, "", err, detail);
  }
  return std::make_unique<VerbsMr>(device_, std::move(mr), access,
                                   mapping != nullptr ? mapping->release() : nullptr,
                                   mapping_length);
}

std::unique_ptr<MemoryRegion> VerbsContext::register_memory(void* addr, size_t length,
                                                            uint32_t access) {
  return register_mapping(addr, length, access, nullptr, 0);
}

std::unique_ptr<MemoryRegion> VerbsContext::allocate(size_t length, uint32_t access) {
  if (length == 0) throw Error("allocate", kProvider, "", EINVAL, "length 0");
  size_t huge_page = 0;
  const size_t huge_free = free_huge_pages(&huge_page);
  void* addr = MAP_FAILED;
  size_t mapped = 0;
  // Huge pages cut the device's translation misses; worth it from one page up.
  if (huge_page != 0 && length >= huge_page) {
    mapped = (length + huge_page - 1) / huge_page * huge_page;
    if (mapped / huge_page <= huge_free) {
      addr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    }
    core::log().debug("verbs: allocate {}: {}", format_bytes(length),
                      addr != MAP_FAILED ? "huge pages" : "huge pages unavailable");
  }
  if (addr == MAP_FAILED) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    mapped = (length + page - 1) / page * page;
    addr =
        mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED) {
      throw Error("allocate", kProvider, "", errno,
                  fmt::format("mmap {}", format_bytes(mapped)));
    }
  }
  Mapping mapping(addr, mapped);  // zero-filled by mmap
  return register_mapping(addr, length, access, &mapping, mapped);
}

std::unique_ptr<Listener> VerbsContext::listen(const std::string& address) {
  const core::HostPort hp = core::parse_host_port(address, "listen", kProvider);
  SockAddr addr = resolve(hp, true, "listen", address);
  EventChannelHandle channel = make_channel("listen", address);
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    throw Error("listen", kProvider, address, errno, "rdma_create_id");
  }
  CmIdHandle id(raw);
  if (rdma_bind_addr(id.get(), addr.get()) != 0) {
    const int err = errno;
    throw Error(
        "listen", kProvider, address, err,
        fmt::format("rdma_bind_addr: {} must be an address of {}'s netdev (its GID "
                    "{} is {})",
                    hp.host, device_->name(), device_->gid.index, device_->gid.address));
  }
  if (id->verbs != nullptr) check_device(*device_, id.get(), "listen", address);
  if (rdma_listen(id.get(), 64) != 0) {
    throw Error("listen", kProvider, address, errno, "rdma_listen");
  }
  const uint16_t port = ntohs(rdma_get_src_port(id.get()));
  core::log().debug("verbs: listening on {}:{} ({})", hp.host, port, device_->name());
  return std::make_unique<VerbsListener>(device_, std::move(channel), std::move(id),
                                         hp.host, port);
}

std::unique_ptr<QueuePair> VerbsContext::connect(const std::string& address,
                                                 const QpOptions& options,
                                                 std::span<const std::byte> private_data,
                                                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const core::HostPort hp = core::parse_host_port(address, "connect", kProvider);
  if (private_data.size() > Context::kMaxPrivateData) {
    throw Error("connect", kProvider, address, EINVAL,
                fmt::format("private data is {} bytes; at most {}", private_data.size(),
                            Context::kMaxPrivateData));
  }
  SockAddr dst = resolve(hp, false, "connect", address);
  // Source: the chosen GID's IPv4 address, so the connection leaves from the
  // GID we picked (loopback destinations keep the kernel's choice).
  SockAddr src;
  bool bind_src = false;
  if (device_->gid.ipv4_mapped && dst.storage.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&src.storage);
    const auto* to = reinterpret_cast<const sockaddr_in*>(&dst.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, device_->gid.gid.raw + 12, 4);
    src.length = sizeof(sockaddr_in);
    bind_src = (ntohl(to->sin_addr.s_addr) >> 24) != 127;
  }
  EventChannelHandle channel = make_channel("connect", address);
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    throw Error("connect", kProvider, address, errno, "rdma_create_id");
  }
  CmIdHandle id(raw);
  if (rdma_resolve_addr(id.get(), bind_src ? src.get() : nullptr, dst.get(),
                        std::max(1, core::ms_left(deadline))) != 0) {
    throw Error("connect", kProvider, address, errno, "rdma_resolve_addr");
  }
  expect_event(channel.get(), deadline, RDMA_CM_EVENT_ADDR_RESOLVED, "connect",
               "rdma_resolve_addr", address);
  check_device(*device_, id.get(), "connect", address);
  if (rdma_resolve_route(id.get(), std::max(1, core::ms_left(deadline))) != 0) {
    throw Error("connect", kProvider, address, errno, "rdma_resolve_route");
  }
  expect_event(channel.get(), deadline, RDMA_CM_EVENT_ROUTE_RESOLVED, "connect",
               "rdma_resolve_route", address);
  VerbsQp::Parts parts = create_qp(*device_, options, address);
  to_init(id.get(), parts.qp.get(), address);
  // More than the REQ holds: its first bytes, then where the acceptor READs the rest.
  const auto in_req_span =
      private_data.first(std::min(private_data.size(), kReqUserData));
  std::vector<std::byte> in_req(in_req_span.begin(), in_req_span.end());
  if (private_data.size() > kReqUserData) {
    const auto rest = private_data.subspan(kReqOverflowUserData);
    parts.handshake_buf.assign(rest.begin(), rest.end());
    register_handshake(*device_, parts, IBV_ACCESS_REMOTE_READ, address);
    core::put_le<uint64_t>(in_req.data() + kReqOverflowUserData,
                           reinterpret_cast<uint64_t>(parts.handshake_buf.data()));
    core::put_le<uint32_t>(in_req.data() + kReqOverflowUserData + 8,
                           parts.handshake_mr->rkey);
  }
  const auto hello =
      make_handshake(device_->port_attr.active_mtu, in_req, private_data.size());
  rdma_conn_param param = conn_param(*device_, hello, parts.qp->qp_num);
  if (rdma_connect(id.get(), &param) != 0) {
    throw Error("connect", kProvider, address, errno, "rdma_connect");
  }
  const CmEvent response =
      expect_event(channel.get(), deadline, RDMA_CM_EVENT_CONNECT_RESPONSE, "connect",
                   "rdma_connect", address);
  auto answer = parse_handshake(response.private_data);
  if (!answer) {
    rdma_reject(id.get(), nullptr, 0);
    throw Error("connect", kProvider, address, EPROTO,
                "the peer accepted without an rdmakit handshake");
  }
  // The acceptor already chose min(its port, ours); re-clamp in case it is older.
  const ibv_mtu mtu = std::min(device_->port_attr.active_mtu, answer->mtu);
  Negotiated negotiated{};
  try {
    negotiated =
        bring_up(*device_, id.get(), parts.qp.get(), mtu, parts.options, address);
  } catch (const Error&) {
    rdma_reject(id.get(), nullptr, 0);
    throw;
  }
  if (rdma_establish(id.get()) != 0) {
    throw Error("connect", kProvider, address, errno, "rdma_establish");
  }
  log_connected(*device_, "connected to", address, parts, negotiated, answer->mtu);
  auto conn = std::make_shared<ConnState>();
  ibv_qp* qp = parts.qp.get();
  rdma_cm_id* raw_id = id.get();
  auto result = std::make_unique<VerbsQp>(device_, std::move(id), std::move(parts),
                                          address, std::move(answer->user), conn);
  device_->get_monitor().adopt(raw_id, qp, conn, address);
  return result;
}

}  // namespace

VerbsMr::VerbsMr(std::shared_ptr<Device> device, MrHandle mr, uint32_t access,
                 void* mapping, size_t mapping_length)
    : MemoryRegion(mr->addr, mr->length, mr->lkey, mr->rkey, access,
                   ProviderKind::kVerbs),
      device_(std::move(device)),
      mr_(std::move(mr)),
      mapping_(mapping),
      mapping_length_(mapping_length) {
  process_pinned_pages() += pinned_pages(reinterpret_cast<uint64_t>(addr()), length(),
                                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
}

VerbsMr::~VerbsMr() {
  mr_.reset();
  process_pinned_pages() -= pinned_pages(reinterpret_cast<uint64_t>(addr()), length(),
                                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  if (mapping_ != nullptr) munmap(mapping_, mapping_length_);
}

std::shared_ptr<Device> open_device(const ContextOptions& options) {
  std::string reason;
  if (!std::filesystem::exists("/sys/class/infiniband")) {
    device_usable(&reason);
    throw Error("Context::open", kProvider, "", ENODEV, reason);
  }
  auto device = std::make_shared<Device>();
  int count = 0;
  device->cm_devices.reset(rdma_get_devices(&count));
  if (!device->cm_devices || count == 0) {
    throw Error("Context::open", kProvider, "", ENODEV,
                "rdma_get_devices found no RDMA device");
  }
  std::string seen;
  for (int i = 0; i < count && device->context == nullptr; ++i) {
    ibv_context* context = device->cm_devices.get()[i];
    const std::string name = ibv_get_device_name(context->device);
    if (!options.verbs.device.empty() && name != options.verbs.device) {
      seen += (seen.empty() ? "" : ", ") + name;
      continue;
    }
    DeviceInfo info = query_device(context);
    for (const PortInfo& port : info.ports) {
      if (port.attr.state == IBV_PORT_ACTIVE) {
        device->context = context;
        device->port = port.port;
        device->port_attr = port.attr;
        break;
      }
    }
    if (device->context == nullptr) {
      seen += fmt::format("{}{} (no ACTIVE port)", seen.empty() ? "" : ", ", name);
      continue;
    }
    device->info = std::move(info);
  }
  if (device->context == nullptr) {
    throw Error("Context::open", kProvider, "", ENODEV,
                options.verbs.device.empty()
                    ? fmt::format("no device with an ACTIVE port (seen: {})", seen)
                    : fmt::format("device {} is not usable (seen: {})",
                                  options.verbs.device, seen));
  }
  std::string why;
  const auto& gids = device->info.ports[device->port - 1].gids;
  auto gid = choose_gid(gids, options.verbs.gid_index, &why);
  if (!gid) {
    throw Error("Context::open", kProvider, "", EINVAL,
                fmt::format("{} port {}: {}", device->name(), device->port, why));
  }
  device->gid = *gid;
  device->gid_overridden = options.verbs.gid_index >= 0;
  device->pd.reset(ibv_alloc_pd(device->context));
  if (!device->pd) {
    throw Error("ibv_alloc_pd", kProvider, "", errno, "device " + device->name());
  }
  size_t huge_page = 0;
  const size_t huge_free = free_huge_pages(&huge_page);
  core::log().info(
      "verbs: device {} port {} ({}, active MTU {}), GID index {} {} {} ({}), "
      "RLIMIT_MEMLOCK {}, {} free huge pages of {}",
      device->name(), device->port, link_layer_name(device->port_attr.link_layer),
      mtu_bytes(device->port_attr.active_mtu), device->gid.index,
      gid_type_name(device->gid.type), device->gid.address, why, memlock_limit_text(),
      huge_free, format_bytes(huge_page));
  return device;
}

}  // namespace rdmakit::verbs

namespace rdmakit::core {

std::unique_ptr<Context> make_verbs_context(const ContextOptions& options) {
  return std::make_unique<verbs::VerbsContext>(verbs::open_device(options));
}

}  // namespace rdmakit::core
