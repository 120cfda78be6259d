#pragma once
// One relay of the owner's side (relay.hpp): its state, and the pumping
// that carries its socket pair to and from the connection's stream. The
// relay server (relay_server.cpp) grants relays and runs their pumps on its
// thread.
#include <poll.h>
#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "relay_wire.hpp"
#include "state.hpp"

namespace rdmakit::preload {

struct Relay {
  std::mutex mu;  // the pumping (server thread) vs flush and reclaim (owner's threads)
  bool taken_back = false;
  // The last kHistory bytes sent to the asker (a ring; made on first send).
  std::unique_ptr<char[]> history;
  uint64_t sent = 0;
  void remember(const char* p, size_t n) {
    if (!history) history.reset(new char[relay_wire::kHistory]);
    for (size_t done = 0; done < n;) {
      const size_t at = (sent + done) % relay_wire::kHistory;
      const size_t k = std::min(n - done, relay_wire::kHistory - at);
      std::memcpy(history.get() + at, p + done, k);
      done += k;
    }
    sent += n;
  }
  // The last n bytes sent; false when more than were kept.
  bool last_sent(uint64_t n, std::string* out) const {
    if (n > sent || n > relay_wire::kHistory || !history) return n == 0;
    out->resize(n);
    for (uint64_t done = 0; done < n;) {
      const size_t at = (sent - n + done) % relay_wire::kHistory;
      const size_t k = std::min<size_t>(n - done, relay_wire::kHistory - at);
      std::memcpy(out->data() + done, history.get() + at, k);
      done += k;
    }
    return true;
  }
  bool down_stopped = false;  // the asker is letting go: send it nothing more
  std::shared_ptr<Conn> conn;
  int so = -1;    // the owner's end of the pair
  int wake = -1;  // dormant: the asker writes a byte here when it first uses it
  bool awake = true;
  // Asked for again by an exec'd image: one that reads through stdio (no
  // hook sees it) starts delivery by writing, as before its exec.
  bool wake_on_bytes = false;
  dev_t given_dev = 0;
  ino_t given_ino = 0;  // the end given away (an exec'd image asks with it)
  std::unique_ptr<char[]> up{new char[relay_wire::kBuf]};    // asker -> stream
  std::unique_ptr<char[]> down{new char[relay_wire::kBuf]};  // stream -> asker
  size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;
  bool asker_eof = false;   // the asker shut down writing
  bool asker_shut = false;  // it said so ('h'): its end of stream is a shutdown
  bool asker_gone = false;  // every copy of the asker's end is closed
  bool stream_eof = false;
  bool dead = false;
  ~Relay();
  // Granted: counted until it ends (any_relayed()).
  void start_counting() noexcept;
};

// The poll entries of r, in this order: its end of the pair, the stream,
// the wake channel (-1 where there is nothing to wait for).
void add_poll_entries(const Relay& r, std::vector<pollfd>* p);

// r.mu held by the caller of the _locked form; the others take it.
void read_control(Relay& r);
void read_control_locked(Relay& r);
void take_back(Relay& r);
void pump(Relay& r, short so_rev);
void push_written(Relay& r);

}  // namespace rdmakit::preload
