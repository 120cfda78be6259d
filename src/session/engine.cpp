// The Engine: the session's context, options, exposed buffers and their
// table, the workers (by thread mode) and the endpoints it makes. The server
// side's acceptor is in engine_accept.cpp.
#include "engine.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "channel_core.hpp"
#include "log.hpp"

namespace rdmakit::session::detail {

using std::chrono::milliseconds;

// From the kernel each time: a generator state copied by fork() would give
// parent and children the same ids.
uint64_t random_id() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof id, 0) != sizeof id) {
      id = static_cast<uint64_t>(
               std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<uint64_t>(getpid()) << 40);
    }
  }
  return id;
}

namespace {
void check_options(const SessionOptions& o) {
  auto bad = [](const std::string& what) {
    throw Error("session options", "", "", EINVAL, what);
  };
  if (o.channels.empty() || o.channels.size() > kMaxChannels) {
    bad("channels: 1 to " + std::to_string(kMaxChannels) + " names");
  }
  for (const auto& name : o.channels) {
    if (name.empty() || name.size() > kMaxChannelName) bad("channel name '" + name + "'");
  }
  if (o.recv_depth < 2 || o.recv_depth > kMaxDepth) {
    bad("recv_depth " + std::to_string(o.recv_depth) + " (2 to 4096)");
  }
  if (o.max_message == 0 || o.max_message > (64u << 20))
    bad("max_message (1 B to 64 MiB)");
  if (o.thread_mode == ThreadMode::kSharedWorkers && (o.workers == 0 || o.workers > 64)) {
    bad("workers (1 to 64)");
  }
  if (o.max_endpoints == 0 || o.max_endpoints > 65535) bad("max_endpoints (1 to 65535)");
  if (o.heartbeat.count() <= 0 || o.liveness <= o.heartbeat) {
    bad("heartbeat > 0 and liveness > heartbeat");
  }
}
}  // namespace

Engine::Engine(SessionOptions options, Handlers handlers, bool server)
    : options_(std::move(options)), handlers_(std::move(handlers)), server_(server) {
  check_options(options_);
  // Receive slots hold at least kMinMessage so that the buffer table (the
  // first message) always fits; expose() keeps the table within it.
  options_.max_message = std::max(options_.max_message, kMinMessage);
  ContextOptions co;
  co.provider = options_.provider;
  ctx_ = Context::open(co);
  log().info("session: {} on {} ({}), thread mode {}, event mode {}",
             server_ ? "server" : "client", ctx_->provider_name(), ctx_->device_name(),
             thread_mode_name(options_.thread_mode),
             event_mode_name(options_.event_mode));
  std::lock_guard lock(workers_mu_);
  if (options_.thread_mode == ThreadMode::kApplication) {
    workers_.push_back(std::make_unique<Worker>(*this, false, options_.max_endpoints));
  } else if (options_.thread_mode == ThreadMode::kSharedWorkers) {
    for (uint32_t i = 0; i < options_.workers; ++i) {
      workers_.push_back(std::make_unique<Worker>(*this, true, options_.max_endpoints));
      workers_.back()->start();
    }
  }
}

Engine::~Engine() { stop_all(); }

void Engine::stop_all() {
  stopping_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard lock(workers_mu_);
  for (auto& w : workers_) w->stop();
  for (auto& w : workers_) w->shutdown();
  {
    std::lock_guard made_lock(made_mu_);
    for (auto& weak : made_) {
      if (auto ep = weak.lock()) {
        for (auto& ch : ep->channels_) {
          ch->mark_closed();
          ch->release_memory();
        }
        ep->ctrl_mr_.reset();
        ep->own_buffers_.clear();
        ep->state_.store(Endpoint::State::kClosed);
      }
    }
    made_.clear();
  }
  workers_.clear();
  listener_.reset();
  exposed_.clear();
  owned_.clear();
}

MemoryRegion& Engine::expose(const std::string& name, size_t size, uint32_t access) {
  owned_.push_back(ctx_->allocate(size, access));
  expose(name, *owned_.back());
  return *owned_.back();
}

void Engine::expose(const std::string& name, MemoryRegion& region) {
  check_exposable(name);
  exposed_.emplace_back(name, &region);
}

void Engine::expose_per_endpoint(const std::string& name, size_t size, uint32_t access) {
  if (size == 0) {
    throw Error("session expose", ctx_->provider_name(), "", EINVAL,
                "per-endpoint buffer '" + name + "': size 0");
  }
  check_exposable(name);
  per_endpoint_.push_back({name, size, access});
}

