// The shm queue pair's one-sided access to the peer's memory: the mappings
// of its regions (asked of its progress thread on first touch), the checks
// of each access against its region table, copies and atomics.
#include <sys/mman.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <new>

#include "core/work_request.hpp"
#include "providers/shm/shm_qp.hpp"
#include "rdmakit/detail/small_copy.hpp"

namespace rdmakit::shm {

ShmQp::Mapping& ShmQp::mapping_for(uint32_t rkey) noexcept {
  static_assert((kInitialMappings & (kInitialMappings - 1)) == 0 &&
                kInitialMappings <= kRegionTableSize);
  Mapping* m = &mappings_[rkey & mapping_mask_];
  if (m->key == rkey) [[likely]]
    return *m;  // mapped: the data path's only case, as cheap as the old table
  while (m->base != nullptr && ((m->key ^ rkey) & kRegionIndexMask) != 0) {
    // Another region's mapping: double the cache rather than evict (two
    // regions used in turn would remap on every access). Entries distinct
    // modulo n stay distinct modulo 2n.
    const uint32_t size = (mapping_mask_ + 1) * 2;  // <= kRegionTableSize: indices differ
    auto grown = std::unique_ptr<Mapping[]>(new (std::nothrow) Mapping[size]);
    if (!grown) {
      ::munmap(m->base, m->bytes);  // no memory: evict, it is mapped again on use
      *m = Mapping{};
      break;
    }
    for (uint32_t i = 0; i <= mapping_mask_; ++i) {
      if (mappings_[i].base != nullptr)
        grown[mappings_[i].key & (size - 1)] = mappings_[i];
    }
    mappings_ = std::move(grown);
    mapping_mask_ = size - 1;
    m = &mappings_[rkey & mapping_mask_];
  }
  return *m;
}

ShmQp::Target ShmQp::resolve(uint32_t rkey, uint64_t addr, uint64_t length, uint32_t need,
                             bool want_write) noexcept {
  Target target;
  EntryView view;
  if (!read_entry(*peer_table_, rkey, &view) || !in_range(view, addr, length) ||
      (view.access & need) != need) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  // Memory given to register_memory(), and a RECV buffer that grants no
  // remote write, are reached through the kernel (process_vm_*): only by a
  // process of the same user, at the pid the kernel named.
  if (view.kind == RegionKind::kUser ||
      (want_write && (view.access & (kAccessRemoteWrite | kAccessRemoteAtomic)) == 0)) {
    if (peer_.other_user) {
      target.status = Status::kRemoteAccessError;
      return target;
    }
    target.user_addr = addr;
    return target;
  }
  Mapping& m = mapping_for(rkey);
  if (m.key != rkey) {
    // First touch of this region: ask the owner's progress thread for its
    // memfd (read-only unless the region grants remote writes).
    if (m.base != nullptr) {
      ::munmap(m.base, m.bytes);
      m = Mapping{};
    }
    Request request{RequestOp::kGetRegion, rkey, 0, 0, 0};
    Reply reply{};
    Fd fd[1];
    size_t nfds = 0;
    if (send_with_fds(peer_.request_socket.get(), &request, sizeof request, {}) != 0 ||
        recv_with_fds(peer_.request_socket.get(), &reply, sizeof reply, fd, &nfds,
                      options_.peer_timeout) != static_cast<ssize_t>(sizeof reply)) {
      target.status = Status::kRetryExceeded;
      return target;
    }
    if (reply.status != static_cast<uint32_t>(Status::kSuccess) || nfds != 1) {
      target.status = static_cast<Status>(reply.status);
      return target;
    }
    const size_t bytes = view.length == 0 ? 1 : view.length;
    void* base = sealed_and_sized(fd[0].get(), bytes)
                     ? map_fd(fd[0].get(), bytes, reply.writable != 0, true)
                     : nullptr;
    if (base == nullptr) {
      target.status = Status::kRemoteOperationError;
      return target;
    }
    m.key = rkey;
    m.writable = reply.writable != 0;
    m.base = static_cast<std::byte*>(base);
    m.bytes = bytes;
    m.region_addr = view.addr;
  }
  // The live entry passed; the mapping must contain the range too.
  if (addr < m.region_addr || length > m.bytes ||
      addr - m.region_addr > m.bytes - length) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  if (want_write && !m.writable) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  target.mapped = m.base + (addr - m.region_addr);
  target.writable = m.writable;
  return target;
}

Status ShmQp::copy_to_peer(const Target& target, const void* src,
                           size_t length) noexcept {
  if (length == 0) return Status::kSuccess;
  if (target.mapped != nullptr) {
    detail::copy_bytes(target.mapped, src, length);
    return Status::kSuccess;
  }
  if (peer_.other_user) return Status::kRemoteAccessError;
  iovec local{const_cast<void*>(src), length};
  iovec remote{reinterpret_cast<void*>(target.user_addr), length};
  const ssize_t n = ::process_vm_writev(peer_.cred.pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(length)) return Status::kSuccess;
  return errno == ESRCH ? Status::kRetryExceeded : Status::kRemoteAccessError;
}

Status ShmQp::copy_from_peer(const Target& target, void* dst, size_t length) noexcept {
  if (length == 0) return Status::kSuccess;
  if (target.mapped != nullptr) {
    detail::copy_bytes(dst, target.mapped, length);
    return Status::kSuccess;
  }
  if (peer_.other_user) return Status::kRemoteAccessError;
  iovec local{dst, length};
  iovec remote{reinterpret_cast<void*>(target.user_addr), length};
  const ssize_t n = ::process_vm_readv(peer_.cred.pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(length)) return Status::kSuccess;
  return errno == ESRCH ? Status::kRetryExceeded : Status::kRemoteAccessError;
}

Status ShmQp::remote_atomic(const SendWr& wr, uint64_t* old_value) noexcept {
  if (!core::atomic_aligned(wr.remote_addr)) return Status::kRemoteInvalidRequestError;
  // A peer of another user maps only regions that grant it writes: on any
  // other the owner performs the atomic (and checks it again).
  EntryView view;
  const bool owner_performs = peer_.other_user &&
                              read_entry(*peer_table_, wr.rkey, &view) &&
                              (view.access & kAccessRemoteWrite) == 0;
  Target target;
  if (!owner_performs) {
    target = resolve(wr.rkey, wr.remote_addr, 8, kAccessRemoteAtomic, true);
    if (target.status != Status::kSuccess) return target.status;
  }
  if (target.mapped != nullptr && target.writable) {
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(target.mapped));
    if (wr.opcode == Opcode::kFetchAdd) {
      *old_value = word.fetch_add(wr.compare_add);
    } else {
      uint64_t expected = wr.compare_add;
      word.compare_exchange_strong(expected, wr.swap);
      *old_value = expected;
    }
    return Status::kSuccess;
  }
  // Registered user memory cannot be mapped here: the owner performs it.
  Request request{
      wr.opcode == Opcode::kFetchAdd ? RequestOp::kFetchAdd : RequestOp::kCompareSwap,
      wr.rkey, wr.remote_addr, wr.compare_add, wr.swap};
  Reply reply{};
  size_t nfds = 0;
  if (send_with_fds(peer_.request_socket.get(), &request, sizeof request, {}) != 0 ||
      recv_with_fds(peer_.request_socket.get(), &reply, sizeof reply, {}, &nfds,
                    options_.peer_timeout) != static_cast<ssize_t>(sizeof reply)) {
    return Status::kRetryExceeded;
  }
  *old_value = reply.value;
  return static_cast<Status>(reply.status);
}

}  // namespace rdmakit::shm
