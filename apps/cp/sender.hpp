#pragma once
// The sending end of a transfer (the client on push, the server on pull):
// reads files straight into registered slots, WRITEs each full slot into the
// receiver's "slots" buffer with an immediate, and keeps up to kSlots slots
// in flight; disk reads of the next slot overlap the network moving the
// previous ones. A nacked slot (hash mismatch at the receiver) is re-sent.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <rdmakit/session/session.hpp>
#include <string>
#include <vector>

#include "entry_queue.hpp"
#include "protocol.hpp"
#include "report.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

struct SenderConfig {
  session::Channel* channel = nullptr;
  uint64_t remote_offset = 0;  // where this transfer's slots start in the receiver's
  session::Local staging;      // kLaneBytes of registered local memory
  SourceRoot root{};
  bool resume = false;
  Report* report = nullptr;
  int64_t corrupt_chunk = -1;  // fault injection: corrupt this chunk once
  std::chrono::milliseconds timeout{30000};
};

class Sender {
 public:
  explicit Sender(SenderConfig config);
  // Sends every entry of the queue as it comes, then waits for the
  // receiver's final report. Errors go to the report; returns false if the
  // transfer as a whole failed.
  bool run(EntryQueue& queue);

 private:
  struct Slot {
    bool busy = false;
    uint32_t seq = 0;
    uint32_t len = 0;  // payload bytes
    uint32_t resends = 0;
    bool corrupted = false;
  };
  std::byte* slot_mem(uint32_t s) const;
  bool send_message(Writer& w);
  bool pump(std::chrono::milliseconds timeout);
  bool acquire();
  bool ensure(size_t n);
  bool flush();
  bool post(uint32_t s);
  void append(const void* p, size_t n);
  template <typename T>
  void put(T v) {
    append(&v, sizeof v);
  }
  void put_str(const std::string& s);
  bool send_entry(const Entry& e, uint32_t id);
  bool send_file(const Entry& e, uint32_t id);
  void file_error(const std::string& path, Failure kind, const std::string& reason);
  bool fatal(Failure kind, const std::string& reason);

  SenderConfig c_;
  Slot slots_[kSlots];
  int cur_ = -1;
  uint32_t cur_len_ = 0;
  uint32_t next_seq_ = 0;
  uint32_t next_slot_ = 0;
  uint64_t chunks_posted_ = 0;
  bool final_ = false;
  bool dead_ = false;
  std::map<uint32_t, std::vector<std::byte>> needs_;  // id -> Need message body
  std::mutex post_mu_;
  std::string post_error_;
};

}  // namespace rdmakit::cp
