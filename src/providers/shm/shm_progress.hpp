#pragma once
// The shm progress thread: one per context, serving what no application
// thread does.
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "providers/shm/shm_link.hpp"
#include "providers/shm/shm_unix_socket.hpp"

namespace rdmakit::shm {

class ShmContext;

// Watches the request socket of every QP's link: hands out region
// descriptors and performs atomics on regions peers cannot map (both
// answered by the context's region table), and notices dead peers (a
// hang-up), waking the QP's CQs. It never blocks on a peer.
class ShmProgress {
 public:
  // Starts the thread; the context must outlive this object.
  explicit ShmProgress(ShmContext& context);
  ~ShmProgress();  // stops and joins the thread
  ShmProgress(const ShmProgress&) = delete;
  ShmProgress& operator=(const ShmProgress&) = delete;

  void add_link(const std::shared_ptr<Link>& link);
  void remove_link(const std::shared_ptr<Link>& link);

 private:
  void run();
  void serve_request(Link& link);
  void mark_gone(Link& link);

  ShmContext& context_;
  std::mutex mutex_;  // links_, next_link_id_
  std::unordered_map<uint64_t, std::shared_ptr<Link>> links_;
  uint64_t next_link_id_ = 1;
  Fd epoll_;
  Fd stop_event_;
  std::thread thread_;  // declared last: started once the rest is set up
};

}  // namespace rdmakit::shm
