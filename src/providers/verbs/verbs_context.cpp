// The verbs context (protection domain, memory registration, CQs, SRQs)
// and connect. The listener is in verbs_listener.cpp, connection setup
// helpers in verbs_handshake.cpp, rdma_cm plumbing in verbs_cm.cpp.
#include "providers/verbs/verbs_context.hpp"

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
#include "providers/verbs/verbs_cm.hpp"
#include "providers/verbs/verbs_cq.hpp"
#include "providers/verbs/verbs_handshake.hpp"
#include "providers/verbs/verbs_listener.hpp"
#include "providers/verbs/verbs_mr.hpp"
#include "providers/verbs/verbs_progress.hpp"
#include "providers/verbs/verbs_qp.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

using core::Clock;

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

std::unique_ptr<CompletionQueue> VerbsContext::create_cq(const CqOptions& options) {
  return std::make_unique<VerbsCq>(device_, options);
}

std::unique_ptr<SharedReceiveQueue> VerbsContext::create_srq(const SrqOptions& options) {
  return std::make_unique<VerbsSrq>(device_, options);
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
  // A peer that gave up on the handshake after its REP (its REJ moves our
  // CM id out of REP_RCVD) makes rdma_init_qp_attr or rdma_establish fail
  // with EINVAL; its REJECTED event says why, so report that instead.
  auto abandoned = [&](const Error& e) {
    if (auto event = queued_event(channel.get(), "connect", address)) {
      throw_cm_failure(*event, "connect",
                       "the peer abandoned the handshake after accepting", address);
    }
    throw e;
  };
  try {
    negotiated =
        bring_up(*device_, id.get(), parts.qp.get(), mtu, parts.options, address);
  } catch (const Error& e) {
    rdma_reject(id.get(), nullptr, 0);
    abandoned(e);
  }
  if (rdma_establish(id.get()) != 0) {
    abandoned(Error("connect", kProvider, address, errno, "rdma_establish"));
  }
  log_connected(*device_, "connected to", address, parts, negotiated, answer->mtu);
  auto conn = std::make_shared<ConnState>();
  ibv_qp* qp = parts.qp.get();
  rdma_cm_id* raw_id = id.get();
  auto result = std::make_unique<VerbsQp>(device_, std::move(id), std::move(parts),
                                          address, std::move(answer->user), conn);
  device_->progress().adopt(raw_id, qp, conn, address);
  return result;
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
