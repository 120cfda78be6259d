#include "providers/verbs/verbs_handshake.hpp"

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
#include "providers/verbs/verbs_cq.hpp"
#include "providers/verbs/verbs_qp.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

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
  parts.core->qp = parts.qp.get();
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

}  // namespace rdmakit::verbs
