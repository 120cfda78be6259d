#include "providers/shm/shm_context.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "providers/shm/shm_cq.hpp"
#include "providers/shm/shm_listener.hpp"
#include "providers/shm/shm_mr.hpp"
#include "providers/shm/shm_qp.hpp"
#include "providers/shm/shm_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

Error context_error(const char* what, int err, const std::string& detail = {}) {
  return Error(what, "shm", "", err, detail);
}

size_t page_round(size_t length) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (length + page - 1) / page * page;
}

}  // namespace

ShmContext::ShmContext(uint64_t streaming_write_min, const ShmContextOptions& options)
    : Context(ProviderKind::kShm),
      streaming_write_min_(streaming_write_min),
      peer_policy_(options) {
  table_fd_ = create_resizable_sealed_memfd("rdmakit-shm-regions", sizeof(RegionTable));
  if (!table_fd_) throw context_error("memfd_create(region table)", errno);
  void* mem = map_fd(table_fd_.get(), sizeof(RegionTable), true);
  if (mem == nullptr) throw context_error("mmap(region table)", errno);
  // Peers check access against the table but must never rewrite what we
  // (and our other peers) check: only our mapping stays writable.
  if (!finish_seals(table_fd_.get(), true)) {
    const int err = errno;
    ::munmap(mem, sizeof(RegionTable));
    throw context_error("fcntl(F_SEAL_FUTURE_WRITE, region table)", err);
  }
  table_ = new (mem) RegionTable();
  free_indices_.reserve(kRegionTableSize);
  for (uint32_t i = kRegionTableSize; i-- > 0;) free_indices_.push_back(i);
  generation_ = std::random_device{}() & ((1u << (32 - kRegionIndexBits)) - 1);
  if (peer_policy_.ptrace_restricted()) {
    core::log().debug(
        "shm: Yama ptrace_scope >= 1: SEND payloads travel through a socket, and peers "
        "cannot reach memory given to register_memory()");
  }

  progress_ = std::make_unique<ShmProgress>(*this);
}

ShmContext::~ShmContext() {
  progress_.reset();  // its thread reads the region table
  ::munmap(table_, sizeof(RegionTable));
}

uint32_t ShmContext::reserve_key() {
  std::lock_guard lock(mutex_);
  if (free_indices_.empty()) {
    throw context_error("register_memory", ENOSPC,
                        "region table full (" + std::to_string(kRegionTableSize) +
                            " regions per context)");
  }
  const uint32_t index = free_indices_.back();
  free_indices_.pop_back();
  uint32_t key;
  do {
    generation_ = (generation_ + 1) & ((1u << (32 - kRegionIndexBits)) - 1);
    key = (generation_ << kRegionIndexBits) | index;
  } while (key == 0);
  return key;
}

void ShmContext::publish_region(uint32_t key, ShmMr* region, RegionKind kind,
                                uint64_t addr, uint64_t length, uint32_t access) {
  std::lock_guard lock(mutex_);
  const uint32_t index = key & kRegionIndexMask;
  regions_[index] = region;
  RegionEntry& entry = table_->entries[index];
  // Release stores: a reader that sees a new field value also sees the key
  // that was invalidated before it, so its second key load fails.
  entry.access.store(access, std::memory_order_release);
  entry.kind.store(static_cast<uint32_t>(kind), std::memory_order_release);
  entry.addr.store(addr, std::memory_order_release);
  entry.length.store(length, std::memory_order_release);
  entry.key.store(key, std::memory_order_release);
}

void ShmContext::remove_region(uint32_t key) {
  std::lock_guard lock(mutex_);
  const uint32_t index = key & kRegionIndexMask;
  // Invalidate first: a peer that checks after this sees a dead key.
  table_->entries[index].key.store(0, std::memory_order_seq_cst);
  regions_[index] = nullptr;
  free_indices_.push_back(index);
}

std::unique_ptr<MemoryRegion> ShmContext::register_memory(void* addr, size_t length,
                                                          uint32_t access) {
  if (addr == nullptr && length != 0) {
    throw context_error("register_memory", EINVAL, "null address");
  }
  if ((access & ~static_cast<uint32_t>(kAccessAll)) != 0) {
    throw context_error("register_memory", EINVAL, "unknown access bits");
  }
  const uint32_t key = reserve_key();
  auto region = std::make_unique<ShmMr>(*this, addr, length, key, access, Fd(), 0);
  publish_region(key, region.get(), RegionKind::kUser, reinterpret_cast<uint64_t>(addr),
                 length, access);
  return region;
}

