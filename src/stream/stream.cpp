// Public API: Engine, StreamListener, Stream (socket-style data path).
#include "rdmakit/stream/stream.hpp"

#include <algorithm>
#include <cerrno>
#include <new>

#include "stream/acceptor.hpp"
#include "stream/engine.hpp"
#include "stream/iov.hpp"

namespace rdmakit::stream {

using detail::Clock;
using detail::EngineImpl;
using detail::IovCursor;
using detail::StreamCore;

namespace {

std::vector<std::byte> hello_bytes(const StreamCore& core) {
  const wire::Hello h = core.hello();
  std::vector<std::byte> out(wire::Hello::kSize);
  h.serialize(std::span<std::byte, wire::Hello::kSize>(out.data(), wire::Hello::kSize));
  return out;
}

wire::Hello peer_hello(EngineImpl& e, const QueuePair& qp, const char* op) {
  auto h = wire::Hello::parse(qp.peer_private_data());
  if (!h || h->ring.provider != e.ctx->provider())
    throw Error(
        op, e.ctx->provider_name(), qp.peer(), EPROTO,
        "peer's private data is not a stream hello (version 2, ring 4 KiB .. 2 MiB, "
        "8 .. 255 credits)");
  return *h;
}

Clock::time_point deadline_after(std::chrono::milliseconds t) {
  return t.count() > 0 ? Clock::now() + t : Clock::time_point::max();
}

// Stream::readv and Stream::writev under the engine lock: `total` bytes (0
// included) in the `iovcnt` entries of `iov`.
using LockedIo = ssize_t (*)(EngineImpl& e, StreamCore& s,
                             std::unique_lock<std::mutex>& lock, const iovec* iov,
                             int iovcnt, size_t total, int flags) noexcept;

ssize_t read_locked(EngineImpl& e, StreamCore& s, std::unique_lock<std::mutex>& lock,
                    const iovec* iov, int iovcnt, size_t total, int flags) noexcept {
  if (total == 0) return 0;
  const bool dontwait = s.nonblocking || (flags & MSG_DONTWAIT) != 0;
  const bool peek = (flags & MSG_PEEK) != 0;
  const bool waitall = (flags & MSG_WAITALL) != 0 && !peek;
  const auto deadline = deadline_after(s.read_timeout);
  size_t got = 0;
  for (;;) {
    if (s.read_shut()) return static_cast<ssize_t>(got);
    const uint64_t avail = s.available();
    if (avail > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(avail, total - got));
      IovCursor cur(iov, iovcnt, got);
      s.copy_unread(cur, n);
      got += n;
      if (!peek) {
        s.consume(n);
        e.pump(s);
        s.update();
      }
      if (!waitall || got == total) return static_cast<ssize_t>(got);
      continue;
    }
    if (s.fin_received()) return static_cast<ssize_t>(got);
    if (s.error() != 0) return got > 0 ? static_cast<ssize_t>(got) : -s.error();
    if (dontwait) {
      e.before_would_block();
      return got > 0 ? static_cast<ssize_t>(got) : -EAGAIN;
    }
    if (!e.wait(lock, s, deadline, [&s] { return s.readable(); }))
      return got > 0 ? static_cast<ssize_t>(got) : -EAGAIN;
  }
}

ssize_t write_locked(EngineImpl& e, StreamCore& s, std::unique_lock<std::mutex>& lock,
                     const iovec* iov, int iovcnt, size_t total, int flags) noexcept {
  if (s.error() != 0) return -s.error();
  if (s.write_shut()) return -EPIPE;
  if (total == 0) return 0;
  const bool dontwait = s.nonblocking || (flags & MSG_DONTWAIT) != 0;
  const auto deadline = deadline_after(s.write_timeout);
  const uint32_t max_inline = s.max_inline();
  const uint32_t record_max = s.record_max();
  size_t done = 0;
  bool room_wait = true;
  while (done < total) {
    if (s.error() != 0) break;
    // Nothing queued: small pieces go out straight from the caller's memory.
    IovCursor cur(iov, iovcnt, done);
    while (!s.send_queued() && done < total && total - done <= max_inline &&
           s.can_post_data()) {
      const StreamCore::DataTarget at = s.data_target();
      // The last few bytes of a write ride in the message itself (a DATA
      // record: the peer places them in its ring, wrapping as needed).
      const bool record = total - done <= record_max;
      auto [src, len] =
          cur.piece(record ? std::min<uint64_t>(at.room, record_max)
                           : std::min<uint64_t>({at.room, at.to_end, max_inline}));
      if (len == 0) break;
      const auto kind = record ? StreamCore::DataKind::kInlineRecord
                               : StreamCore::DataKind::kInlineWrite;
      // Not posted: the buffered path below reports errors.
      if (!s.post_data(at, kind, src, static_cast<uint32_t>(len)).ok()) break;
      cur.advance(len);
      done += len;
    }
    if (done == total) break;
    // A busy-polling writer with nothing queued whose rest would go out
    // inline, short of ring room or credits: wait (briefly) for the peer's
    // credits rather than copy into the send buffer, which makes a third copy
    // of every byte of a stream whose writer is ahead of its reader. If
    // nothing arrives in time, the data is buffered as before.
    // (If there was room and the post itself failed, the buffered path
    // below reports it.)
    const auto can_send = [&s] { return s.error() != 0 || s.can_post_data_now(); };
    if (room_wait && !dontwait && s.opt.busy_poll.count() > 0 && !s.send_queued() &&
        total - done <= max_inline && !can_send()) {
      const auto until = std::min(deadline, Clock::now() + detail::kRoomWait);
      if (e.wait(lock, s, until, can_send)) {
        if (s.error() != 0) break;
        continue;
      }
      room_wait = false;
    }
    s.restart_empty_send_buffer();
    const uint64_t free = s.tx_free();
    if (free > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(free, total - done));
      IovCursor at(iov, iovcnt, done);
      s.stage(at, n);
      done += n;
      e.pump(s);
      continue;
    }
    if (dontwait) {
      e.before_would_block();
      break;
    }
    if (!e.wait(lock, s, deadline, [&s] { return s.error() != 0 || s.tx_free() > 0; }))
      break;
  }
  s.update();
  if (done > 0) return static_cast<ssize_t>(done);
  if (s.error() != 0) return -s.error();
  return -EAGAIN;
}

