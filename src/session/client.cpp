#include <algorithm>
#include <cerrno>
#include <rdmakit/session/client.hpp>
#include <string_view>
#include <thread>

#include "channel_core.hpp"
#include "engine.hpp"
#include "log.hpp"

namespace rdmakit::session {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Client::Client(SessionOptions options, Handlers handlers)
    : engine_(std::make_unique<detail::Engine>(std::move(options), std::move(handlers),
                                               false)) {}

Client::~Client() {
  engine_->stop_all();
  endpoint_.reset();
}

Context& Client::context() noexcept { return engine_->ctx(); }
MemoryRegion& Client::expose(const std::string& name, size_t size, uint32_t access) {
  return engine_->expose(name, size, access);
}
void Client::expose(const std::string& name, MemoryRegion& region) {
  engine_->expose(name, region);
}

namespace {
constexpr const char* kSetupCut = "disconnected during setup: ";

bool setup_cut(const Error& e) {
  return e.sys_errno() == ECONNRESET &&
         std::string_view(e.what()).find(kSetupCut) != std::string_view::npos;
}

// Worth another attempt within connect_timeout: nobody listens yet
// (refused; shm: no socket yet), or the handshake was cut (the server's
// accept window closed under it, or it restarted). A wrong address, a
// rejected handshake or the deadline are final.
bool retriable(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ENOENT:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE: return true;
    default: return false;
  }
}

// Connects one QP, retrying with exponential backoff until the deadline.
std::unique_ptr<QueuePair> connect_retrying(Context& ctx, const std::string& address,
                                            const QpOptions& qp_options,
                                            std::span<const std::byte> hello,
                                            Clock::time_point deadline) {
  milliseconds backoff{5};
  int attempts = 0;
  for (;;) {
    ++attempts;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    try {
      return ctx.connect(address, qp_options, hello, std::max(left, milliseconds(100)));
    } catch (const Error& e) {
      if (!retriable(e.sys_errno()) || Clock::now() >= deadline) {
        throw Error("session connect", ctx.provider_name(), address, e.sys_errno(),
                    std::string(e.what()) + " (after " + std::to_string(attempts) +
                        (attempts == 1 ? " attempt)" : " attempts)"));
      }
      if (e.sys_errno() != ECONNREFUSED && e.sys_errno() != ENOENT) {
        detail::log().info("session: connect to {} ({}): {}; retrying", address,
                           ctx.provider_name(), e.what());
      }
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(
        backoff, std::max<Clock::duration>(deadline - Clock::now(), {})));
    backoff = std::min(backoff * 2, milliseconds(250));
  }
}
}  // namespace

Endpoint& Client::connect(const std::string& address) {
  if (endpoint_) {
    throw Error("session connect", engine_->ctx().provider_name(), address, EISCONN,
                "this client is already connected to " + endpoint_->peer());
  }
  const auto deadline = Clock::now() + engine_->options().connect_timeout;
  // An endpoint whose QPs connected but that went down before the server's
  // buffer table arrived (the server dropped it mid-setup) is retried whole,
  // within the same deadline; connect_retrying retries each QP's handshake.
  milliseconds backoff{5};
  for (int setups = 1;; ++setups) {
    try {
      return connect_once(address, deadline);
    } catch (const Error& e) {
      endpoint_.reset();
      if (!setup_cut(e) || Clock::now() + backoff >= deadline) throw;
      detail::log().info("session: connect to {} ({}): {}; setting up again (attempt {})",
                         address, engine_->ctx().provider_name(), e.what(), setups + 1);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(250));
  }
}

Endpoint& Client::connect_once(const std::string& address,
                               std::chrono::steady_clock::time_point deadline) {
  using namespace detail;
  const SessionOptions& o = engine_->options();
  Worker& w = o.thread_mode == ThreadMode::kApplication ? engine_->app_worker()
                                                        : engine_->next_worker();
  std::shared_ptr<Endpoint> ep = engine_->make_endpoint(random_id(), address, o.channels);
  Hello hello{ep->id(), 0, static_cast<uint32_t>(o.channels.size()), o.recv_depth,
              o.max_message};
  auto qp0 = connect_retrying(engine_->ctx(), address, engine_->qp_options(&w.cq()),
                              encode(hello), deadline);
  std::string why;
  const std::optional<Reply> reply = decode_reply(qp0->peer_private_data(), &why);
  if (!reply) {
    throw Error("session connect", engine_->ctx().provider_name(), address, EPROTO,
                "the peer is not a session server: " + why);
  }
  ep->channels_[0]->attach(std::move(qp0), reply->depth, reply->max_message);
  if (o.channels.size() > 1) {
    if (reply->channel_port == 0) {
      throw Error("session connect", engine_->ctx().provider_name(), address, EPROTO,
                  "the server serves one channel per endpoint; asked for " +
                      std::to_string(o.channels.size()));
    }
    const std::string host = address.substr(0, address.rfind(':'));
    const std::string channel_address = host + ":" + std::to_string(reply->channel_port);
    for (uint32_t c = 1; c < o.channels.size(); ++c) {
      hello.channel = c;
      auto qp = connect_retrying(engine_->ctx(), channel_address,
                                 engine_->qp_options(&w.cq()), encode(hello), deadline);
      ep->channels_[c]->attach(std::move(qp), reply->depth, reply->max_message);
    }
  }
  if (!w.reserve(ep)) {
    throw Error("session connect", engine_->ctx().provider_name(), address, ENOSPC,
                "the worker serves max_endpoints already");
  }
  endpoint_ = ep;
  w.adopt(ep);
  // Ready once the server's buffer table has arrived.
  while (!ep->connected()) {
    if (ep->closed()) {
      const DisconnectInfo info = ep->disconnect_info();
      throw Error("session connect", engine_->ctx().provider_name(), address, ECONNRESET,
                  std::string(kSetupCut) + disconnect_reason_name(info.reason) + ": " +
                      info.detail);
    }
    if (Clock::now() >= deadline) {
      throw Error("session connect", engine_->ctx().provider_name(), address, ETIMEDOUT,
                  "no buffer table from the server within connect_timeout (" +
                      std::to_string(o.connect_timeout.count()) + " ms)");
    }
    if (o.thread_mode == ThreadMode::kApplication) {
      w.run_once(milliseconds(5));
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return *ep;
}

Endpoint& Client::endpoint() const {
  if (!endpoint_) {
    throw Error("session endpoint", engine_->ctx().provider_name(), "", ENOTCONN,
                "connect() first");
  }
  return *endpoint_;
}

int Client::progress(milliseconds timeout) {
  return engine_->app_worker().run_once(timeout);
}
int Client::fd() const { return engine_->app_worker().fd(); }
bool Client::arm() { return engine_->app_worker().arm(); }

}  // namespace rdmakit::session
