#include "providers/verbs/verbs_device.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "providers/verbs/verbs_objects.hpp"
#include "providers/verbs/verbs_progress.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

Device::~Device() = default;

VerbsProgress& Device::progress() {
  std::call_once(progress_once,
                 [this] { progress_thread = std::make_unique<VerbsProgress>(); });
  return *progress_thread;
}

namespace {

std::string gid_text(const ibv_gid& gid, bool* ipv4_mapped) {
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  *ipv4_mapped = std::memcmp(gid.raw, kMappedPrefix, sizeof kMappedPrefix) == 0;
  if (*ipv4_mapped) {
    inet_ntop(AF_INET, gid.raw + 12, text, sizeof text);
  } else {
    inet_ntop(AF_INET6, gid.raw, text, sizeof text);
  }
  return text;
}

bool gid_is_zero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw) {
    if (b != 0) return false;
  }
  return true;
}

std::string read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::vector<GidInfo> query_gids(ibv_context* context, uint8_t port, int table_len) {
  std::vector<GidInfo> out;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry entry{};
    // Unpopulated RoCE entries fail with ENODATA; skip them quietly.
    if (ibv_query_gid_ex(context, port, static_cast<uint32_t>(i), &entry, 0) != 0)
      continue;
    if (gid_is_zero(entry.gid)) continue;
    GidInfo gid;
    gid.index = entry.gid_index;
    gid.gid = entry.gid;
    gid.type = static_cast<ibv_gid_type>(entry.gid_type);
    gid.ifindex = entry.ndev_ifindex;
    char name[IF_NAMESIZE] = {};
    if (entry.ndev_ifindex != 0 && if_indextoname(entry.ndev_ifindex, name) != nullptr) {
      gid.netdev = name;
    }
    gid.address = gid_text(entry.gid, &gid.ipv4_mapped);
    out.push_back(std::move(gid));
  }
  return out;
}

DeviceInfo query_device(ibv_context* context) {
  DeviceInfo info;
  info.name = ibv_get_device_name(context->device);
  if (int rc = ibv_query_device(context, &info.attr); rc != 0) {
    throw Error("ibv_query_device", "verbs", "", rc, "device " + info.name);
  }
  const uint64_t guid = be64toh(ibv_get_device_guid(context->device));
  info.node_guid =
      fmt::format("{:04x}:{:04x}:{:04x}:{:04x}", (guid >> 48) & 0xffff,
                  (guid >> 32) & 0xffff, (guid >> 16) & 0xffff, guid & 0xffff);
  for (uint8_t p = 1; p <= info.attr.phys_port_cnt; ++p) {
    PortInfo port;
    port.port = p;
    if (int rc = ibv_query_port(context, p, &port.attr); rc != 0) {
      throw Error("ibv_query_port", "verbs", "", rc,
                  fmt::format("device {} port {}", info.name, p));
    }
    port.gids = query_gids(context, p, port.attr.gid_tbl_len);
    info.ports.push_back(std::move(port));
  }
  return info;
}

std::vector<DeviceInfo> list_devices(std::vector<std::string>* problems) {
  std::vector<DeviceInfo> out;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    problems->push_back(fmt::format("ibv_get_device_list: {}", std::strerror(errno)));
    return out;
  }
  for (int i = 0; i < count; ++i) {
    ibv_context* context = ibv_open_device(list[i]);
    if (context == nullptr) {
      problems->push_back(fmt::format(
          "ibv_open_device({}): {}", ibv_get_device_name(list[i]), std::strerror(errno)));
      continue;
    }
    try {
      out.push_back(query_device(context));
    } catch (const Error& e) {
      problems->push_back(e.what());
    }
    ibv_close_device(context);
  }
  ibv_free_device_list(list);
  return out;
}

std::optional<GidInfo> choose_gid(const std::vector<GidInfo>& gids, int override_index,
                                  std::string* why) {
  if (override_index >= 0) {
    for (const auto& gid : gids) {
      if (gid.index == static_cast<uint32_t>(override_index)) {
        *why = "gid_index override";
        return gid;
      }
    }
    *why = fmt::format("gid_index {} is not a populated GID table entry", override_index);
    return std::nullopt;
  }
  for (const auto& gid : gids) {
    if (gid.type == IBV_GID_TYPE_ROCE_V2 && gid.ipv4_mapped) {
      *why = "auto: first IPv4-mapped RoCEv2 entry";
      return gid;
    }
  }
  for (const auto& gid : gids) {
    if (gid.type == IBV_GID_TYPE_ROCE_V2) {
      *why = "auto: first RoCEv2 entry (no IPv4-mapped one)";
      return gid;
    }
  }
  if (!gids.empty()) {
    *why = "auto: first entry (no RoCEv2 entries)";
    return gids.front();
  }
  *why = "the GID table is empty";
  return std::nullopt;
}

