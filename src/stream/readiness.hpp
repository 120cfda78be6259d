#pragma once
// A kernel fd whose readability and writability we set: the user end of an
// AF_UNIX datagram socketpair.
//  - readable: one 1-byte datagram queued towards the user end;
//  - not writable: one datagram larger than a quarter of the user end's
//    (minimal) send buffer queued from the user end to ours, which holds the
//    user end's send allocation (unix_writable() is false) until we read it.
// Each transition is one syscall; epoll/poll/select see ordinary socket
// wake-ups, so level- and edge-triggered epoll both work.
// The ends of a stream are shown as a TCP socket shows them, by real socket
// state (so the kernel's epoll judges them too), each applied once and for
// good (set() no longer changes anything after them):
//  - end of stream: shutdown(SHUT_RD) of the user end: POLLIN|POLLRDHUP;
//  - hang-up: shutdown(SHUT_RDWR) of the user end: POLLHUP too;
//  - error: the user end's socket error (ECONNRESET): POLLERR until
//    clear_error() reads it. Set by disconnecting our end while it holds a
//    datagram from the user end (the kernel then reports ECONNRESET to it).
namespace rdmakit::stream::detail {

class Readiness {
 public:
  Readiness() = default;
  ~Readiness();
  Readiness(const Readiness&) = delete;
  Readiness& operator=(const Readiness&) = delete;

  // 0 or -errno. Starts "not readable, writable".
  int open() noexcept;
  bool is_open() const noexcept { return user_ >= 0; }
  int fd() const noexcept { return user_; }
  // Moves the fd to the given state (only the changed halves cost a syscall).
  void set(bool readable, bool writable) noexcept;
  // The state the fd shows now.
  bool readable() const noexcept { return readable_; }
  // Applies what is not shown yet of: end of stream (rdhup), hang-up, error.
  // Each is one wake-up of the fd's waiters (its readability comes with the
  // shutdown, not as a datagram before it).
  void set_ended(bool rdhup, bool hup, bool error) noexcept;
  void clear_error() noexcept;
  bool hung_up() const noexcept { return hup_; }
  void close() noexcept;

 private:
  int user_ = -1;
  int ours_ = -1;
  bool readable_ = false;
  bool writable_ = true;
  bool rdhup_ = false;
  bool hup_ = false;
  bool error_ = false;  // shown (or shown and cleared): never again
};

}  // namespace rdmakit::stream::detail
