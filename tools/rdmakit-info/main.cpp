// rdmakit-info: which providers this build has and which one auto picks,
// then every RDMA device with its ports, GID table (type, address, netdev),
// MTUs and limits: ibv_devinfo + show_gids in one table.
//
//   rdmakit-info [-v|--verbose]   adds the less common device limits
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rdmakit/detail/format_bytes.hpp"
#include "rdmakit/rdmakit.hpp"

namespace {

using rdmakit::detail::format_bytes;

void print_providers(const rdmakit::RdmaDeviceList& list) {
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
  fmt::print("  auto   -> {} ({})\n", rdmakit::provider_name(list.auto_choice),
             list.auto_reason);
}

void print_devices(const rdmakit::RdmaDeviceList& list, bool verbose) {
  for (const auto& p : list.problems) fmt::print("\n  problem: {}\n", p);
  if (list.devices.empty()) {
    fmt::print("\nNo RDMA devices ({}).\n",
               list.auto_reason.empty() ? "none listed" : list.auto_reason);
    return;
  }
  for (const auto& d : list.devices) {
    const auto& a = d.limits;
    fmt::print("\nDevice {}  node GUID {}  fw {}  vendor 0x{:x} part {}\n", d.name,
               d.node_guid, d.firmware, d.vendor_id, d.vendor_part_id);
    fmt::print(
        "  limits  max_qp {}  max_qp_wr {}  max_sge {}  max_cq {}  max_cqe {}  max_mr {}"
        "  max_mr_size {}\n",
        a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_mr,
        format_bytes(a.max_mr_size));
    fmt::print(
        "          max_qp_rd_atom {}  max_qp_init_rd_atom {}  atomics {}  max_srq {}"
        "  max_srq_wr {}  max_pd {}\n",
        a.max_qp_rd_atom, a.max_qp_init_rd_atom, a.atomics, a.max_srq, a.max_srq_wr,
        a.max_pd);
    if (verbose) {
      fmt::print(
          "          max_mw {}  max_ah {}  max_fmr {}  max_mcast_grp {}  page_size_cap "
          "0x{:x}  device_cap_flags 0x{:x}\n",
          a.max_mw, a.max_ah, a.max_fmr, a.max_mcast_grp, a.page_size_cap,
          a.device_cap_flags);
    }
    for (const auto& port : d.ports) {
      fmt::print("  port {}  {}  link layer {}  MTU active {} max {}  lid {}  gids {}\n",
                 port.port, port.state, port.link_layer, port.active_mtu, port.max_mtu,
                 port.lid, port.gid_table_len);
      fmt::print("    {:>5}  {:<7} {:<40} {:<10} {}\n", "GID", "type", "address",
                 "netdev", "");
      for (const auto& g : port.gids) {
        std::string address = g.address;
        if (g.ipv4_mapped) address = "::ffff:" + g.address + " (IPv4)";
        const bool is_chosen = port.chosen_gid == static_cast<int64_t>(g.index);
        fmt::print("    {:>5}  {:<7} {:<40} {:<10} {}\n", g.index, g.type, address,
                   g.netdev.empty() ? "-" : g.netdev,
                   is_chosen ? "<- rdmakit default (" + port.chosen_why + ")" : "");
      }
    }
  }
  fmt::print("\nRLIMIT_MEMLOCK {}\n", list.memlock_limit);
  fmt::print("Huge pages: {} free of {}\n", list.free_huge_pages,
             format_bytes(list.huge_page_size));
}

constexpr const char* kUsage =
    "rdmakit-info: providers, RDMA devices, ports, GIDs, MTUs and limits\n"
    "Usage: rdmakit-info [OPTIONS]\n"
    "\n"
    "Options:\n"
    "  -h,--help                   Print this help message and exit\n"
    "  -v,--verbose                Also the less common device limits\n";

}  // namespace

int main(int argc, char** argv) {
  const bool help = argc > 1 && (std::strcmp(argv[1], "-h") == 0 ||
                                 std::strcmp(argv[1], "--help") == 0);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool verbose = argc > 1 && (std::strcmp(argv[1], "-v") == 0 ||
                                    std::strcmp(argv[1], "--verbose") == 0);
  if (argc > 2 || (argc > 1 && !verbose)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const rdmakit::RdmaDeviceList list = rdmakit::list_devices();
  print_providers(list);
  if (list.verbs_built) {
    print_devices(list, verbose);
  } else {
    fmt::print(
        "\nThis build has no verbs provider (libibverbs-dev / librdmacm-dev missing).\n");
  }
  return 0;
}
