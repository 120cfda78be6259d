#pragma once
// A kernel fd whose readability and writability we set: the user end of an
// AF_UNIX datagram socketpair.
//  - readable: one 1-byte datagram queued towards the user end;
//  - not writable: one datagram larger than a quarter of the user end's
//    (minimal) send buffer queued from the user end to ours, which holds the
//    user end's send allocation (unix_writable() is false) until we read it.
// Each transition is one syscall; epoll/poll/select see ordinary socket
// wake-ups, so level- and edge-triggered epoll both work.
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
  void close() noexcept;

 private:
  int user_ = -1;
  int ours_ = -1;
  bool readable_ = false;
  bool writable_ = true;
};

}  // namespace rdmakit::stream::detail
