// The server side of the Engine: its listener, the acceptor thread, and the
// accept of one endpoint (channel 0 on the public listener, the others on
// the chosen worker's channel listener).
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "channel_core.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "rdmakit/detail/library_thread.hpp"

namespace rdmakit::session::detail {

using std::chrono::milliseconds;

void Engine::listen(const std::string& address) { listener_ = ctx_->listen(address); }

std::string Engine::listen_host() const {
  if (!listener_) return "127.0.0.1";
  const std::string a = listener_->address();
  const auto colon = a.rfind(':');
  return colon == std::string::npos ? a : a.substr(0, colon);
}

uint16_t Engine::port() const { return listener_ ? listener_->port() : 0; }
std::string Engine::address() const { return listener_ ? listener_->address() : ""; }

size_t Engine::endpoints() const {
  std::lock_guard lock(workers_mu_);
  size_t n = 0;
  for (const auto& w : workers_) n += w->endpoints();
  return n;
}

void Engine::start_accepting() {
  if (!acceptor_.joinable())
    acceptor_ = rdmakit::detail::start_library_thread([this] { accept_loop(); });
}

void Engine::accept_loop() {
  while (!stopping_.load()) {
    try {
      if (options_.thread_mode == ThreadMode::kPollerPerEndpoint) sweep_retired();
      accept_one(milliseconds(100));
    } catch (const Error& e) {
      if (e.sys_errno() != ETIMEDOUT) log().warn("session: accept: {}", e.what());
    } catch (const std::exception& e) {
      log().warn("session: accept: {}", e.what());
    }
  }
}

// Accepts one endpoint: channel 0 on the public listener, the other channels
// on the chosen worker's channel listener (so that every QP of the endpoint
// lands on that worker's CQ).
void Engine::accept_one(milliseconds timeout) {
  Worker* w = staged_;
  if (w == nullptr) {
    if (options_.thread_mode == ThreadMode::kPollerPerEndpoint) {
      std::lock_guard lock(workers_mu_);
      workers_.push_back(std::make_unique<Worker>(*this, true, 1));
      workers_.back()->retire_when_idle();
      w = workers_.back().get();
    } else {
      w = &next_worker();
    }
    staged_ = w;
  }
  Reply reply{options_.recv_depth, options_.max_message, 0};
  if (options_.channels.size() > 1) reply.channel_port = w->channel_listener()->port();
  const std::vector<std::byte> reply_blob = encode(reply);
  std::unique_ptr<QueuePair> qp0 =
      listener_->accept(qp_options(&w->cq()), timeout, reply_blob);
  std::string why;
  const std::optional<Hello> hello = decode_hello(qp0->peer_private_data(), &why);
  if (!hello || hello->channel != 0) {
    log().warn("session: rejected a connection from {} ({}): {}", qp0->peer(),
               ctx_->provider_name(), hello ? "channel > 0 on the main listener" : why);
    return;  // qp0 is destroyed: the peer's QP leaves the connected state
  }
  // Named by the peer's buffer table when it arrives.
  std::vector<std::string> names(hello->channels);
  for (uint32_t c = 0; c < hello->channels; ++c) names[c] = "channel" + std::to_string(c);
  std::vector<std::unique_ptr<QueuePair>> extra;
  std::vector<Hello> extra_hellos;
  for (uint32_t c = 1; c < hello->channels; ++c) {
    if (reply.channel_port == 0) {
      log().warn("session: {} asks for {} channels; this server serves one", qp0->peer(),
                 hello->channels);
      return;
    }
    auto qp = w->channel_listener()->accept(qp_options(&w->cq()), milliseconds(5000),
                                            reply_blob);
    const std::optional<Hello> h = decode_hello(qp->peer_private_data(), &why);
    if (!h || h->endpoint_id != hello->endpoint_id || h->channel != c) {
      log().warn("session: channel {} of {} : unexpected connection ({})", c, qp0->peer(),
                 h ? "wrong endpoint or channel" : why);
      return;
    }
    extra.push_back(std::move(qp));
    extra_hellos.push_back(*h);
  }
  if (options_.thread_mode == ThreadMode::kPollerPerEndpoint) w->start();
  staged_ = nullptr;
  std::shared_ptr<Endpoint> ep = make_endpoint(hello->endpoint_id, qp0->peer(), names);
  ep->channels_[0]->attach(std::move(qp0), hello->depth, hello->max_message);
  for (size_t i = 0; i < extra.size(); ++i) {
    ep->channels_[i + 1]->attach(std::move(extra[i]), extra_hellos[i].depth,
                                 extra_hellos[i].max_message);
  }
  if (!w->reserve(ep)) {
    log().warn("session: rejected {}: the worker serves max_endpoints={} already",
               ep->peer(), options_.max_endpoints);
    return;
  }
  w->adopt(std::move(ep));
}

}  // namespace rdmakit::session::detail
