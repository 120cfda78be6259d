#include "relay_pump.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>

#include "libc.hpp"
#include "relay.hpp"

namespace rdmakit::preload {

using namespace relay_wire;  // NOLINT(google-build-using-namespace)

namespace {

std::atomic<int> g_relay_count{0};  // relays this process serves

// The connection's next bytes: given-back ones first, then the stream's.
ssize_t read_conn(Conn& c, char* buf, size_t len) {
  if (c.has_pushback()) {
    std::lock_guard lock(c.pushback_mu);
    const size_t n = std::min(len, c.pushback.size());
    if (n > 0) {
      c.pushback.copy(buf, n);
      c.pushback.erase(0, n);
      if (c.pushback.empty() && c.mark_pushback(false)) count_pushback(-1);
      return static_cast<ssize_t>(n);
    }
  }
  return c.stream->read(buf, len, stream::Stream::kDontWait);
}

}  // namespace

Relay::~Relay() {
  if (so >= 0) real().close(so);
  if (wake >= 0) real().close(wake);
  if (conn) {
    conn->relay_ended();
    g_relay_count.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void Relay::start_counting() noexcept {
  conn->relay_started();
  g_relay_count.fetch_add(1, std::memory_order_acq_rel);
}

bool any_relayed() noexcept { return g_relay_count.load(std::memory_order_acquire) > 0; }

void add_poll_entries(const Relay& r, std::vector<pollfd>* p) {
  short so_ev = 0;
  short st_ev = 0;
  if (!r.asker_eof && r.up_len == 0) so_ev |= POLLIN;
  if (r.down_len > r.down_off && !r.down_stopped) so_ev |= POLLOUT;
  if (!r.stream_eof && r.down_len == 0 && !r.down_stopped) st_ev |= POLLIN;
  if (r.up_len > r.up_off) st_ev |= POLLOUT;
  if (!r.awake) st_ev = static_cast<short>(st_ev & ~POLLIN);
  // Polled with no events, an end that hung up would wake this loop at
  // once, again and again: only the asker's end is, and only while its
  // hang-up is news (it shut down writing; its close ends the relay).
  const bool watch_hangup = r.asker_eof && !r.asker_gone && !r.stream_eof;
  p->push_back({so_ev != 0 || watch_hangup ? r.so : -1, so_ev, 0});
  p->push_back({st_ev != 0 ? r.conn->stream->fd() : -1, st_ev, 0});
  // After 'S' what follows on the wake channel ('G' + count, then its
  // end) is take_back's: polled here, it would wake this loop at once.
  p->push_back({r.down_stopped ? -1 : r.wake, POLLIN, 0});
}

// The wake channel carries the asker's control bytes: 'h', it shut down
// writing (what it wrote before is all on the relay socket); 'w', it reads now
// (a dormant relay starts delivering; its own writes never start it, nor
// does its end closing: the owner's incoming bytes stay the owner's); 'S',
// it lets go and will give back what it has not read, so nothing more
// goes to it ('A' says so). What follows 'S' ('G' + count) is take_back's.
// At its end (the asker exec'd, its copy closed) the channel is dropped.
void read_control(Relay& r) {
  std::lock_guard lock(r.mu);
  read_control_locked(r);
}

// r.mu held.
void read_control_locked(Relay& r) {
  char b = 0;
  while (!r.down_stopped && r.wake >= 0) {
    const ssize_t n = real().recv(r.wake, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      real().close(r.wake);
      r.wake = -1;
      return;
    }
    if (n != 1 || (b != 'w' && b != 'S' && b != 'h')) return;
    (void)real().recv(r.wake, &b, 1, MSG_DONTWAIT);
    if (b == 'w' || b == 'h') {
      (b == 'w' ? r.awake : r.asker_shut) = true;
      continue;
    }
    r.down_stopped = true;
    (void)real().send(r.wake, "A", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
}

// The asker let go of the connection: what it received and never read,
// given back on the wake channel, and what this relay had not yet sent it,
// go before the stream's next bytes (as they would stay in a kernel
// socket for its next reader).
void take_back(Relay& r) {
  if (r.taken_back) return;
  r.taken_back = true;
  std::string back;
  if (r.wake >= 0) {
    // The asker wrote it all before it closed: read to the end (bounded).
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    std::string raw;
    char buf[16384];
    for (;;) {
      pollfd w{r.wake, POLLIN, 0};
      if (real().poll(&w, 1, 20) <= 0) {
        if (std::chrono::steady_clock::now() > until) break;
        continue;
      }
      const ssize_t n = real().recv(r.wake, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      raw.append(buf, static_cast<size_t>(n));
      if (raw.size() > 4096) break;  // a few control bytes and one count
    }
    size_t i = 0;
    while (i < raw.size()) {
      if (raw[i] == 'w' || raw[i] == 'S' || raw[i] == 'h') {
        ++i;
        continue;
      }
      uint64_t unread = 0;
      if (raw[i] != 'G' || i + 1 + sizeof unread > raw.size()) break;
      std::memcpy(&unread, raw.data() + i + 1, sizeof unread);
      i += 1 + sizeof unread;
      // The last `unread` bytes sent, from this side's own copy; a count
      // larger than what was kept is a lie: nothing is taken back.
      if (!r.last_sent(unread, &back)) back.clear();
    }
  }
  if (r.down_len > r.down_off)
    back.append(r.down.get() + r.down_off, r.down_len - r.down_off);
  r.down_len = r.down_off = 0;
  if (back.empty()) return;
  Conn& c = *r.conn;
  std::lock_guard lock(c.pushback_mu);
  c.pushback.insert(0, back);
  if (!c.mark_pushback(true)) count_pushback(1);
}

void pump(Relay& r, short so_rev) {
  stream::Stream& st = *r.conn->stream;
  // Asker -> stream.
  std::lock_guard lock(r.mu);
  if (!r.asker_eof && r.up_len == 0 && (so_rev & (POLLIN | POLLHUP | POLLERR)) != 0) {
    const ssize_t n = real().recv(r.so, r.up.get(), kBuf, MSG_DONTWAIT);
    if (n > 0) {
      r.up_len = static_cast<size_t>(n);
      r.up_off = 0;
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      r.asker_eof = true;
      // An 'h' is written before the end of stream it explains: read now.
      if (!r.asker_shut) read_control_locked(r);
      // A shutdown(SHUT_WR) of the asker's copy is a half close of the
      // connection: said with 'h', or seen as its read side left open (no
      // POLLHUP). A close is not: other copies may still write.
      r.asker_gone = !r.asker_shut && ((so_rev & POLLHUP) != 0 || n < 0);
      if (!r.asker_gone) (void)st.shutdown(SHUT_WR);
    }
  } else if (r.asker_eof && !r.asker_gone && !r.stream_eof &&
             (so_rev & (POLLHUP | POLLERR)) != 0) {
    r.asker_gone = true;  // it had shut down writing, and now closed too
  }
  if (r.up_len > r.up_off) {
    const ssize_t w =
        st.write(r.up.get() + r.up_off, r.up_len - r.up_off, stream::Stream::kDontWait);
    if (w > 0) r.up_off += static_cast<size_t>(w);
    if (w < 0 && w != -EAGAIN) r.dead = true;  // the stream failed: nothing to carry
    if (r.up_off == r.up_len) r.up_len = r.up_off = 0;
  }
  // Stream -> asker.
  if (r.awake && !r.down_stopped && !r.stream_eof && r.down_len == 0) {
    const ssize_t n = read_conn(*r.conn, r.down.get(), kBuf);
    if (n > 0) {
      r.down_len = static_cast<size_t>(n);
      r.down_off = 0;
    } else if (n == 0 || n != -EAGAIN) {
      r.stream_eof = true;
      (void)real().shutdown(r.so, SHUT_WR);
    }
  }
  if (r.down_len > r.down_off && !r.down_stopped) {
    const ssize_t w = real().send(r.so, r.down.get() + r.down_off,
                                  r.down_len - r.down_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      r.remember(r.down.get() + r.down_off, static_cast<size_t>(w));
      r.down_off += static_cast<size_t>(w);
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) r.asker_gone = true;
    if (r.down_off == r.down_len) r.down_len = r.down_off = 0;
  }
  if (r.asker_gone && r.up_len == 0) {
    take_back(r);
    r.dead = true;
  }
  if (r.asker_eof && r.stream_eof && r.up_len == 0 && r.down_len == 0) r.dead = true;
}

// r->mu held: every byte the asker has written so far goes into the
// stream (blocking on its credit); EOF is left to the server thread.
void push_written(Relay& r) {
  for (;;) {
    if (r.up_len > r.up_off) {
      const ssize_t w = r.conn->stream->write(r.up.get() + r.up_off, r.up_len - r.up_off);
      if (w <= 0) return;
      r.up_off += static_cast<size_t>(w);
      if (r.up_off == r.up_len) r.up_len = r.up_off = 0;
      continue;
    }
    if (r.asker_eof) return;
    const ssize_t n = real().recv(r.so, r.up.get(), kBuf, MSG_DONTWAIT);
    if (n <= 0) return;
    r.up_len = static_cast<size_t>(n);
    r.up_off = 0;
  }
}

}  // namespace rdmakit::preload
