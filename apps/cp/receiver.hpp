#pragma once
// The receiving end (the server on push, the client on pull). The calling
// thread takes notifications and control messages: it checks each slot's
// records hash (nack -> the sender re-sends) and queues good slots; a writer
// thread applies them in sequence order (so disk writes overlap the network),
// checks each data record's block digest just before writing its bytes (a
// mismatch nacks the slot; the writer continues with that record when the
// slot comes again) and acks each slot once its records are on disk. Every file is
// written to
// ".NAME.rdmakit-cp-part", verified against the sender's file hash, fsynced
// and renamed; nothing unverified ever appears under its final name.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <rdmakit/session/session.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "generator.hpp"
#include "metadata_sync.hpp"
#include "protocol.hpp"
#include "reorder.hpp"
#include "report.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

// ".NAME.rdmakit-cp-part": where NAME is written until it verified.
inline std::string part_name(const std::string& name) {
  return "." + name + ".rdmakit-cp-part";
}

// Where received paths land: beneath `base`; if rename_top is set, the first
// component of every path is replaced by it (copy to a new name).
struct Target {
  int base = -1;
  std::string rename_top;
};

// Resolves a destination. confined: `dst` is peer-named and opened beneath
// `root`. nsources: more than one needs an existing directory. On failure
// returns false with the class and reason.
bool resolve_target(int root, const std::string& dst, bool confined, uint32_t nsources,
                    Target* out, Failure* kind, std::string* reason);

// Maps a wire path to a path beneath the target; "" + reason if refused.
std::string map_wire_path(const Target& target, const std::string& rel, std::string* why);

// A lane past the first (lanes.hpp): a connection of its own whose slots
// buffer the sender WRITEs into; its notifications are taken by a thread of
// its own and filed in the reorder window with the others.
struct ReceiverLane {
  session::Channel* channel = nullptr;
  std::byte* slots = nullptr;  // kLaneBytes
  std::string peer;            // for errors
};

struct ReceiverConfig {
  session::Channel* channel = nullptr;  // control messages, and lane 0's slots
  std::byte* slots = nullptr;           // this transfer's slots (kLaneBytes)
  std::vector<ReceiverLane> lanes;      // lanes 1.. (empty: one lane)
  Target target;
  bool resume = false;
  uint32_t sync = 0;        // SyncFlags
  std::string partial_dir;  // --partial-dir: part files as DIR/NAME beside NAME
  ItemSide side = ItemSide::kPush;
  std::function<bool(const std::string&, bool)> excluded;  // filter rules
  std::vector<std::string> tops;  // a pull: the names asked for (GeneratorConfig)
  Report* report = nullptr;
  std::chrono::milliseconds timeout{60000};
  // Setuid, setgid and sticky bits from the peer are dropped unless set.
  bool preserve_special = false;
  // Bytes this transfer may declare and write (0: no limit); files that
  // would not fit the filesystem's free space are refused either way.
  uint64_t max_bytes = 0;
};

class Receiver {
 public:
  explicit Receiver(ReceiverConfig config);
  ~Receiver();
  // Receives until the sender's stream is complete; false on a fatal error.
  bool run();

 private:
  struct File {
    uint32_t id = 0;
    bool open = false;
    bool failed = false;
    bool created = false;      // a new part file, empty when opened
    uint32_t create_mode = 0;  // the mode it was created with
    uint64_t written_end = 0;  // end of the last data written
    int fd = -1;
    int parent = -1;
    int part_dir = -1;  // where the part file is: parent, or the partial dir
    std::string path, name, tmp;
    uint64_t size = 0;
    uint32_t mode = 0;
    int64_t sec = 0;
    uint32_t nsec = 0;
    std::vector<uint64_t> hashes;
    std::vector<bool> needed;
    EntryRecord rec;  // owner and attributes to apply
  };
  struct DirFix {
    std::string path;
    EntryRecord rec;
  };

  enum class Applied : uint8_t { kDone, kMalformed, kDamaged };
  void writer_loop();
  // Applies the records of a slot from payload offset *at; on kDamaged *at
  // is the record to continue with when the slot comes again.
  Applied apply_slot(ReorderWindow::Place where, uint32_t* at);
  // A slot arrived on a lane: check its records, file it for the writer
  // (or nack it). False: the transfer cannot go on (fatal already said).
  bool on_chunk(uint32_t lane, uint32_t slot);
  void lane_loop(uint32_t lane);  // takes an extra lane's notifications
  std::byte* slot_mem(uint32_t lane, uint32_t slot) const {
    return lanes_[lane].slots + uint64_t{slot} * kSlotSize;
  }
  bool on_entry(Reader& rd);
  // Opens the part file of a file entry (from a basis when it has one).
  void open_part(const EntryRecord& rec, int parent);
  bool copy_from_basis(int basis);
  void on_link(const EntryRecord& rec, int parent, Kind kind);
  // Room for a file of `size` (byte limit, free space); else "" + reason.
  std::string admit_size(uint64_t size);
  bool on_data(Reader& rd);  // false: the data does not match its digest
  void on_end(Reader& rd);
  void on_abort(Reader& rd);
  void fail_file(Failure kind, const std::string& reason);
  void close_file();
  void fix_dirs();
  int parent_fd(const std::string& dir);  // cached; -errno on failure
  void send(Writer& w);
  // kAck for a slot: applied (ok), or damaged and to be sent again.
  void send_ack(uint32_t lane, uint32_t slot, uint32_t seq, bool ok);
  void fatal(Failure kind, const std::string& reason, bool tell_peer);

  ReceiverConfig c_;
  std::vector<ReceiverLane> lanes_;  // lane 0 (the control connection) first
  MetaSync meta_;
  std::unique_ptr<Generator> generator_;
  std::vector<std::byte> scratch_;  // one block, copied from a basis
  BlockHasher hasher_;
  File cur_;
  std::vector<DirFix> dirs_;
  std::unordered_set<std::string> touched_;  // directories an entry was made in
  std::string parent_path_;
  int parent_ = -1;

  std::mutex mu_;  // below: shared by the two threads
  std::condition_variable cv_;
  ReorderWindow window_;  // slots arrived, by sequence number
  int64_t total_seqs_ = -1;
  bool writer_done_ = false;
  bool abort_ = false;
  // Writer thread only: what this transfer declared and wrote so far.
  uint64_t declared_ = 0;
  uint64_t written_ = 0;
};

}  // namespace rdmakit::cp
