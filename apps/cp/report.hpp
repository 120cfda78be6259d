#pragma once
// What a transfer did: counters shared by sender, receiver and the progress
// display, the per-file errors, and the exit code they map to.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace rdmakit::cp {

// Failure classes, in increasing severity; the exit code is the worst one.
enum class Failure : uint8_t {
  kNone = 0,
  kUsage = 1,    // bad command line, local setup
  kFile = 2,     // some files failed (not found, permission, no space, I/O)
  kVerify = 3,   // a file or chunk did not verify (re-sends exhausted)
  kRefused = 4,  // the server refused a path (escape from its root)
  kPeer = 5,     // connection failed, peer gone, protocol error
};
const char* failure_name(Failure f) noexcept;
// errno -> class for file errors.
Failure classify_errno(int err) noexcept;

struct FileError {
  Failure kind;
  std::string path;
  std::string reason;
};

class Report {
 public:
  void error(Failure kind, std::string path, std::string reason);
  // Merge a class without a file (e.g. peer gone).
  std::vector<FileError> errors() const;
  Failure worst() const;
  int exit_code() const { return static_cast<int>(worst()); }
  // -i / -v at the client: what changes, one line each, on stdout.
  void show_items(bool itemize, bool names) {
    itemize_ = itemize;
    names_ = names;
  }
  bool showing_items() const { return itemize_ || names_; }
  // `line` is item_line()'s; `name` the plain name printed by -v alone.
  void item(const std::string& line, const std::string& name);

  // --progress (rsync's): each file's name when it starts and a line when
  // it is done; a progress thread redraws the current file's line.
  void show_file_progress(bool on) { file_progress_ = on; }
  bool file_progress() const { return file_progress_; }
  void file_started(const std::string& path, uint64_t size);
  void file_finished();
  struct Current {
    std::string path;  // empty: none
    uint64_t size = 0;
    uint64_t bytes_at_start = 0;
    double seconds_at_start = 0;
  };
  Current current() const;
  // Writes a line (or a redraw starting with '\r') to stdout, whole.
  void print(const std::string& text) const;
  double seconds() const;  // since the report was made

  std::atomic<uint64_t> total_files{0};
  std::atomic<uint64_t> total_bytes{0};
  std::atomic<uint64_t> files_done{0};
  std::atomic<uint64_t> bytes_done{0};     // bytes of files verified or skipped
  std::atomic<uint64_t> bytes_sent{0};     // data bytes that crossed the network
  std::atomic<uint64_t> files_skipped{0};  // up to date: nothing sent
  std::atomic<uint64_t> files_listed{0};   // entries the receiver compared
  std::atomic<uint64_t> files_deleted{0};  // --delete
  std::atomic<uint64_t> bytes_matched{0};  // delta: blocks the receiver had
  std::atomic<uint64_t> bytes_listed{0};   // sizes of the listed files
  std::atomic<uint64_t> dirs_listed{0};
  std::atomic<uint64_t> links_listed{0};   // symlinks
  std::atomic<uint64_t> files_created{0};  // files new at the destination
  std::atomic<uint64_t> files_transferred{0};
  std::atomic<uint64_t> bytes_transferred{0};  // sizes of the files transferred
  std::atomic<uint64_t> entries_answered{0};   // listed entries decided
  std::atomic<uint64_t> bytes_skipped{0};      // sizes of the files up to date
  std::atomic<uint64_t> chunks{0};
  std::atomic<uint64_t> chunks_resent{0};

 private:
  mutable std::mutex mu_;
  std::vector<FileError> errors_;
  Failure worst_ = Failure::kNone;
  bool itemize_ = false;
  bool names_ = false;
  bool file_progress_ = false;
  Current current_;
  mutable std::mutex print_mu_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A name or reason as it may be shown on a terminal: control bytes (a
// peer's escape sequences) become "\#ooo", as rsync shows them.
std::string printable(std::string_view text);
// 1234567 -> "1,234,567".
std::string with_commas(uint64_t n);
// rsync's progress line (--progress, --info=progress2), starting with '\r'.
std::string progress_line(uint64_t bytes, int percent, uint64_t done, double seconds,
                          uint64_t transfers, uint64_t to_check, uint64_t total);

}  // namespace rdmakit::cp