// Names are unique and the table (every buffer, shared or per endpoint) fits
// the first message.
void Engine::check_exposable(const std::string& name) const {
  if (name.empty() || name.size() > kMaxBufferName) {
    throw Error("session expose", ctx_->provider_name(), "", EINVAL,
                "buffer name '" + name + "': 1 to 64 characters");
  }
  Table t;
  t.channel_names = options_.channels;
  for (const auto& [n, r] : exposed_) t.buffers.emplace_back(n, r->remote());
  for (const auto& b : per_endpoint_) t.buffers.emplace_back(b.name, RemoteRegion{});
  for (const auto& [n, r] : t.buffers) {
    if (n == name) {
      throw Error("session expose", ctx_->provider_name(), "", EEXIST,
                  "a buffer named '" + name + "' is already exposed");
    }
  }
  t.buffers.emplace_back(name, RemoteRegion{});
  if (encode(t).size() > kMinMessage) {
    throw Error("session expose", ctx_->provider_name(), "", E2BIG,
                "exposing '" + name + "' would make the buffer table exceed " +
                    std::to_string(kMinMessage) + " bytes (" +
                    std::to_string(t.buffers.size() - 1) + " buffers exposed already)");
  }
}

Table Engine::table_for(const Endpoint& ep) const {
  Table t;
  t.ctrl = ep.ctrl_mr_->remote();
  for (const auto& ch : ep.channels_) t.channel_names.push_back(ch->name());
  for (const auto& [name, region] : exposed_)
    t.buffers.emplace_back(name, region->remote());
  for (const auto& [name, region] : ep.own_buffers_)
    t.buffers.emplace_back(name, region->remote());
  return t;
}

QpOptions Engine::qp_options(CompletionQueue* cq) const {
  QpOptions q;
  q.send_cq = cq;
  q.recv_cq = cq;
  // Credit-limited SENDs, application READ/WRITEs and credit/heartbeat WRITEs.
  q.max_send_wr = std::min<uint32_t>(4 * options_.recv_depth + 64, 16384);
  q.max_recv_wr = options_.recv_depth;
  q.max_inline = 64;
  // Only the first message can meet a RECV not yet posted (the peer posts
  // right after connecting); credits rule out RNR after that.
  q.rnr_timeout = milliseconds(3000);
  q.peer_timeout = options_.peer_timeout;
  q.thread_safe = options_.thread_mode != ThreadMode::kApplication;
  return q;
}

Worker& Engine::next_worker() {
  if (options_.thread_mode == ThreadMode::kPollerPerEndpoint) {
    sweep_retired();
    std::lock_guard lock(workers_mu_);
    // Its thread ends when the endpoint is closed; sweep_retired drops it.
    workers_.push_back(std::make_unique<Worker>(*this, true, 1));
    workers_.back()->retire_when_idle();
    workers_.back()->start();
    return *workers_.back();
  }
  std::lock_guard lock(workers_mu_);
  if (options_.thread_mode == ThreadMode::kApplication) return *workers_.front();
  // Shared workers: the one with the fewest endpoints.
  Worker* best = workers_.front().get();
  for (auto& w : workers_) {
    if (w->endpoints() < best->endpoints()) best = w.get();
  }
  (void)next_worker_;
  return *best;
}

void Engine::sweep_retired() {
  std::vector<std::unique_ptr<Worker>> retired;
  {
    std::lock_guard lock(workers_mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if ((*it)->retired() && (*it)->endpoints_gone()) {
        retired.push_back(std::move(*it));
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Joined outside the lock: a handler on another worker may take it.
  for (auto& w : retired) {
    w->stop();
    w->shutdown();
  }
}

Worker& Engine::app_worker() {
  if (options_.thread_mode != ThreadMode::kApplication) {
    throw Error(
        "session progress", ctx_->provider_name(), "", EINVAL,
        std::string("progress()/fd()/arm() belong to ThreadMode::kApplication; this "
                    "session runs ") +
            thread_mode_name(options_.thread_mode));
  }
  return *workers_.front();
}

std::shared_ptr<Endpoint> Engine::make_endpoint(uint64_t id, const std::string& peer,
                                                const std::vector<std::string>& names) {
  std::shared_ptr<Endpoint> ep(new Endpoint(this, id));
  {
    std::lock_guard lock(made_mu_);
    std::erase_if(made_, [](const std::weak_ptr<Endpoint>& w) { return w.expired(); });
    made_.push_back(ep);
  }
  ep->peer_ = peer;
  ep->ctrl_mr_ = ctx_->allocate(kCtrlSize, kAccessAll);
  for (const auto& b : per_endpoint_) {
    ep->own_buffers_.emplace_back(b.name, ctx_->allocate(b.size, b.access));
  }
  for (uint32_t i = 0; i < names.size(); ++i) {
    ep->channels_.push_back(std::make_unique<ChannelCore>(ep.get(), i, names[i]));
  }
  return ep;
}

}  // namespace rdmakit::session::detail
