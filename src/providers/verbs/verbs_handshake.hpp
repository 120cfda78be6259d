#pragma once
// Connection setup of the verbs provider: the handshake carried in the
// rdma_cm private data (path MTU and the caller's private data), and the QP
// created and moved through INIT/RTR/RTS by us, so that the path MTU, retry
// and RNR settings are ours to choose (rdma_init_qp_attr supplies the
// addressing).
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "providers/verbs/verbs_cq.hpp"
#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_qp.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::verbs {

// Our handshake rides in rdma_cm private data, ahead of the caller's bytes:
//   0 kHandshakeMagic  1 version  2 ibv_mtu (REQ: port active MTU; REP: the
//   negotiated path MTU)  3 length of the caller's private data.
// IB CM delivers private data zero-padded to its fixed size, hence the length.
inline constexpr uint8_t kHandshakeMagic = 0xa7;
inline constexpr uint8_t kHandshakeVersion = 2;
inline constexpr size_t kHandshakeSize = 4;
// IB/RoCE CM: REQ carries 92 bytes of private data, of which rdma_cm's own
// header takes 36; REP carries 196. When the connect private data does not
// fit in the REQ, the REQ carries its first kReqOverflowUserData bytes and
// the address and rkey (8 + 4 bytes, little-endian) of a remotely readable
// buffer with the rest, which the acceptor READs once established (sequence
// 0 of its send queue; each QP gets one extra send slot for it). A READ, not a
// SEND: a QP on a shared receive queue has no receive queue of its own.
inline constexpr size_t kCmReqPrivateData = 56;
inline constexpr size_t kCmRepPrivateData = 196;
inline constexpr size_t kReqUserData = kCmReqPrivateData - kHandshakeSize;
inline constexpr size_t kOverflowDescriptorSize = 12;
inline constexpr size_t kReqOverflowUserData = kReqUserData - kOverflowDescriptorSize;
inline constexpr size_t kMaxAcceptPrivateData = kCmRepPrivateData - kHandshakeSize;
static_assert(kMaxAcceptPrivateData >= Context::kMaxPrivateData,
              "accept must carry the core's full private data");

// `user` is what fits in this message; `total` the caller's full length.
std::vector<std::byte> make_handshake(ibv_mtu mtu, std::span<const std::byte> user,
                                      size_t total);

struct Handshake {
  ibv_mtu mtu = IBV_MTU_1024;
  size_t total = 0;             // the caller's full private data length
  std::vector<std::byte> user;  // the part carried by the CM message
};

std::optional<Handshake> parse_handshake(const std::vector<std::byte>& in);

VerbsCq* as_verbs_cq(CompletionQueue* cq, const Device& device, const char* which,
                     const std::string& peer);

VerbsSrq* as_verbs_srq(SharedReceiveQueue* srq, const Device& device,
                       const std::string& peer);

VerbsQp::Parts create_qp(Device& device, const QpOptions& options,
                         const std::string& peer);

// Registers parts.handshake_buf (already sized) for the overflow transfer:
// the client's for the peer to READ, the server's as the READ's sink.
void register_handshake(Device& device, VerbsQp::Parts& parts, int access,
                        const std::string& peer);

void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* state,
            const std::string& peer);

ibv_qp_attr cm_attr(rdma_cm_id* id, ibv_qp_state state, int* mask, const char* name,
                    const std::string& peer);

struct Negotiated {
  ibv_mtu mtu;
  uint8_t sgid_index;
  uint32_t dest_qp_num;
  uint8_t max_dest_rd_atomic = 0;  // READs/atomics the peer may have in flight to us
  uint8_t max_rd_atomic = 0;       // ours in flight to the peer
};

// INIT -> RTR -> RTS with rdma_cm's addressing and our own MTU / retry choices.
Negotiated bring_up(Device& device, rdma_cm_id* id, ibv_qp* qp, ibv_mtu mtu,
                    const QpOptions& options, const std::string& peer);

void to_init(rdma_cm_id* id, ibv_qp* qp, const std::string& peer);

void check_device(const Device& device, rdma_cm_id* id, const char* operation,
                  const std::string& peer);

void log_connected(const Device& device, const char* role, const std::string& peer,
                   const VerbsQp::Parts& parts, const Negotiated& n, ibv_mtu peer_mtu);

rdma_conn_param conn_param(const Device& device, const std::vector<std::byte>& data,
                           uint32_t qp_num);

}  // namespace rdmakit::verbs
