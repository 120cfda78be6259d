// rdmakit-info: which providers this build has and which one auto picks,
// then every RDMA device with its ports, GID table (type, address, netdev),
// MTUs and limits: ibv_devinfo + show_gids in one table.
//
//   rdmakit-info [-v]     -v adds the less common device limits
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#ifdef RDMAKIT_INFO_HAVE_VERBS
#include "providers/verbs/verbs_device.hpp"
#endif

namespace {

void print_providers() {
  fmt::print("Providers\n");
  for (auto kind : {rdmakit::ProviderKind::kShm, rdmakit::ProviderKind::kTcp,
                    rdmakit::ProviderKind::kVerbs}) {
    rdmakit::ContextOptions options;
    options.provider = kind;
    std::string status;
    try {
      auto ctx = rdmakit::Context::open(options);
      status = "available (device " + ctx->device_name() + ")";
    } catch (const std::exception& e) {
      status = std::string("unavailable: ") + e.what();
    }
    fmt::print("  {:<6} {}\n", rdmakit::provider_name(kind), status);
  }
#ifdef RDMAKIT_INFO_HAVE_VERBS
  std::string reason;
  const bool usable = rdmakit::verbs::device_usable(&reason);
  fmt::print("  auto   -> {}\n",
             usable ? "verbs (a device has an ACTIVE port)" : "shm (" + reason + ")");
#else
  fmt::print("  auto   -> shm (built without the verbs provider)\n");
#endif
}

#ifdef RDMAKIT_INFO_HAVE_VERBS
void print_devices(bool verbose) {
  using namespace rdmakit::verbs;
  std::vector<std::string> problems;
  std::vector<DeviceInfo> devices;
  std::string reason;
  // Without the sysfs class libibverbs has nothing to list (and says so loudly).
  if (device_usable(&reason) || reason.find("/sys/class") == std::string::npos) {
    devices = list_devices(&problems);
  }
  for (const auto& p : problems) fmt::print("\n  problem: {}\n", p);
  if (devices.empty()) {
    fmt::print("\nNo RDMA devices ({}).\n", reason.empty() ? "none listed" : reason);
    return;
  }
  for (const auto& d : devices) {
    const auto& a = d.attr;
    fmt::print("\nDevice {}  node GUID {}  fw {}  vendor 0x{:x} part {}\n", d.name,
               d.node_guid, a.fw_ver, a.vendor_id, a.vendor_part_id);
    fmt::print(
        "  limits  max_qp {}  max_qp_wr {}  max_sge {}  max_cq {}  max_cqe {}  max_mr {}"
        "  max_mr_size {}\n",
        a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_mr,
        format_bytes(a.max_mr_size));
    fmt::print(
        "          max_qp_rd_atom {}  max_qp_init_rd_atom {}  atomics {}  max_srq {}"
        "  max_srq_wr {}  max_pd {}\n",
        a.max_qp_rd_atom, a.max_qp_init_rd_atom, atomic_cap_name(a.atomic_cap), a.max_srq,
        a.max_srq_wr, a.max_pd);
    if (verbose) {
      fmt::print(
          "          max_mw {}  max_ah {}  max_fmr {}  max_mcast_grp {}  page_size_cap "
          "0x{:x}  device_cap_flags 0x{:x}\n",
          a.max_mw, a.max_ah, a.max_fmr, a.max_mcast_grp, a.page_size_cap,
          a.device_cap_flags);
    }
    for (const auto& port : d.ports) {
      const auto& pa = port.attr;
      fmt::print("  port {}  {}  link layer {}  MTU active {} max {}  lid {}  gids {}\n",
                 port.port, ibv_port_state_str(pa.state), link_layer_name(pa.link_layer),
                 mtu_bytes(pa.active_mtu), mtu_bytes(pa.max_mtu), pa.lid, pa.gid_tbl_len);
      std::string why;
      const auto chosen = choose_gid(port.gids, -1, &why);
      fmt::print("    {:>5}  {:<7} {:<40} {:<10} {}\n", "GID", "type", "address",
                 "netdev", "");
      for (const auto& g : port.gids) {
        std::string address = g.address;
        if (g.ipv4_mapped) address = "::ffff:" + g.address + " (IPv4)";
        const bool is_chosen = chosen && chosen->index == g.index;
        fmt::print("    {:>5}  {:<7} {:<40} {:<10} {}\n", g.index, gid_type_name(g.type),
                   address, g.netdev.empty() ? "-" : g.netdev,
                   is_chosen ? "<- rdmakit default (" + why + ")" : "");
      }
    }
  }
  fmt::print("\nRLIMIT_MEMLOCK {}\n", memlock_limit_text());
  size_t page = 0;
  const size_t free_pages = free_huge_pages(&page);
  fmt::print("Huge pages: {} free of {}\n", free_pages, format_bytes(page));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const bool verbose = argc > 1 && std::strcmp(argv[1], "-v") == 0;
  if (argc > 1 && !verbose) {
    std::fprintf(stderr, "usage: rdmakit-info [-v]\n");
    return 2;
  }
  print_providers();
#ifdef RDMAKIT_INFO_HAVE_VERBS
  print_devices(verbose);
#else
  (void)verbose;
  fmt::print(
      "\nThis build has no verbs provider (libibverbs-dev / librdmacm-dev missing).\n");
#endif
  return 0;
}
