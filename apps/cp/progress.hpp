#pragma once
// The progress line on a terminal (bytes, files, rate, ETA; nothing when
// stderr is not a tty), the final summary and the --json summary.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "report.hpp"

namespace rdmakit::cp {

class Progress {
 public:
  // Shows a line on stderr every 250 ms when `enabled` and stderr is a tty.
  Progress(const Report& report, bool enabled);
  ~Progress();
  void stop();

 private:
  void loop();
  const Report& report_;
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
  double seconds = 0;
};

// Prints the summary (text or JSON) to stdout.
void print_summary(const Report& report, const SummaryInfo& info, bool json);

std::string human_bytes(double bytes);

}  // namespace rdmakit::cp