std::shared_ptr<const Fd> ShmContext::share_peer_wake(Fd fd) {
  // Every eventfd has the same (anonymous) inode: the kernel tells whether
  // two descriptors are one open file (kcmp). Without kcmp, no sharing.
  const pid_t self = ::getpid();
  std::lock_guard lock(peer_tables_mutex_);
  std::erase_if(peer_wakes_, [](const auto& w) { return w.expired(); });
  for (const auto& w : peer_wakes_) {
    auto live = w.lock();
    if (live && ::syscall(SYS_kcmp, self, self, KCMP_FILE, fd.get(), live->get()) == 0) {
      return live;  // fd closes here
    }
  }
  auto wake = std::make_shared<const Fd>(std::move(fd));
  peer_wakes_.push_back(wake);
  return wake;
}

std::shared_ptr<const RegionTable> ShmContext::map_peer_table(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return nullptr;
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  std::lock_guard lock(peer_tables_mutex_);
  if (auto live = peer_tables_[id].lock()) return live;
  void* mem = map_fd(fd, sizeof(RegionTable), false);
  if (mem == nullptr) return nullptr;
  std::shared_ptr<const RegionTable> table(
      static_cast<const RegionTable*>(mem), [](const RegionTable* t) {
        ::munmap(const_cast<RegionTable*>(t), sizeof(RegionTable));
      });
  peer_tables_[id] = table;
  // Drop entries of peers no QP leads to any more.
  std::erase_if(peer_tables_, [](const auto& e) { return e.second.expired(); });
  return table;
}

std::unique_ptr<MemoryRegion> ShmContext::allocate(size_t length, uint32_t access) {
  if ((access & ~static_cast<uint32_t>(kAccessAll)) != 0) {
    throw context_error("allocate", EINVAL, "unknown access bits");
  }
  const size_t mapped = page_round(length == 0 ? 1 : length);
  // Memory no peer may reach keeps no descriptor (one fewer per region: a
  // stream's send buffer). Still a memfd, closed once mapped: its pages are
  // charged as they are touched, where private anonymous memory would be
  // charged whole under strict overcommit, and a fork shares it.
  if ((access & (kAccessRemoteRead | kAccessRemoteWrite | kAccessRemoteAtomic)) == 0) {
    const Fd memfd = create_resizable_sealed_memfd("rdmakit-shm-local", mapped);
    if (!memfd) {
      throw context_error("memfd_create(region)", errno,
                          "allocating " + std::to_string(length) + " bytes");
    }
    void* mem = map_fd(memfd.get(), mapped, true, true);
    if (mem == nullptr) throw context_error("mmap(region)", errno);
    const uint32_t key = reserve_key();
    auto region = std::make_unique<ShmMr>(*this, mem, length, key, access, Fd(), mapped);
    publish_region(key, region.get(), RegionKind::kUser, reinterpret_cast<uint64_t>(mem),
                   length, access);
    return region;
  }
  Fd memfd = create_resizable_sealed_memfd("rdmakit-shm-region", mapped);
  if (!memfd) {
    throw context_error("memfd_create(region)", errno,
                        "allocating " + std::to_string(length) + " bytes");
  }
  void* mem = map_fd(memfd.get(), mapped, true, true);
  if (mem == nullptr) throw context_error("mmap(region)", errno);
  // A region peers may not write is sealed so: a descriptor of it that a
  // peer holds can never be mapped or reopened writable.
  const bool peers_write = (access & (kAccessRemoteWrite | kAccessRemoteAtomic)) != 0;
  if (!finish_seals(memfd.get(), !peers_write)) {
    const int err = errno;
    ::munmap(mem, mapped);
    throw context_error("fcntl(F_ADD_SEALS, region)", err);
  }
  const uint32_t key = reserve_key();
  auto region =
      std::make_unique<ShmMr>(*this, mem, length, key, access, std::move(memfd), mapped);
  publish_region(key, region.get(), RegionKind::kMemfd, reinterpret_cast<uint64_t>(mem),
                 length, access);
  return region;
}

std::unique_ptr<CompletionQueue> ShmContext::create_cq(const CqOptions& options) {
  return std::make_unique<ShmCq>(options);
}

