#pragma once
// Byte streams with socket semantics over any rdmakit provider.
//
//   auto engine = stream::Engine::create({.provider = ProviderKind::kShm});
//   auto listener = engine->listen("127.0.0.1:0");          // server
//   auto s = listener->accept(5s);
//   auto c = engine->connect("127.0.0.1:" + port);           // client
//   c->write(buf, n);  s->read(buf, n);
//
// Control path (Engine::create, connect, listen, accept) throws
// rdmakit::Error. The data path (read/write/readv/writev/shutdown/close/
// poll_events) never throws and returns socket-style values: a byte count
// >= 0, or a negative errno (-EAGAIN, -ECONNRESET, -EPIPE, -ETIMEDOUT,
// -EPROTO, ...); error_status() names the rdmakit Status behind an error.
//
// An Engine owns one Context, one completion queue shared by all its streams
// and one progress thread (credits, keepalive, close-with-queued-data,
// readiness while no application thread polls). Streams of one engine may be
// used from any threads; calls are serialized by the engine. See
// docs/streams.md for the ring format, flow control and readiness rules.
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "rdmakit/export.hpp"
#include "rdmakit/rdmakit.hpp"

namespace rdmakit::stream {

namespace detail {
class Acceptor;
class EngineImpl;
class StreamCore;
}  // namespace detail

struct StreamOptions {
  // Receive ring the peer WRITEs into (4 KiB .. 2 MiB).
  uint32_t rx_ring = 32 * 1024;
  // Send buffer: write() copies here when the data cannot go out at once
  // (with rx_ring and the provider's per-stream state: under 64 KiB).
  uint32_t tx_buffer = 12 * 1024;
  // Writes up to this size go out straight from the caller's buffer when the
  // peer has room (provider limits apply: tcp 4 KiB). Costs max_inline bytes
  // per send-queue slot on shm.
  uint32_t max_inline = 64;
  // Receives posted per stream (message credits, 8 .. 255).
  uint32_t recv_credits = 32;
  // Blocking calls poll this long before sleeping (0: sleep at once).
  std::chrono::nanoseconds busy_poll{0};
  // Idle streams send a keepalive this often; a peer heard from for no
  // longer than peer_timeout is declared dead (ETIMEDOUT).
  std::chrono::milliseconds keepalive{1000};
  std::chrono::milliseconds peer_timeout{5000};
  // close() keeps delivering queued data this long, then resets.
  std::chrono::milliseconds linger{10000};
  std::chrono::milliseconds connect_timeout{5000};
};

struct EngineOptions {
  ProviderKind provider = ProviderKind::kAuto;
  uint32_t max_streams = 1024;  // sizes the shared completion queue
  StreamOptions stream;         // defaults for connect/accept
  // Processes of other users the shm provider admits (none by default): an
  // admitted peer reaches the receive rings of this engine's streams, so an
  // engine that admits another user should carry only streams with it.
  ShmContextOptions shm;
  // Called first on the engine's progress thread, before it makes any call:
  // lets a caller that intercepts libc (the LD_PRELOAD library) tell the
  // engine's own waits from the application's. nullptr: nothing is called.
  void (*on_thread_start)() = nullptr;
};

class Stream;
class StreamListener;

class RDMAKIT_API Engine {
 public:
  // Throws Error (provider unavailable, options out of range).
  static std::shared_ptr<Engine> create(const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws Error (ECONNREFUSED, ETIMEDOUT, EPROTO for a peer that is not a
  // stream endpoint, EMFILE past max_streams).
  std::unique_ptr<Stream> connect(const std::string& address);
  std::unique_ptr<Stream> connect(const std::string& address,
                                  const StreamOptions& options);
  std::unique_ptr<StreamListener> listen(const std::string& address);
  // Streams this listener accepts in the background (fd(), non-blocking
  // mode) get these options.
  std::unique_ptr<StreamListener> listen(const std::string& address,
                                         const StreamOptions& options);

  Context& context() noexcept;
  ProviderKind provider() const noexcept;
  // Streams alive in the engine, including closed ones still draining.
  size_t stream_count() const noexcept;

 private:
  friend class StreamListener;
  explicit Engine(std::shared_ptr<detail::EngineImpl> impl) noexcept;
  std::shared_ptr<detail::EngineImpl> impl_;
};

class RDMAKIT_API StreamListener {
 public:
  ~StreamListener();
  StreamListener(const StreamListener&) = delete;
  StreamListener& operator=(const StreamListener&) = delete;

  // Throws Error(ETIMEDOUT) after timeout, Error(EPROTO) for a connecting
  // peer that is not a stream endpoint; Error(EAGAIN) at once in
  // non-blocking mode when no connection is ready.
  std::unique_ptr<Stream> accept(std::chrono::milliseconds timeout);
  std::unique_ptr<Stream> accept(std::chrono::milliseconds timeout,
                                 const StreamOptions& options);
  // Event-loop use. fd() is a kernel fd that is readable (epoll, poll,
  // select) while a connection is ready to accept; try_accept() returns it
  // or nullptr with *error = EAGAIN (or the errno that prevents accepting),
  // never throwing. The first call of fd(), try_accept() or
  // set_nonblocking(true) starts accepting in the background (up to 128
  // streams queued); from then on streams get the options given to
  // Engine::listen (accept's `options` no longer apply) and closing the
  // listener may take up to 250 ms. -errno if the fd cannot be created.
  int fd() noexcept;
  std::unique_ptr<Stream> try_accept(int* error = nullptr) noexcept;
  void set_nonblocking(bool on) noexcept;
  bool nonblocking() const noexcept;
  std::string address() const;
  uint16_t port() const;

 private:
  friend class Engine;
  StreamListener(std::shared_ptr<detail::EngineImpl> engine,
                 std::unique_ptr<Listener> listener,
                 const StreamOptions& options) noexcept;
  int start_background() noexcept;  // 0 or -errno; mu_ held
  std::shared_ptr<detail::EngineImpl> engine_;
  std::unique_ptr<Listener> listener_;
  StreamOptions options_;
  mutable std::mutex mu_;
  bool nonblocking_ = false;
  // After listener_: it stops before the listener goes.
  std::unique_ptr<detail::Acceptor> acceptor_;
};

class RDMAKIT_API Stream {
 public:
  // Flags for read/write (the MSG_* values of <sys/socket.h>).
  static constexpr int kPeek = MSG_PEEK;
  static constexpr int kDontWait = MSG_DONTWAIT;
  static constexpr int kWaitAll = MSG_WAITALL;

  // Closes (as close()).
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Bytes read (0 = end of stream), or -errno.
  ssize_t read(void* buf, size_t len, int flags = 0) noexcept;
  ssize_t readv(const iovec* iov, int iovcnt, int flags = 0) noexcept;
  // Bytes accepted (all of them when blocking), or -errno; -EPIPE after
  // shutdown(SHUT_WR).
  ssize_t write(const void* buf, size_t len, int flags = 0) noexcept;
  ssize_t writev(const iovec* iov, int iovcnt, int flags = 0) noexcept;
  // Bytes that read() returns at once.
  size_t available() const noexcept;

  // SHUT_RD, SHUT_WR or SHUT_RDWR; 0 or -errno. SHUT_WR sends end-of-stream
  // after the queued data; the other direction keeps working.
  int shutdown(int how) noexcept;
  // Queued data is still delivered (up to StreamOptions::linger) after
  // close() returns; the stream object is then unusable. Never blocks.
  int close() noexcept;
  // Abortive close (a socket's close with SO_LINGER {1, 0}): queued and
  // unread bytes are dropped and the peer is reset (an RST control message):
  // its reads return what it had already received, then -ECONNRESET; its
  // writes -ECONNRESET. The stream object is then unusable. Never blocks.
  int abort() noexcept;

  // Non-blocking mode: calls return -EAGAIN instead of waiting.
  void set_nonblocking(bool on) noexcept;
  bool nonblocking() const noexcept;
  // Blocking calls give up after this long with -EAGAIN (0 = no limit), as
  // SO_RCVTIMEO / SO_SNDTIMEO.
  void set_timeouts(std::chrono::milliseconds read,
                    std::chrono::milliseconds write) noexcept;

  // A kernel fd whose POLLIN / POLLOUT mirror poll_events(): usable with
  // epoll (level or edge triggered), poll and select. Created on first call;
  // owned by the stream. -errno if it cannot be created.
  int fd() noexcept;
  // POLLIN, POLLOUT, POLLRDHUP (the peer's end of stream), POLLHUP (both
  // directions ended, or an error), POLLERR (an error, until hide_error()).
  // fd() shows the same, and POLLIN|POLLRDHUP|POLLHUP after an error, as a
  // TCP socket does after a reset.
  short poll_events() const noexcept;
  // As poll_events(), but first collects what the peer has put into the ring
  // since (polls the engine's completion queue on the caller's thread), so a
  // caller spinning in poll/epoll_wait learns readability and writability
  // without waiting for the progress thread. Never blocks; while another
  // thread is inside the engine it returns the readiness that thread last
  // published. A caller that goes to sleep on fd() when this returns
  // nothing it wants passes about_to_sleep = true: the engine then makes
  // sure the progress thread watches for arrivals (fd() is signalled when
  // the state changes). Spinning callers pass false and cost no syscall.
  // reads_next: the caller reads this stream at once when the result has
  // POLLIN; its data arriving is then not signalled on fd() (the read takes
  // it and leaves fd() current), which spares two syscalls per message.
  short poll_readiness(bool about_to_sleep = false, bool reads_next = false) noexcept;
  // poll_events() as the engine last published it (after its last change
  // to the stream), read without the engine lock or a syscall: for a caller
  // that has just drained the engine (poll_readiness on any of its streams)
  // and then checks many streams.
  short last_events() const noexcept;
  // While on, the stream's becoming readable with data is not signalled on
  // fd() (as poll_readiness's reads_next, but for every arrival, whoever
  // collects it): for a caller that takes readiness from last_events() and
  // reads what it finds, sparing two syscalls per message. End of stream
  // and errors are still signalled at once. Turning it off brings fd() up to
  // date at once: it must be off whenever anyone may sleep on fd().
  void set_lazy_readiness(bool on) noexcept;

  // The error that ended the stream (0 while healthy) and its cause.
  int error() const noexcept;
  Status error_status() const noexcept;
  // The caller has reported error() (as a socket's SO_ERROR reports it
  // once): fd() and poll_events() stop showing POLLERR; error() stays.
  void hide_error() noexcept;

  const std::string& peer() const noexcept;
  // Resident bytes this stream holds (rings, buffers, queue slots).
  size_t memory_bytes() const noexcept;

 private:
  friend class Engine;
  friend class StreamListener;
  Stream(std::shared_ptr<detail::EngineImpl> engine,
         std::shared_ptr<detail::StreamCore> core) noexcept;
  std::shared_ptr<detail::EngineImpl> engine_;
  std::shared_ptr<detail::StreamCore> core_;
};

}  // namespace rdmakit::stream
