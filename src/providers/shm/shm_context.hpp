#pragma once
#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_link.hpp"
#include "providers/shm/shm_peer_policy.hpp"
#include "providers/shm/shm_progress.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {

class ShmMr;

// The shm protection domain: a region table in a memfd that peers map
// read-only (so rkey checks and deregistration need no peer CPU), and a
// progress thread that hands out region descriptors, performs atomics on
// regions peers cannot map, and notices dead peers.
class ShmContext final : public Context {
 public:
  // streaming_write_min: WRITE_WITH_IMMs of at least this many bytes copy
  // with non-temporal stores (0: never); see copy_streaming().
  explicit ShmContext(uint64_t streaming_write_min = 0,
                      const ShmContextOptions& options = {});
  ~ShmContext() override;

  std::string device_name() const override { return "shm"; }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override;
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override;
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options) override;
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& options) override;
  std::unique_ptr<Listener> listen(const std::string& address) override;
  std::unique_ptr<QueuePair> connect(const std::string& address, const QpOptions& options,
                                     std::span<const std::byte> private_data,
                                     std::chrono::milliseconds timeout) override;

  RegionTable& table() noexcept { return *table_; }
  // What peers receive: the region table's memfd, sealed so that no
  // descriptor of it can be mapped writable (F_SEAL_FUTURE_WRITE).
  int table_fd() const noexcept { return table_fd_.get(); }
  const PeerPolicy& peer_policy() const noexcept { return peer_policy_; }

  // Region bookkeeping (control path).
  // Throws Error(ENOSPC) when the table is full.
  uint32_t reserve_key();
  void publish_region(uint32_t key, ShmMr* region, RegionKind kind, uint64_t addr,
                      uint64_t length, uint32_t access);
  void remove_region(uint32_t key);

  // The progress thread, which watches each QP's link.
  ShmProgress& progress() noexcept { return *progress_; }
  // The answer to a peer's request (region descriptor or atomic), checked
  // against the region table; *region_fd receives the descriptor handed out.
  Reply answer(const Request& request, bool other_user, Fd* region_fd);

  uint32_t next_qp_num() noexcept { return next_qp_num_++; }
  uint64_t streaming_write_min() const noexcept { return streaming_write_min_; }

  // A peer context's region table (fd as received in a handshake), mapped
  // read-only once however many QPs lead to that peer: each mapping of it
  // would otherwise hold up to 64 KiB resident (the kernel maps the pages
  // around every fault). nullptr with errno set on failure.
  std::shared_ptr<const RegionTable> map_peer_table(int fd);
  // The wake descriptor of a peer's completion queue, one per queue however
  // many QPs lead to it (each handshake passes its own copy).
  std::shared_ptr<const Fd> share_peer_wake(Fd fd);

 private:
  uint64_t streaming_write_min_;
  PeerPolicy peer_policy_;
  Fd table_fd_;
  RegionTable* table_ = nullptr;
  std::mutex mutex_;  // regions_, free_indices_
  ShmMr* regions_[kRegionTableSize] = {};
  std::vector<uint32_t> free_indices_;
  uint32_t generation_;
  std::atomic<uint32_t> next_qp_num_{1};
  std::mutex peer_tables_mutex_;
  // By the memfd's (device, inode): a live mapping keeps its inode in use.
  std::map<std::pair<dev_t, ino_t>, std::weak_ptr<const RegionTable>> peer_tables_;
  std::vector<std::weak_ptr<const Fd>> peer_wakes_;
  std::unique_ptr<ShmProgress> progress_;  // started last, stopped first
};

}  // namespace rdmakit::shm
