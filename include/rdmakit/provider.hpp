#pragma once
// The providers a context can run on, and the RDMA devices the verbs provider
// can see (what rdmakit-info prints).
#include <cstdint>
#include <string>
#include <vector>

#include "rdmakit/export.hpp"

namespace rdmakit {

enum class ProviderKind : uint8_t { kAuto = 0, kShm = 1, kTcp = 2, kVerbs = 3 };
RDMAKIT_API const char* provider_name(ProviderKind kind) noexcept;
// Parses "shm", "tcp", "verbs", "auto"; throws Error on anything else.
RDMAKIT_API ProviderKind parse_provider(const std::string& name);

// One populated entry of a port's GID table.
struct RdmaGid {
  uint32_t index = 0;
  std::string type;     // "IB", "RoCEv1", "RoCEv2"
  std::string address;  // "fe80::..." or, when IPv4-mapped, "10.77.0.1"
  bool ipv4_mapped = false;
  std::string netdev;  // "" for IB
};

struct RdmaPort {
  uint8_t port = 0;
  std::string state;       // ibv_port_state_str(): "active", "down", ...
  std::string link_layer;  // "Ethernet", "InfiniBand"
  int active_mtu = 0;      // bytes
  int max_mtu = 0;
  uint16_t lid = 0;
  int gid_table_len = 0;
  std::vector<RdmaGid> gids;
  // The entry the verbs provider uses when ContextOptions::verbs.gid_index
  // is -1, and the rule that chose it; chosen_gid < 0 if none fits.
  int64_t chosen_gid = -1;
  std::string chosen_why;
};

// The device limits of ibv_query_device that matter to rdmakit users.
struct RdmaDeviceLimits {
  uint64_t max_qp = 0, max_qp_wr = 0, max_sge = 0, max_cq = 0, max_cqe = 0, max_mr = 0;
  uint64_t max_mr_size = 0, max_qp_rd_atom = 0, max_qp_init_rd_atom = 0;
  uint64_t max_srq = 0, max_srq_wr = 0, max_pd = 0, max_mw = 0, max_ah = 0;
  uint64_t max_fmr = 0, max_mcast_grp = 0, page_size_cap = 0, device_cap_flags = 0;
  std::string atomics;  // "none", "HCA", "global"
};

struct RdmaDevice {
  std::string name;  // "rxe0", "mlx5_0"
  std::string node_guid;
  std::string firmware;
  uint32_t vendor_id = 0;
  uint32_t vendor_part_id = 0;
  RdmaDeviceLimits limits;
  std::vector<RdmaPort> ports;
};

struct RdmaDeviceList {
  bool verbs_built = false;  // false: this build has no verbs provider
  std::vector<RdmaDevice> devices;
  // Devices that could not be opened or queried, one line each.
  std::vector<std::string> problems;
  // What ProviderKind::kAuto picks on this host (RDMAKIT_PROVIDER aside),
  // and why: verbs when a device has an ACTIVE port, else shm.
  ProviderKind auto_choice = ProviderKind::kShm;
  std::string auto_reason;
  std::string memlock_limit;  // RLIMIT_MEMLOCK: "unlimited", "8 MiB", ...
  uint64_t free_huge_pages = 0;
  uint64_t huge_page_size = 0;  // bytes
};

// Opens every RDMA device briefly and describes it. Never throws for a
// device that fails: it is listed in problems instead.
RDMAKIT_API RdmaDeviceList list_devices();

}  // namespace rdmakit
