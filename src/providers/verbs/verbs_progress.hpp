#pragma once
// The verbs progress thread: rdma_cm events of established connections.
#include <rdma/rdma_cma.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "providers/verbs/verbs_objects.hpp"

namespace rdmakit::verbs {

// Connection-lifetime state the progress thread updates.
struct ConnState {
  std::atomic<bool> disconnected{false};
};

// Watches connected rdma_cm ids on one event channel (a thread per context,
// started with the first connection): a DISCONNECTED event (peer closed or
// its process died) moves our QP to the error state so outstanding work
// flushes instead of hanging.
class VerbsProgress {
 public:
  VerbsProgress();
  ~VerbsProgress();
  VerbsProgress(const VerbsProgress&) = delete;
  VerbsProgress& operator=(const VerbsProgress&) = delete;
  // Moves the id onto the progress thread's channel; every event on it must be acked.
  void adopt(rdma_cm_id* id, ibv_qp* qp, std::shared_ptr<ConnState> conn,
             const std::string& peer);
  void release(rdma_cm_id* id) noexcept;

 private:
  struct Entry {
    ibv_qp* qp;
    std::shared_ptr<ConnState> conn;
    std::string peer;
  };
  void run() noexcept;

  EventChannelHandle channel_;
  int wake_fd_ = -1;
  std::mutex mutex_;
  std::unordered_map<rdma_cm_id*, Entry> entries_;
  std::thread thread_;
};

}  // namespace rdmakit::verbs
