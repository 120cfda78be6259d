#pragma once
// The progress line on a terminal (bytes, files, rate, ETA; nothing when
// stderr is not a tty), the final summary and the --json summary.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "report.hpp"

namespace rdmakit::cp {

enum class ProgressMode : uint8_t {
  kNone,      // -q, --json
  kTerminal,  // the default: a line on stderr when it is a terminal
  kPerFile,   // --progress: rsync's line per file, on stdout
  kOverall,   // --info=progress2: rsync's line for the whole transfer
};

class Progress {
 public:
  // Redraws its line every 250 ms.
  Progress(const Report& report, ProgressMode mode);
  ~Progress();
  void stop();

 private:
  void loop();
  void draw_terminal(double secs);
  void draw_overall(bool final);
  const Report& report_;
  ProgressMode mode_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct SummaryInfo {
  std::string direction;  // push / pull
  std::string provider;
  std::string peer;
  uint32_t lanes = 1;  // connections the data went over (--lanes)
  double seconds = 0;
};

// Prints the summary (text or JSON) to stdout.
void print_summary(const Report& report, const SummaryInfo& info, bool json);
// --stats: rsync's counts of what the transfer listed, made and moved.
void print_stats(const Report& report, const SummaryInfo& info);

std::string human_bytes(double bytes);

}  // namespace rdmakit::cp