// readv() and writev(): an open handle and a valid iovec array, then Body
// under the engine lock.
template <LockedIo Body>
ssize_t locked_io(EngineImpl* engine, StreamCore* core, const iovec* iov, int iovcnt,
                  int flags) noexcept {
  if (core == nullptr) return -EBADF;
  const ssize_t total = detail::iov_total(iov, iovcnt);
  if (total < 0) return total;
  std::unique_lock lock(engine->mu);
  return Body(*engine, *core, lock, iov, iovcnt, static_cast<size_t>(total), flags);
}

// close() and abort(): `end` ends the stream under the engine lock, then the
// handle lets go of it.
template <typename End>
int let_go(EngineImpl* engine, std::shared_ptr<StreamCore>& core, End end) noexcept {
  if (!core) return -EBADF;
  {
    std::lock_guard lock(engine->mu);
    end(*engine, *core);
  }
  core.reset();
  return 0;
}

}  // namespace

// ------------------------------------------------------------------ Engine

Engine::Engine(std::shared_ptr<detail::EngineImpl> impl) noexcept
    : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::shared_ptr<Engine> Engine::create(const EngineOptions& options) {
  return std::shared_ptr<Engine>(new Engine(std::make_shared<EngineImpl>(options)));
}

Context& Engine::context() noexcept { return *impl_->ctx; }
ProviderKind Engine::provider() const noexcept { return impl_->ctx->provider(); }
size_t Engine::stream_count() const noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->stream_count();
}

std::unique_ptr<Stream> Engine::connect(const std::string& address) {
  return connect(address, impl_->options.stream);
}

std::unique_ptr<Stream> Engine::connect(const std::string& address,
                                        const StreamOptions& options) {
  auto core = impl_->make_core(options);
  const auto hello = hello_bytes(*core);
  auto qp = impl_->ctx->connect(address, impl_->qp_options(options), hello,
                                options.connect_timeout);
  const wire::Hello peer = peer_hello(*impl_, *qp, "stream connect");
  impl_->start(core, std::move(qp), peer);
  return std::unique_ptr<Stream>(new Stream(impl_, core));
}

std::unique_ptr<StreamListener> Engine::listen(const std::string& address) {
  return listen(address, impl_->options.stream);
}

std::unique_ptr<StreamListener> Engine::listen(const std::string& address,
                                               const StreamOptions& options) {
  EngineImpl::validate(options);
  return std::unique_ptr<StreamListener>(
      new StreamListener(impl_, impl_->ctx->listen(address), options));
}

// ---------------------------------------------------------------- Listener

