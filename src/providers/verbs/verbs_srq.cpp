// Shared receive queue data path: a slot table for the callers' wr_ids and
// one preallocated postlist per ibv_post_srq_recv.
#include "providers/verbs/verbs_srq.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>

#include "core/log.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

SrqCore::SrqCore(uint32_t capacity_in)
    : capacity(capacity_in), slots(std::make_unique<Slot[]>(capacity_in)) {
  for (uint32_t i = 0; i < capacity; ++i) slots[i].owner = this;
}

uint64_t SrqCore::complete(uint64_t device_wr_id) noexcept {
  auto* slot = reinterpret_cast<Slot*>(device_wr_id & ~kTagBits);
  // Pairs with the poster's release: the wr_id written before the post.
  slot->busy.load(std::memory_order_acquire);
  const uint64_t wr_id = slot->wr_id;
  slot->busy.store(false, std::memory_order_release);
  slot->owner->retired.fetch_add(1, std::memory_order_release);
  return wr_id;
}

VerbsSrq::VerbsSrq(std::shared_ptr<Device> device, const SrqOptions& options)
    : SharedReceiveQueue(options), device_(std::move(device)) {
  const auto max_wr = static_cast<uint32_t>(device_->info.attr.max_srq_wr);
  if (device_->info.attr.max_srq == 0) {
    throw Error("create_srq", kProvider, "", ENOTSUP,
                fmt::format("device {} has no shared receive queues (max_srq 0)",
                            device_->name()));
  }
  if (options.max_wr == 0 || options.max_wr > max_wr) {
    throw Error("create_srq", kProvider, "", EINVAL,
                fmt::format("max_wr {} is outside 1..{} (max_srq_wr of {})",
                            options.max_wr, max_wr, device_->name()));
  }
  ibv_srq_init_attr init{};
  init.attr.max_wr = options.max_wr;
  init.attr.max_sge = 1;
  srq_.reset(ibv_create_srq(device_->pd.get(), &init));
  if (!srq_) {
    throw Error("ibv_create_srq", kProvider, "", errno,
                fmt::format("{} work requests on {}", options.max_wr, device_->name()));
  }
  // The device reports what it granted (rxe and mlx5 round up); use all of it.
  options_.max_wr = std::max(options.max_wr, init.attr.max_wr);
  core_ = std::make_shared<SrqCore>(options_.max_wr);
  const auto base = reinterpret_cast<uintptr_t>(core_->slots.get());
  const auto end = reinterpret_cast<uintptr_t>(core_->slots.get() + core_->capacity);
  if (((base | end) & SrqCore::kTagBits) != 0) {
    // Never on x86-64/arm64 Linux user space; checked rather than assumed.
    throw Error("create_srq", kProvider, "", EFAULT,
                "slot table address overlaps the wr_id tag bits");
  }
  wrs_.resize(options_.max_wr);
  sges_.resize(options_.max_wr);
  core::log().debug("verbs: SRQ on {} with {} work requests", device_->name(),
                    options_.max_wr);
}

VerbsSrq::~VerbsSrq() = default;  // ibv_destroy_srq logs EBUSY if QPs remain

PostResult VerbsSrq::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  const detail::ConditionalLock lock(post_mutex_, options().thread_safe);
  return post_locked(wrs);
}

PostResult VerbsSrq::post_locked(std::span<const RecvWr> wrs) noexcept {
  SrqCore& core = *core_;
  if (wrs.empty()) return {};
  const uint64_t outstanding = core.posted - core.retired.load(std::memory_order_acquire);
  const size_t room = core.capacity - outstanding;
  const PostStatus status = wrs.size() > room ? PostStatus::kQueueFull : PostStatus::kOk;
  const size_t n = std::min(wrs.size(), room);
  if (n == 0) return {status, 0};
  for (size_t i = 0; i < n; ++i) {
    // `room` free slots exist (freed before `retired` counted them), so this
    // scan ends within one lap; SRQs complete mostly in order, so usually at once.
    SrqCore::Slot* slot = nullptr;
    for (;;) {
      SrqCore::Slot& candidate = core.slots[core.cursor];
      core.cursor = core.cursor + 1 == core.capacity ? 0 : core.cursor + 1;
      if (!candidate.busy.load(std::memory_order_acquire)) {
        slot = &candidate;
        break;
      }
    }
    const RecvWr& in = wrs[i];
    slot->wr_id = in.wr_id;
    slot->busy.store(true, std::memory_order_release);
    ibv_recv_wr& wr = wrs_[i];
    ibv_sge& sge = sges_[i];
    sge.addr = reinterpret_cast<uint64_t>(in.addr);
    sge.length = in.length;
    sge.lkey = in.lkey;
    wr.wr_id = SrqCore::kTagBits | reinterpret_cast<uintptr_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = in.length == 0 ? 0 : 1;
    wr.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(srq_.get(), wrs_.data(), &bad); rc != 0) {
    const size_t accepted = bad != nullptr ? static_cast<size_t>(bad - wrs_.data()) : 0;
    // The refused ones never reach the device: their slots are free again.
    for (size_t i = accepted; i < n; ++i) {
      reinterpret_cast<SrqCore::Slot*>(wrs_[i].wr_id & ~SrqCore::kTagBits)
          ->busy.store(false, std::memory_order_release);
    }
    core.posted += accepted;
    return {rc == ENOMEM ? PostStatus::kQueueFull : PostStatus::kInvalidArgument,
            static_cast<uint32_t>(accepted)};
  }
  core.posted += n;
  return {status, static_cast<uint32_t>(n)};
}

}  // namespace rdmakit::verbs
