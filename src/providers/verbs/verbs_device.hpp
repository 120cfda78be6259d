#pragma once
// The verbs device: the one a context opened (Device), discovery, and the
// small verbs facts the provider and rdmakit-info share: GID tables, GID
// choice, MTUs, status names, RLIMIT_MEMLOCK, huge pages.
#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "providers/verbs/verbs_objects.hpp"
#include "rdmakit/detail/format_bytes.hpp"
#include "rdmakit/status.hpp"

namespace rdmakit::verbs {

inline constexpr const char* kProvider = "verbs";

struct GidInfo {
  uint32_t index = 0;
  ibv_gid gid{};
  ibv_gid_type type = IBV_GID_TYPE_IB;
  uint32_t ifindex = 0;
  std::string netdev;   // "" for IB
  std::string address;  // "fe80::..." or, when IPv4-mapped, "10.77.0.1"
  bool ipv4_mapped = false;
};

struct PortInfo {
  uint8_t port = 0;
  ibv_port_attr attr{};
  std::vector<GidInfo> gids;
};

struct DeviceInfo {
  std::string name;
  std::string node_guid;
  ibv_device_attr attr{};
  std::vector<PortInfo> ports;
};

// Queries one opened device. Throws rdmakit::Error on a failed query.
DeviceInfo query_device(ibv_context* context);
std::vector<GidInfo> query_gids(ibv_context* context, uint8_t port, int table_len);

// Lists every device ibv_get_device_list sees (opens each briefly). Devices
// that fail to open are reported in *problems instead of throwing.
std::vector<DeviceInfo> list_devices(std::vector<std::string>* problems);

// The GID rdmakit uses: override_index >= 0 must name a valid entry; otherwise
// the first RoCEv2 IPv4-mapped entry, then any RoCEv2, then the first entry.
// *why says which rule chose it.
std::optional<GidInfo> choose_gid(const std::vector<GidInfo>& gids, int override_index,
                                  std::string* why);

// true when some device has an ACTIVE port. Reads sysfs only: cheap, silent
// and harmless on hosts without RDMA (then *reason says what is missing).
bool device_usable(std::string* reason);

const char* gid_type_name(ibv_gid_type type) noexcept;  // "IB", "RoCEv1", "RoCEv2"
const char* link_layer_name(uint8_t link_layer) noexcept;
int mtu_bytes(ibv_mtu mtu) noexcept;  // IBV_MTU_1024 -> 1024
const char* atomic_cap_name(ibv_atomic_cap cap) noexcept;

// ibv_wc_status -> the core's Status (one to one).
Status map_wc_status(ibv_wc_status status) noexcept;

// Pages the kernel pins to register [addr, addr + length): the kernel
// counts whole pages of the range, so a page-aligned region costs exactly
// its size. UINT64_MAX if the range wraps the address space.
uint64_t pinned_pages(uint64_t addr, uint64_t length, uint64_t page_size) noexcept;
// This process's pinned pages across all its contexts (RLIMIT_MEMLOCK is
// per process); kept by every memory region's registration.
std::atomic<uint64_t>& process_pinned_pages() noexcept;
// RLIMIT_MEMLOCK: nullopt when registering [addr, addr + length) on top of
// what this process has pinned fits (or CAP_IPC_LOCK / unlimited makes the
// limit moot); otherwise a message saying what to raise.
std::optional<std::string> memlock_shortfall(const void* addr, size_t length);
std::string memlock_limit_text();  // "unlimited", "8 MiB", ... for logs

// Free huge pages of the default size (bytes per page in *page_size).
size_t free_huge_pages(size_t* page_size);

using rdmakit::detail::format_bytes;  // "8 MiB", ... for logs and errors

class VerbsProgress;

// One opened device + port + protection domain. Everything a context
// creates holds a shared_ptr<Device>, so the protection domain outlives its
// users whatever order the application destroys objects in.
struct Device {
  CmDeviceList cm_devices;  // keeps librdmacm's ibv_context open
  ibv_context* context = nullptr;
  DeviceInfo info;
  uint8_t port = 1;
  ibv_port_attr port_attr{};
  GidInfo gid;
  bool gid_overridden = false;
  PdHandle pd;
  std::once_flag progress_once;
  std::unique_ptr<VerbsProgress> progress_thread;  // declared last: stops first

  std::string name() const { return info.name; }
  VerbsProgress& progress();  // started with the first connection
  ~Device();
};

}  // namespace rdmakit::verbs