StreamListener::StreamListener(std::shared_ptr<detail::EngineImpl> engine,
                               std::unique_ptr<Listener> listener,
                               const StreamOptions& options) noexcept
    : engine_(std::move(engine)), listener_(std::move(listener)), options_(options) {}
StreamListener::~StreamListener() = default;

namespace {
std::shared_ptr<StreamCore> accept_core(EngineImpl& e, Listener& l,
                                        std::chrono::milliseconds timeout,
                                        const StreamOptions& options) {
  auto core = e.make_core(options);
  const auto hello = hello_bytes(*core);
  auto qp = l.accept(e.qp_options(options), timeout, hello);
  const wire::Hello peer = peer_hello(e, *qp, "stream accept");
  e.start(core, std::move(qp), peer);
  return core;
}
}  // namespace

std::unique_ptr<Stream> StreamListener::accept(std::chrono::milliseconds timeout) {
  return accept(timeout, options_);
}

std::unique_ptr<Stream> StreamListener::accept(std::chrono::milliseconds timeout,
                                               const StreamOptions& options) {
  std::unique_lock lock(mu_);
  if (nonblocking_ && !acceptor_) {
    if (const int rc = start_background(); rc < 0)
      throw Error("stream accept", engine_->ctx->provider_name(), address(), -rc,
                  "listener readiness fd");
  }
  if (!acceptor_) {
    lock.unlock();
    return std::unique_ptr<Stream>(
        new Stream(engine_, accept_core(*engine_, *listener_, timeout, options)));
  }
  const bool nb = nonblocking_;
  detail::Acceptor& acceptor = *acceptor_;
  lock.unlock();
  auto core = acceptor.take(nb ? std::chrono::milliseconds(0) : timeout);
  if (!core)
    throw Error(
        "stream accept", engine_->ctx->provider_name(), address(),
        nb ? EAGAIN : ETIMEDOUT,
        nb ? "no connection ready (non-blocking listener)" : "no connection request");
  return std::unique_ptr<Stream>(new Stream(engine_, std::move(core)));
}

int StreamListener::start_background() noexcept {
  try {
    EngineImpl* e = engine_.get();
    Listener* l = listener_.get();
    const StreamOptions o = options_;
    // The buffers of a stream-to-be are kept across attempts that time out,
    // so an idle listener does not allocate and register them four times a
    // second.
    acceptor_ = std::make_unique<detail::Acceptor>(
        [e, l, o, spare = std::shared_ptr<StreamCore>()](
            std::chrono::milliseconds t) mutable -> std::shared_ptr<StreamCore> {
          if (!spare) spare = e->make_core(o);
          const auto hello = hello_bytes(*spare);
          auto qp = l->accept(e->qp_options(o), t, hello);
          auto core = std::move(spare);  // a peer saw this ring: never reused
          const wire::Hello peer = peer_hello(*e, *qp, "stream accept");
          e->start(core, std::move(qp), peer);
          return core;
        });
    return 0;
  } catch (const Error& err) {
    return -(err.sys_errno() != 0 ? err.sys_errno() : ENOMEM);
  } catch (const std::exception&) {
    return -ENOMEM;
  }
}

int StreamListener::fd() noexcept {
  std::lock_guard lock(mu_);
  if (!acceptor_) {
    if (const int rc = start_background(); rc < 0) return rc;
  }
  return acceptor_->fd();
}

std::unique_ptr<Stream> StreamListener::try_accept(int* error) noexcept {
  int dummy = 0;
  int& err = error != nullptr ? *error : dummy;
  std::unique_lock lock(mu_);
  if (!acceptor_) {
    if (const int rc = start_background(); rc < 0) {
      err = -rc;
      return nullptr;
    }
  }
  detail::Acceptor& acceptor = *acceptor_;
  lock.unlock();
  auto core = acceptor.take(std::chrono::milliseconds(0));
  if (!core) {
    err = EAGAIN;
    return nullptr;
  }
  std::unique_ptr<Stream> stream(new (std::nothrow) Stream(engine_, core));
  if (!stream) {
    std::lock_guard engine_lock(engine_->mu);
    engine_->close(*core);
    err = ENOMEM;
    return nullptr;
  }
  err = 0;
  return stream;
}

void StreamListener::set_nonblocking(bool on) noexcept {
  std::lock_guard lock(mu_);
  nonblocking_ = on;
  // The background acceptor starts at the next accept (which reports an
  // error creating it).
}

bool StreamListener::nonblocking() const noexcept {
  std::lock_guard lock(mu_);
  return nonblocking_;
}