bool device_usable(std::string* reason) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = "/sys/class/infiniband";
  if (!fs::exists(root, ec)) {
    *reason = "/sys/class/infiniband does not exist (no RDMA driver loaded)";
    return false;
  }
  if (!fs::exists("/dev/infiniband", ec)) {
    *reason = "/dev/infiniband does not exist (ib_uverbs not loaded)";
    return false;
  }
  std::string seen;
  for (const auto& device : fs::directory_iterator(root, ec)) {
    for (const auto& port : fs::directory_iterator(device.path() / "ports", ec)) {
      const std::string state = read_line(port.path() / "state");  // "4: ACTIVE"
      if (state.find("ACTIVE") != std::string::npos) return true;
      seen += fmt::format("{}{} port {} is {}", seen.empty() ? "" : ", ",
                          device.path().filename().string(),
                          port.path().filename().string(), state);
    }
  }
  *reason = seen.empty() ? "no RDMA devices" : "no ACTIVE port (" + seen + ")";
  return false;
}

const char* gid_type_name(ibv_gid_type type) noexcept {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCEv1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCEv2";
  }
  return "unknown";
}

const char* link_layer_name(uint8_t link_layer) noexcept {
  switch (link_layer) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

int mtu_bytes(ibv_mtu mtu) noexcept {
  switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

const char* atomic_cap_name(ibv_atomic_cap cap) noexcept {
  switch (cap) {
    case IBV_ATOMIC_NONE: return "none";
    case IBV_ATOMIC_HCA: return "HCA";
    case IBV_ATOMIC_GLOB: return "global";
  }
  return "unknown";
}

Status map_wc_status(ibv_wc_status status) noexcept {
  switch (status) {
    case IBV_WC_SUCCESS: return Status::kSuccess;
    case IBV_WC_LOC_LEN_ERR: return Status::kLocalLengthError;
    case IBV_WC_LOC_QP_OP_ERR: return Status::kLocalQpOperationError;
    case IBV_WC_LOC_PROT_ERR: return Status::kLocalProtectionError;
    case IBV_WC_WR_FLUSH_ERR: return Status::kWrFlushError;
    case IBV_WC_BAD_RESP_ERR: return Status::kBadResponseError;
    case IBV_WC_LOC_ACCESS_ERR: return Status::kLocalAccessError;
    case IBV_WC_REM_INV_REQ_ERR: return Status::kRemoteInvalidRequestError;
    case IBV_WC_REM_ACCESS_ERR: return Status::kRemoteAccessError;
    case IBV_WC_REM_OP_ERR: return Status::kRemoteOperationError;
    case IBV_WC_RETRY_EXC_ERR: return Status::kRetryExceeded;
    case IBV_WC_RNR_RETRY_EXC_ERR: return Status::kRnrRetryExceeded;
    case IBV_WC_FATAL_ERR: return Status::kFatalError;
    case IBV_WC_RESP_TIMEOUT_ERR: return Status::kResponseTimeout;
    default: return Status::kGeneralError;  // EEC/invalid-RD statuses: no RC meaning
  }
}

namespace {

// The kernel skips RLIMIT_MEMLOCK for pinning when the caller has CAP_IPC_LOCK.
bool has_cap_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

}  // namespace

std::string memlock_limit_text() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  std::string text =
      limit.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(limit.rlim_cur);
  if (has_cap_ipc_lock()) text += " (CAP_IPC_LOCK: not enforced)";
  return text;
}

uint64_t pinned_pages(uint64_t addr, uint64_t length, uint64_t page_size) noexcept {
  if (length == 0 || page_size == 0) return 0;
  if (length - 1 > UINT64_MAX - addr) return UINT64_MAX;
  return (addr + length - 1) / page_size - addr / page_size + 1;
}

std::atomic<uint64_t>& process_pinned_pages() noexcept {
  static std::atomic<uint64_t> pages{0};
  return pages;
}

std::optional<std::string> memlock_shortfall(const void* addr, size_t length) {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::nullopt;
  }
  if (has_cap_ipc_lock()) return std::nullopt;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t limit_pages = limit.rlim_cur / page;
  const uint64_t already = process_pinned_pages().load();
  const uint64_t need = pinned_pages(reinterpret_cast<uint64_t>(addr), length, page);
  if (already <= limit_pages && need <= limit_pages - already) return std::nullopt;
  const uint64_t already_registered = already * page;
  const uint64_t more = length;
  return fmt::format(
      "RLIMIT_MEMLOCK is {} and this process already has {} registered; pinning {} more "
      "would exceed it. Raise the locked-memory limit: `ulimit -l unlimited` in the "
      "shell, "
      "LimitMEMLOCK=infinity for a systemd unit, a `memlock` line in "
      "/etc/security/limits.conf, or `--ulimit memlock=-1` for docker",
      format_bytes(limit.rlim_cur), format_bytes(already_registered), format_bytes(more));
}

