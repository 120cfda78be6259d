// The progress thread: one thread per context reading rdma_cm events of
// established connections.
#include "providers/verbs/verbs_progress.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "providers/verbs/verbs_device.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

VerbsProgress::VerbsProgress() {
  channel_.reset(rdma_create_event_channel());
  if (!channel_) {
    throw Error("rdma_create_event_channel", kProvider, "", errno, "progress thread");
  }
  // Non-blocking: an event poll() announced can vanish before we read it
  // (rdma_destroy_id discards its id's queued events), and a blocking read
  // would then hang this thread and the join in ~VerbsProgress.
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error("fcntl(O_NONBLOCK)", kProvider, "", errno, "progress thread channel");
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw Error("eventfd", kProvider, "", errno, "progress thread");
  thread_ = rdmakit::detail::start_library_thread([this] { run(); });
}

VerbsProgress::~VerbsProgress() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) {
    log_release_failure("eventfd write", errno);
  }
  if (thread_.joinable()) thread_.join();
  close(wake_fd_);
}

void VerbsProgress::adopt(rdma_cm_id* id, ibv_qp* qp, std::shared_ptr<ConnState> conn,
                          const std::string& peer) {
  {
    std::lock_guard lock(mutex_);
    entries_[id] = Entry{qp, std::move(conn), peer};
  }
  if (rdma_migrate_id(id, channel_.get()) != 0) {
    const int err = errno;
    release(id);
    throw Error("rdma_migrate_id", kProvider, peer, err,
                "moving the connection to the progress thread");
  }
}

void VerbsProgress::release(rdma_cm_id* id) noexcept {
  std::lock_guard lock(mutex_);
  entries_.erase(id);
}

void VerbsProgress::run() noexcept {
  pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log_release_failure("poll (progress thread)", errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel_.get(), &event) != 0) continue;  // EAGAIN: gone
    {
      std::lock_guard lock(mutex_);
      auto it = entries_.find(event->id);
      if (it != entries_.end()) {
        Entry& entry = it->second;
        switch (event->event) {
          case RDMA_CM_EVENT_DISCONNECTED:
          case RDMA_CM_EVENT_DEVICE_REMOVAL:
          // A peer that gave up on the handshake after we sent our RTU (its
          // REJ reached us once connect() had returned): gone as well.
          case RDMA_CM_EVENT_REJECTED:
          case RDMA_CM_EVENT_CONNECT_ERROR:
          case RDMA_CM_EVENT_UNREACHABLE: {
            // Flush outstanding work (WR_FLUSH_ERROR) so nobody waits forever
            // on a peer that is gone; rdma_disconnect answers the DREQ.
            // seq_cst, paired with post_recv's load: a RECV posted after
            // the move to the error state is flushed by the poster.
            entry.conn->disconnected.store(true, std::memory_order_seq_cst);
            ibv_qp_attr attr{};
            attr.qp_state = IBV_QPS_ERR;
            ibv_modify_qp(entry.qp, &attr, IBV_QP_STATE);
            rdma_disconnect(event->id);
            try {
              core::log().info(
                  "verbs: peer {} disconnected ({}, status {}); qp {} moved to the error "
                  "state",
                  entry.peer, rdma_event_str(event->event), event->status,
                  entry.qp->qp_num);
            } catch (...) {
            }
            break;
          }
          default: break;
        }
      }
    }
    rdma_ack_cm_event(event);
  }
}

}  // namespace rdmakit::verbs
