#pragma once
// An endpoint: one connected peer, with the channels created at connect time
// and the peer's table of named buffers (exchanged by the session).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <rdmakit/export.hpp>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/options.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rdmakit::session {

class Client;
class Endpoint;

// Application callbacks. They run on the progress thread of the endpoint
// (its poller, its worker, or the caller of progress()).
struct Handlers {
  // The endpoint is connected and the peer's buffer table has arrived.
  std::function<void(Endpoint&)> on_connect;
  // A message or notification arrived. Empty: messages queue for
  // Channel::recv() instead (pull delivery).
  std::function<void(Channel&, Message&)> on_message;
  // The endpoint went away; every pending operation has completed (with an
  // error) before this runs.
  std::function<void(Endpoint&, const DisconnectInfo&)> on_disconnect;
};

namespace detail {
class Engine;
class Worker;
}  // namespace detail

class RDMAKIT_API Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  size_t channel_count() const noexcept { return channels_.size(); }
  Channel& channel(size_t index = 0) const;
  // nullptr if there is no channel of that name.
  Channel* channel(std::string_view name) const noexcept;

  // The peer's host:port and provider, for messages.
  const std::string& peer() const noexcept { return peer_; }
  const char* provider_name() const noexcept;
  uint64_t id() const noexcept { return id_; }

  // The peer's exposed buffers.
  const std::vector<std::pair<std::string, RemoteRegion>>& remote_buffers()
      const noexcept {
    return remote_buffers_;
  }
  std::optional<RemoteRegion> remote_buffer(std::string_view name) const noexcept;
  // This side's buffer made for this endpoint alone (Server::expose_per_endpoint),
  // e.g. where this peer WRITEs; nullptr if there is none of that name. Lives
  // as long as the endpoint (or until the session is destroyed).
  MemoryRegion* local_buffer(std::string_view name) const noexcept;

  bool connected() const noexcept { return state_.load() == State::kReady; }
  bool closed() const noexcept { return state_.load() == State::kClosed; }
  // Valid once closed().
  DisconnectInfo disconnect_info() const;

  // Clean disconnect: tells the peer (best effort), fails pending operations
  // and runs on_disconnect with kLocalClose on the progress thread. Returns
  // at once; the endpoint is closed when closed() turns true.
  void close();

  // Free for the application (e.g. per-connection state).
  void* user_data = nullptr;

 private:
  friend class detail::ChannelCore;
  friend class detail::Worker;
  friend class detail::Engine;
  friend class Client;
  enum class State : uint8_t { kConnecting, kReady, kClosed };
  Endpoint(detail::Engine* engine, uint64_t id);

  detail::Engine* engine_;
  detail::Worker* worker_ = nullptr;
  uint64_t id_;
  std::string peer_;
  std::vector<std::unique_ptr<detail::ChannelCore>> channels_;
  std::vector<std::pair<std::string, RemoteRegion>> remote_buffers_;
  std::unique_ptr<MemoryRegion> ctrl_mr_;  // the peer writes heartbeat + credits here
  std::vector<std::pair<std::string, std::unique_ptr<MemoryRegion>>> own_buffers_;
  RemoteRegion peer_ctrl_;  // ours in the peer
  std::atomic<State> state_{State::kConnecting};
  std::atomic<bool> close_requested_{false};
  mutable std::mutex info_mu_;
  DisconnectInfo info_;
  // Worker-private.
  uint32_t slot_ = 0;
  uint16_t generation_ = 0;
  uint64_t heartbeat_sent_ = 0;
  uint64_t heartbeat_seen_ = 0;
  std::chrono::steady_clock::time_point heartbeat_changed_{};
  bool table_sent_ = false;
};

}  // namespace rdmakit::session
