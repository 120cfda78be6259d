#pragma once
// Reads the statistics files preloaded processes publish
// (src/preload/stat_format.hpp). Every file is hostile input: it may belong
// to another user, who can write anything into it, and it may change while
// it is read. A file is copied whole, then every size and count is checked
// against the layout this tool knows; strings are cut at their arrays' ends.
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmakit::stat_tool {

struct Connection {
  int fd = -1;
  std::string side;   // connect | accept
  std::string path;   // shm | verbs | tcp | kernel
  std::string state;  // live | closed
  std::string local;
  std::string peer;
  std::string reason;  // path kernel: why
  bool counted = false;
  uint64_t tx_bytes = 0, tx_msgs = 0, rx_bytes = 0, rx_msgs = 0, rx_peak = 0;
  uint32_t ring_bytes = 0;
  double age_s = 0;  // since the decision (closed: until the close)
};

struct Reason {
  std::string text;
  uint64_t count = 0;
};

struct Process {
  pid_t pid = 0;
  uid_t uid = 0;
  std::string program;
  std::string file;
  uint64_t upgrades_shm = 0, upgrades_remote = 0, fallbacks = 0, unlisted = 0;
  uint64_t reasons_other = 0;
  std::vector<Reason> reasons;
  // Totals of every connection of the process: closed ones plus live ones.
  uint64_t tx_bytes = 0, rx_bytes = 0, tx_msgs = 0, rx_msgs = 0;
  std::vector<Connection> connections;  // live, and closed ones still in their slot
};

struct Skipped {
  std::string file;
  std::string why;
};

struct Snapshot {
  std::vector<Process> processes;
  std::vector<Skipped> skipped;      // unreadable or invalid files
  std::vector<std::string> removed;  // stale files of dead processes, removed
};

struct ScanOptions {
  std::string dir;
  std::vector<pid_t> pids;  // empty: all
  bool clean = true;        // remove the caller's stale files
};

Snapshot scan(const ScanOptions& opts);
// One file; nullopt with *why when it is invalid (or *stale when its
// process is gone).
std::optional<Process> read_file(const std::string& path, std::string* why, bool* stale);

}  // namespace rdmakit::stat_tool
