#pragma once
// The receiving end's generator (rsync's word): it takes the sender's list of
// entries (kCheck), compares each with what the destination holds, and
// answers per entry (kWant) whether to skip it, send it whole, or send only
// the blocks whose hashes differ from the basis file (delta). Attributes of an
// entry whose content is up to date are fixed here. After the list ends
// (kListEnd) it deletes what the destination has and the list lacks
// (--delete), and says it is done (kListed).
//
// It runs on a thread of its own, so comparing (and hashing basis files)
// overlaps the transfer of entries answered before.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <rdmakit/session/session.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "itemize.hpp"
#include "metadata_sync.hpp"
#include "protocol.hpp"
#include "records.hpp"
#include "report.hpp"

namespace rdmakit::cp {

struct Target;

struct GeneratorConfig {
  session::Channel* channel = nullptr;
  const Target* target = nullptr;
  uint32_t sync = 0;  // SyncFlags
  bool resume = false;
  std::string partial_dir;  // where part files are (--partial-dir), else beside
  bool preserve_special = false;
  ItemSide side = ItemSide::kPush;
  // Filter rules (--exclude): an excluded destination entry is not deleted
  // unless --delete-excluded.
  std::function<bool(const std::string&, bool)> excluded;
  // A pull: the names the client asked for; a listed path must start with
  // one of them (a hostile server may not write elsewhere beneath the
  // destination). Empty: any.
  std::vector<std::string> tops;
  Report* report = nullptr;
};

// A wire path's first component is one of `tops` (or `tops` is empty).
bool top_allowed(const std::vector<std::string>& tops, const std::string& wire);

class Generator {
 public:
  explicit Generator(GeneratorConfig config);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // From the receiver's control thread. False (with *why) for a protocol
  // error: a malformed list, or more entries listed than the window allows.
  bool on_check(std::span<const std::byte> body, std::string* why);
  bool on_list_end(std::string* why);
  // Called by the receiver's writer for each entry it finished: one more
  // answer the sender may list beyond.
  void stop();
  // The generator failed (it told the peer); the transfer ends.
  bool failed() const;
  // The generator ended its work (kListed sent). Only then may the writer
  // read what follows; a sender that ends its stream before its list (a
  // hostile one) leaves it unread.
  bool finished() const;
  // After the list ended (kListed sent), for the writer's last pass:
  // directories answered "skip" (their attributes were right) whose mtime
  // must be set again if something in them changed, and the directories
  // the generator changed (deletions, replaced entries).
  struct DirTime {
    int64_t sec;
    uint32_t nsec;
  };
  const DirTime* kept_dir(const std::string& dest) const;
  const std::unordered_set<std::string>& touched_dirs() const { return touched_; }
  // A hard link may only name a regular file listed earlier in this
  // transfer (the writer asks; a hostile sender could name any other file
  // beneath the destination, whose attributes the link would then share).
  bool listed_file(const std::string& dest) const;

 private:
  struct Decision {
    Want want = Want::kSkip;
    uint16_t items = 0;
    uint8_t basis = 0;  // kEntryBasisFinal / kEntryBasisPart
    std::vector<uint64_t> hashes;
  };
  void loop();
  void check_batch(const std::vector<std::byte>& body);
  Decision decide(const EntryRecord& e, const std::string& dest);
  void decide_file(const EntryRecord& e, int parent, const std::string& name,
                   const struct stat* st, Decision* d);
  uint16_t attr_changes(const EntryRecord& e, const struct stat& st, int fd, int parent,
                        const std::string& name);
  void fix_attrs(const EntryRecord& e, int parent, const std::string& name,
                 uint16_t items);
  // Removes `name` beneath parent (a directory with everything in it when
  // `recursive`); each removal is reported as a deletion when `report`.
  bool remove(int parent, const std::string& name, const std::string& wire, bool is_dir,
              bool recursive, bool report, std::string* why);
  void touch(const std::string& dest_dir);
  void delete_extraneous();
  void deleted(const std::string& wire, bool is_dir);
  void answer(uint32_t id, const Decision& d);
  void flush_answers();
  void flush_deleted();
  int parent_fd(const std::string& dir);
  void fail(const std::string& reason);

  GeneratorConfig c_;
  MetaSync meta_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<std::byte>> queue_;
  uint64_t listed_ = 0;    // entries received (control thread)
  uint64_t answered_ = 0;  // entries answered (generator thread)
  bool list_end_ = false;
  bool stop_ = false;
  bool finished_ = false;
  bool failed_ = false;

  // Generator thread only.
  uint32_t last_id_ = 0;
  Writer wants_;
  uint32_t wants_count_ = 0;
  Writer deleted_;
  uint32_t deleted_count_ = 0;
  std::string parent_path_;
  int parent_ = -1;
  std::string deciding_dir_;  // the destination directory of the entry decided
  std::unordered_set<std::string> listed_paths_;  // destination paths
  mutable std::mutex files_mu_;                   // files_: shared with the writer
  std::unordered_set<std::string> files_;         // destination paths of listed files
  std::vector<std::pair<std::string, std::string>> listed_dirs_;  // wire, destination
  std::unordered_map<std::string, DirTime> kept_dirs_;            // destination
  std::unordered_set<std::string> touched_;                       // destination dirs
  std::thread thread_;
};

}  // namespace rdmakit::cp
