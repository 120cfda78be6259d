#pragma once
// What both ends of rdmakit-perf agree on: the client's hello (its settings
// and region descriptor, in the control connection's private data), the
// control messages, and the layout of each side's region:
//   [control area 4 KiB][local slot per QP][target slot per QP]
// Local slots are sources (SEND/WRITE) or sinks (READ/atomics); target slots
// are what the peer's one-sided operations and SENDs land in.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "perf.hpp"

namespace rdmakit::perf {

constexpr uint32_t kMagic = 0x46524b52;  // "RKRF"
constexpr uint16_t kWireVersion = 2;

// Control area: the outgoing message at 0, one RECV slot per control RECV
// after it, then the scratch words one-sided flush WRITEs use.
constexpr size_t kCtrlArea = 4096;
constexpr size_t kCtrlSlot = 256;
constexpr uint32_t kCtrlRecvs = 8;
constexpr size_t kScratchRemote = 3072;  // in the control area, past the RECV slots
constexpr size_t kScratchLocal = 3584;
static_assert(kCtrlSlot * (1 + kCtrlRecvs) <= kScratchRemote);

// wr_id of a data WR: QP index above kQpShift, WR index below.
constexpr uint64_t kQpShift = 48;
constexpr uint64_t kIdxMask = (uint64_t{1} << kQpShift) - 1;
// A signaled 8-byte WRITE into the peer's control scratch retires trailing
// unsignaled WRs at the end of a duration run (no data message is involved).
constexpr uint64_t kFlushBit = uint64_t{1} << 47;

struct WireSettings {
  uint32_t magic;
  uint16_t version;
  uint8_t test;
  uint8_t atomic_op;
  uint8_t bidirectional;
  uint8_t event;
  uint8_t busy_target;
  uint8_t reserved;
  uint32_t num_qps;
  uint32_t tx_depth;
  uint32_t rx_depth;
  uint32_t inline_size;
  uint32_t post_list;
  uint32_t cq_mod;
  uint64_t max_size;
  uint64_t warmup;
};
static_assert(sizeof(WireSettings) + RemoteRegion::kSerializedSize <=
              Context::kMaxPrivateData);

// The client's hello: its settings, then its region descriptor.
using Hello = std::array<std::byte, sizeof(WireSettings) + RemoteRegion::kSerializedSize>;

struct ClientHello {
  Settings settings;
  RemoteRegion region;
};

Hello encode_hello(const Settings& settings, const RemoteRegion& region);
// Throws on a hello that is short, of another tool or version, or out of range.
ClientHello decode_hello(std::span<const std::byte> private_data);

// Private data of each data QP's connect: which QP it is.
struct WireQp {
  uint32_t magic;
  uint32_t index;
};

enum class Ctrl : uint32_t { kStart = 1, kReady, kEnd, kResult, kQuit };

// Control message; both ends run the same binary, so a plain struct.
struct CtrlMsg {
  Ctrl type = Ctrl::kStart;
  uint32_t reserved = 0;
  uint64_t size = 0;
  uint64_t iterations = 0;        // Start: per QP, 0 = duration mode
  uint64_t duration_ns = 0;       // Start
  uint64_t posted = 0;            // End/Result: data WRs the sender posted
  uint64_t bytes = 0;             // End/Result: bytes those WRs moved
  uint64_t recv_completions = 0;  // Result
  uint64_t recv_bytes = 0;        // Result
  uint64_t checksum = 0;          // Result: target-area checksum or atomic counters
  uint64_t errors = 0;            // Result: immediates out of sequence
  double bw_avg = 0, bw_peak = 0, msg_rate = 0;  // Result: server's direction
};
static_assert(sizeof(CtrlMsg) <= kCtrlSlot);

}  // namespace rdmakit::perf
