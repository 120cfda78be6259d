#include <rdmakit/session/endpoint.hpp>

#include "channel_core.hpp"
#include "engine.hpp"

namespace rdmakit::session {

Endpoint::Endpoint(detail::Engine* engine, uint64_t id) : engine_(engine), id_(id) {}

Endpoint::~Endpoint() {
  // Channels go first: their QPs before the regions the peer writes into.
  channels_.clear();
  own_buffers_.clear();
}

Channel& Endpoint::channel(size_t index) const { return *channels_.at(index); }

Channel* Endpoint::channel(std::string_view name) const noexcept {
  for (const auto& ch : channels_) {
    if (ch->name() == name) return ch.get();
  }
  return nullptr;
}

const char* Endpoint::provider_name() const noexcept {
  return engine_->ctx().provider_name();
}

std::optional<RemoteRegion> Endpoint::remote_buffer(
    std::string_view name) const noexcept {
  for (const auto& [n, region] : remote_buffers_) {
    if (n == name) return region;
  }
  return std::nullopt;
}

MemoryRegion* Endpoint::local_buffer(std::string_view name) const noexcept {
  for (const auto& [n, region] : own_buffers_) {
    if (n == name) return region.get();
  }
  return nullptr;
}

DisconnectInfo Endpoint::disconnect_info() const {
  std::lock_guard lock(info_mu_);
  return info_;
}

void Endpoint::close() {
  if (closed()) return;
  close_requested_.store(true);
  if (worker_ != nullptr) worker_->request_close();
}

}  // namespace rdmakit::session