std::string StreamListener::address() const { return listener_->address(); }
uint16_t StreamListener::port() const { return listener_->port(); }

// ------------------------------------------------------------------ Stream

Stream::Stream(std::shared_ptr<detail::EngineImpl> engine,
               std::shared_ptr<detail::StreamCore> core) noexcept
    : engine_(std::move(engine)), core_(std::move(core)) {}

Stream::~Stream() { close(); }

ssize_t Stream::read(void* buf, size_t len, int flags) noexcept {
  const iovec v{buf, len};
  return readv(&v, 1, flags);
}

ssize_t Stream::write(const void* buf, size_t len, int flags) noexcept {
  const iovec v{const_cast<void*>(buf), len};
  return writev(&v, 1, flags);
}

ssize_t Stream::readv(const iovec* iov, int iovcnt, int flags) noexcept {
  return locked_io<read_locked>(engine_.get(), core_.get(), iov, iovcnt, flags);
}

ssize_t Stream::writev(const iovec* iov, int iovcnt, int flags) noexcept {
  return locked_io<write_locked>(engine_.get(), core_.get(), iov, iovcnt, flags);
}

size_t Stream::available() const noexcept {
  if (!core_) return 0;
  std::lock_guard lock(engine_->mu);
  return core_->read_shut() ? 0 : static_cast<size_t>(core_->available());
}

int Stream::shutdown(int how) noexcept {
  if (!core_) return -EBADF;
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  std::lock_guard lock(engine_->mu);
  StreamCore& s = *core_;
  if (how != SHUT_WR) s.shut_read();  // unread bytes discarded, credited back
  if (how != SHUT_RD) s.shut_write();
  engine_->pump(s);
  s.update();
  return 0;
}

int Stream::close() noexcept {
  return let_go(engine_.get(), core_,
                [](EngineImpl& e, StreamCore& s) noexcept { e.close(s); });
}

int Stream::abort() noexcept {
  return let_go(engine_.get(), core_,
                [](EngineImpl& e, StreamCore& s) noexcept { e.abort(s); });
}

void Stream::set_nonblocking(bool on) noexcept {
  if (!core_) return;
  std::lock_guard lock(engine_->mu);
  core_->nonblocking = on;
}

bool Stream::nonblocking() const noexcept {
  if (!core_) return false;
  std::lock_guard lock(engine_->mu);
  return core_->nonblocking;
}

void Stream::set_timeouts(std::chrono::milliseconds read,
                          std::chrono::milliseconds write) noexcept {
  if (!core_) return;
  std::lock_guard lock(engine_->mu);
  core_->read_timeout = read;
  core_->write_timeout = write;
}

int Stream::fd() noexcept {
  if (!core_) return -EBADF;
  std::lock_guard lock(engine_->mu);
  return core_->readiness_fd();
}

short Stream::poll_events() const noexcept {
  if (!core_) return POLLNVAL;
  std::lock_guard lock(engine_->mu);
  return core_->events();
}

short Stream::poll_readiness(bool about_to_sleep, bool reads_next) noexcept {
  if (!core_) return POLLNVAL;
  std::unique_lock lock(engine_->mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Someone is inside the engine: it publishes what it changes before it
    // leaves. A caller about to sleep must still get the progress thread
    // watching, so it waits for the lock.
    if (!about_to_sleep) return core_->last_events();
    lock.lock();
  }
  return engine_->poll_readiness(*core_, about_to_sleep, reads_next);
}

short Stream::last_events() const noexcept {
  if (!core_) return POLLNVAL;
  return core_->last_events();
}

void Stream::set_lazy_readiness(bool on) noexcept {
  if (!core_) return;
  std::lock_guard lock(engine_->mu);
  core_->set_lazy_readiness(on);
}

int Stream::error() const noexcept {
  if (!core_) return EBADF;
  std::lock_guard lock(engine_->mu);
  return core_->error();
}

void Stream::hide_error() noexcept {
  if (!core_) return;
  std::lock_guard lock(engine_->mu);
  core_->hide_error();
}

Status Stream::error_status() const noexcept {
  if (!core_) return Status::kSuccess;
  std::lock_guard lock(engine_->mu);
  return core_->error_status();
}

const std::string& Stream::peer() const noexcept {
  static const std::string none;
  return core_ ? core_->peer() : none;
}

size_t Stream::memory_bytes() const noexcept {
  if (!core_) return 0;
  std::lock_guard lock(engine_->mu);
  return core_->memory_bytes();
}

}  // namespace rdmakit::stream