std::unique_ptr<SharedReceiveQueue> ShmContext::create_srq(const SrqOptions& options) {
  return std::make_unique<ShmSrq>(*this, options);
}

std::unique_ptr<Listener> ShmContext::listen(const std::string& address) {
  return std::make_unique<ShmListener>(*this, address);
}

std::unique_ptr<QueuePair> ShmContext::connect(const std::string& address,
                                               const QpOptions& options,
                                               std::span<const std::byte> private_data,
                                               std::chrono::milliseconds timeout) {
  return connect_queue_pair(*this, address, options, private_data, timeout);
}

Reply ShmContext::answer(const Request& request, bool other_user, Fd* region_fd) {
  Reply reply{static_cast<uint32_t>(Status::kRemoteAccessError), 0, 0};
  std::lock_guard lock(mutex_);
  const uint32_t index = request.rkey & kRegionIndexMask;
  ShmMr* region = regions_[index];
  const bool live = region != nullptr && region->rkey() == request.rkey;
  // Only a region that grants remote access is ever handed out; one that
  // grants no remote write goes out sealed read-only (see allocate()).
  constexpr uint32_t kRemoteBits =
      kAccessRemoteRead | kAccessRemoteWrite | kAccessRemoteAtomic;
  // A peer of another user maps a region only to write it, or to read it
  // when it is sealed read-only; atomics on any other stay with the owner,
  // which performs each one.
  const uint32_t access = live ? region->access() : 0;
  const bool mappable =
      other_user ? ((access & kAccessRemoteWrite) != 0 ||
                    ((access & kAccessRemoteRead) != 0 && !region->peers_may_write()))
                 : (access & kRemoteBits) != 0;
  if (live && request.op == RequestOp::kGetRegion &&
      region->kind() == RegionKind::kMemfd && mappable) {
    region_fd->reset(::fcntl(region->memfd(), F_DUPFD_CLOEXEC, 0));
    reply.writable = (other_user ? (region->access() & kAccessRemoteWrite) != 0
                                 : region->peers_may_write())
                         ? 1
                         : 0;
    reply.status = static_cast<uint32_t>(*region_fd ? Status::kSuccess
                                                    : Status::kRemoteOperationError);
  } else if (live &&
             (request.op == RequestOp::kCompareSwap ||
              request.op == RequestOp::kFetchAdd) &&
             !(other_user && region->kind() == RegionKind::kUser)) {
    // register_memory() memory is never reached by another user.
    const uint64_t base = reinterpret_cast<uint64_t>(region->addr());
    const bool in_range = request.addr >= base && region->length() >= 8 &&
                          request.addr - base <= region->length() - 8;
    if (in_range && (region->access() & kAccessRemoteAtomic) != 0 &&
        request.addr % 8 == 0) {
      std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(request.addr));
      if (request.op == RequestOp::kFetchAdd) {
        reply.value = word.fetch_add(request.compare_add);
      } else {
        uint64_t expected = request.compare_add;
        word.compare_exchange_strong(expected, request.swap);
        reply.value = expected;
      }
      reply.status = static_cast<uint32_t>(Status::kSuccess);
    }
  }
  return reply;
}

}  // namespace rdmakit::shm

namespace rdmakit::core {
std::unique_ptr<Context> make_shm_context(const ContextOptions& options) {
  // RDMAKIT_SHM_STREAMING_WRITE_MIN=N: WRITE_WITH_IMMs of at least N bytes
  // (at least 4096) copy with non-temporal stores. Off by default: it pays
  // when the two cores are far apart (a line between them costs more than
  // memory), and halves streaming when they share a cache (docs/streams.md).
  uint64_t streaming_min = 0;
  if (const char* env = std::getenv("RDMAKIT_SHM_STREAMING_WRITE_MIN");
      env != nullptr && *env != 0) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end == env || *end != 0) {
      core::log().warn(
          "shm: RDMAKIT_SHM_STREAMING_WRITE_MIN='{}' is not a byte count; ignored (off)",
          env);
    } else if (v != 0) {
      streaming_min = std::max<uint64_t>(v, 4096);
      core::log().info(
          "shm: WRITE_WITH_IMMs of at least {} bytes use non-temporal stores "
          "(RDMAKIT_SHM_STREAMING_WRITE_MIN={})",
          streaming_min, env);
    }
  }
  return std::make_unique<shm::ShmContext>(streaming_min, options.shm);
}
}  // namespace rdmakit::core