size_t free_huge_pages(size_t* page_size) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t value = 0;
  size_t free_pages = 0;
  *page_size = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") free_pages = value;
    if (key == "Hugepagesize:") *page_size = value * 1024;  // reported in kB
    in.ignore(256, '\n');
  }
  return *page_size == 0 ? 0 : free_pages;
}

}  // namespace rdmakit::verbs

namespace rdmakit::core {

bool verbs_device_usable(std::string* reason) { return verbs::device_usable(reason); }

void list_verbs_devices(RdmaDeviceList* list) {
  std::string reason;
  if (verbs::device_usable(&reason)) {
    list->auto_choice = ProviderKind::kVerbs;
    list->auto_reason = "a device has an ACTIVE port";
  } else {
    list->auto_choice = ProviderKind::kShm;
    list->auto_reason = reason;
  }
  // Without the sysfs class libibverbs has nothing to list (and says so loudly).
  std::vector<verbs::DeviceInfo> devices;
  if (list->auto_choice == ProviderKind::kVerbs ||
      reason.find("/sys/class") == std::string::npos) {
    devices = verbs::list_devices(&list->problems);
  }
  for (const verbs::DeviceInfo& d : devices) {
    RdmaDevice out;
    const ibv_device_attr& a = d.attr;
    out.name = d.name;
    out.node_guid = d.node_guid;
    out.firmware = a.fw_ver;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    RdmaDeviceLimits& l = out.limits;
    l.max_qp = static_cast<uint64_t>(a.max_qp);
    l.max_qp_wr = static_cast<uint64_t>(a.max_qp_wr);
    l.max_sge = static_cast<uint64_t>(a.max_sge);
    l.max_cq = static_cast<uint64_t>(a.max_cq);
    l.max_cqe = static_cast<uint64_t>(a.max_cqe);
    l.max_mr = static_cast<uint64_t>(a.max_mr);
    l.max_mr_size = a.max_mr_size;
    l.max_qp_rd_atom = static_cast<uint64_t>(a.max_qp_rd_atom);
    l.max_qp_init_rd_atom = static_cast<uint64_t>(a.max_qp_init_rd_atom);
    l.max_srq = static_cast<uint64_t>(a.max_srq);
    l.max_srq_wr = static_cast<uint64_t>(a.max_srq_wr);
    l.max_pd = static_cast<uint64_t>(a.max_pd);
    l.max_mw = static_cast<uint64_t>(a.max_mw);
    l.max_ah = static_cast<uint64_t>(a.max_ah);
    l.max_fmr = static_cast<uint64_t>(a.max_fmr);
    l.max_mcast_grp = static_cast<uint64_t>(a.max_mcast_grp);
    l.page_size_cap = a.page_size_cap;
    l.device_cap_flags = a.device_cap_flags;
    l.atomics = verbs::atomic_cap_name(a.atomic_cap);
    for (const verbs::PortInfo& p : d.ports) {
      RdmaPort port;
      port.port = p.port;
      port.state = ibv_port_state_str(p.attr.state);
      port.link_layer = verbs::link_layer_name(p.attr.link_layer);
      port.active_mtu = verbs::mtu_bytes(p.attr.active_mtu);
      port.max_mtu = verbs::mtu_bytes(p.attr.max_mtu);
      port.lid = p.attr.lid;
      port.gid_table_len = p.attr.gid_tbl_len;
      for (const verbs::GidInfo& g : p.gids) {
        port.gids.push_back(RdmaGid{g.index, verbs::gid_type_name(g.type), g.address,
                                    g.ipv4_mapped, g.netdev});
      }
      if (const auto chosen = verbs::choose_gid(p.gids, -1, &port.chosen_why)) {
        port.chosen_gid = chosen->index;
      }
      out.ports.push_back(std::move(port));
    }
    list->devices.push_back(std::move(out));
  }
  list->memlock_limit = verbs::memlock_limit_text();
  size_t page = 0;
  list->free_huge_pages = verbs::free_huge_pages(&page);
  list->huge_page_size = page;
}

}  // namespace rdmakit::core
