#pragma once
// The sending end of a transfer (the client on push, the server on pull):
// reads files straight into registered slots, WRITEs each full slot into the
// receiver's "slots" buffer with an immediate, and keeps up to kSlots slots
// in flight. Three threads: the caller reads and hashes into free slots, a
// posting thread WRITEs the full ones, an acknowledgement thread frees them
// (or re-posts a nacked one: hash mismatch at the receiver).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <rdmakit/session/session.hpp>
#include <string>
#include <thread>
#include <vector>

#include "entry_queue.hpp"
#include "itemize.hpp"
#include "metadata_sync.hpp"
#include "protocol.hpp"
#include "records.hpp"
#include "report.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

// A lane past the first (lanes.hpp): a connection of its own, with its own
// staging and the receiver's slots buffer of that connection.
struct SenderLane {
  session::Channel* channel = nullptr;
  session::Local staging;      // kLaneBytes of registered local memory
  uint64_t remote_offset = 0;  // where the slots start in the receiver's buffer
  std::string peer;            // for errors
};

struct SenderConfig {
  session::Channel* channel = nullptr;  // control messages, and lane 0's slots
  uint64_t remote_offset = 0;     // where this transfer's slots start in the receiver's
  session::Local staging;         // kLaneBytes of registered local memory
  std::vector<SenderLane> lanes;  // lanes 1.. (empty: one lane)
  SourceRoot root{};
  uint32_t sync = 0;  // SyncFlags
  ItemSide side = ItemSide::kPush;
  uint64_t bwlimit = 0;  // data bytes per second (--bwlimit), 0: no limit
  Report* report = nullptr;
  int64_t corrupt_chunk = -1;    // fault injection: corrupt this chunk once,
  bool corrupt_records = false;  // in its records rather than its file data
  // Test hook (RDMAKIT_CP_TEST_DECLARE_SIZE=N, a lying sender): every file's
  // entry declares N bytes whatever it holds.
  bool lie_size = false;
  uint64_t declare_size = 0;
  // Test hooks of a hostile sender (RDMAKIT_CP_TEST_TOP=NAME: every listed
  // path starts with NAME instead; RDMAKIT_CP_TEST_LINK_TO=PATH: the first
  // file is listed as a hard link to PATH).
  std::string test_top;
  std::string test_link;
  std::chrono::milliseconds timeout{30000};
};

class Sender {
 public:
  explicit Sender(SenderConfig config);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;
  // Lists every entry of the queue as it comes (a lister thread), sends what
  // the receiver's answers ask for, then waits for the receiver's final
  // report. Errors go to the report; returns false if the transfer as a
  // whole failed.
  bool run(EntryQueue& queue);

 private:
  // A slot is filled by the reading thread (this one, in run()), posted by
  // the posting thread and freed by the acknowledgement thread, so reading
  // and hashing the next slots overlap posting and moving the previous ones.
  enum class State : uint8_t { kFree, kFilling, kReady, kInFlight };
  struct Slot {
    State state = State::kFree;
    uint32_t seq = 0;
    uint32_t len = 0;  // payload bytes
    uint32_t resends = 0;
    int32_t corrupt_at = -1;  // payload byte flipped by fault injection
    // A flipped byte to restore before the slot is sent again, by the posting
    // thread: the acknowledgement thread never writes a slot's bytes.
    int32_t restore_at = -1;
    // The posting thread is inside post() for this slot. Its acknowledgement
    // can come first (through the peer), but the slot is refilled only
    // after the post returned, so no thread writes bytes a post still reads.
    bool posting = false;
    uint64_t pace_at = 0;  // --bwlimit: the stream's bytes before this slot
  };
  // Slots are numbered across lanes: slot s is lane s / kSlots's slot
  // s % kSlots.
  std::byte* slot_mem(uint32_t s) const;
  const SenderLane& lane(uint32_t l) const { return lanes_[l]; }
  bool send_message(Writer& w);
  bool handle(session::Message& m);  // one control message (ack thread)
  void ack_loop();
  void post_loop(uint32_t lane);  // one posting thread per lane
  void queue_post(uint32_t s);    // under mu_
  bool acquire();
  bool ensure(size_t n);
  bool flush();
  bool post(uint32_t s);
  void append(const void* p, size_t n);
  template <typename T>
  void put(T v) {
    append(&v, sizeof v);
  }
  // An entry listed and waiting for the receiver's answer.
  struct Listed {
    Entry entry;
    EntryRecord rec;
    std::vector<uint64_t> hashes;  // block hashes, when --checksum read them
  };
  struct Answer {
    uint32_t id = 0;
    Want want = Want::kSkip;
    uint16_t items = 0;
    uint8_t basis = 0;
    std::vector<uint64_t> hashes;  // the basis's, for a delta
  };
  void list_loop(EntryQueue* queue);  // the lister thread
  bool describe(const Entry& e, uint32_t id, Listed* out);
  bool on_wants(Reader& rd);
  bool on_deleted(Reader& rd);
  bool send_record(const EntryRecord& rec);
  bool send_file(Listed& l, const Answer* delta);
  void file_error(const std::string& path, Failure kind, const std::string& reason);
  bool fatal(Failure kind, const std::string& reason);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  void stop_threads();

  SenderConfig c_;
  std::vector<SenderLane> lanes_;  // lane 0 (the control connection) first
  uint32_t nslots_ = kSlots;       // kSlots per lane
  Slot slots_[kMaxLanes * kSlots];
  int cur_ = -1;  // the slot being filled (reading thread only)
  uint32_t cur_len_ = 0;
  int32_t first_data_ = -1;  // payload offset of the current slot's first data byte
  uint32_t next_seq_ = 0;
  uint32_t next_slot_ = 0;
  uint64_t chunks_posted_ = 0;

  // Shared by the three threads, under mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  struct Ready {  // per lane: ring of its slots waiting to be posted
    uint32_t ring[kSlots] = {};
    uint32_t head = 0, tail = 0;
  };
  Ready ready_[kMaxLanes];
  uint32_t ready_count_ = 0;  // slots in all rings
  uint64_t paced_bytes_ = 0;  // --bwlimit: the stream's bytes so far, all lanes
  uint32_t posting_ = 0;      // popped from the ring, being posted
  uint32_t in_flight_ = 0;
  bool final_ = false;
  bool stop_ = false;
  std::deque<Listed> listed_;     // listed, not answered yet, in id order
  std::deque<Answer> answers_;    // answered, not acted on yet
  uint64_t answered_ids_ = 0;     // last id answered
  uint64_t listed_ids_ = 0;       // last id listed
  bool list_done_ = false;        // the lister sent the list's end
  bool receiver_listed_ = false;  // kListed: every answer given, deletions done
  std::chrono::steady_clock::time_point waiting_since_{};  // for a silent peer
  MetaSync meta_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> first_links_;  // -H: (dev, ino)

  std::atomic<bool> dead_{false};
  std::mutex error_mu_;
  std::string post_error_;
  std::thread acker_;
  std::vector<std::thread> posters_;
  std::thread lister_;
};

}  // namespace rdmakit::cp
