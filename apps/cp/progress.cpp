#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

namespace rdmakit::cp {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

Progress::Progress(const Report& report, bool enabled)
    : report_(report), start_(std::chrono::steady_clock::now()) {
  if (enabled && ::isatty(STDERR_FILENO)) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() { stop(); }

void Progress::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    std::fprintf(stderr, "\r\033[K");
  }
}

void Progress::loop() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double done = static_cast<double>(report_.bytes_done.load());
    const double total = static_cast<double>(report_.total_bytes.load());
    const double rate = secs > 0 ? done / secs : 0;
    std::string eta = "--:--";
    if (rate > 0 && total >= done) {
      const auto left = static_cast<long>((total - done) / rate);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%ld:%02ld", left / 60, left % 60);
      eta = buf;
    }
    std::fprintf(stderr, "\r\033[K%s / %s  %lu/%lu files  %s/s  ETA %s",
                 human_bytes(done).c_str(), human_bytes(total).c_str(),
                 static_cast<unsigned long>(report_.files_done.load()),
                 static_cast<unsigned long>(report_.total_files.load()),
                 human_bytes(rate).c_str(), eta.c_str());
    std::fflush(stderr);
  }
}

void print_summary(const Report& report, const SummaryInfo& info, bool json) {
  const auto errors = report.errors();
  const double bytes = static_cast<double>(report.bytes_done.load());
  const double rate = info.seconds > 0 ? bytes / info.seconds : 0;
  if (json) {
    nlohmann::json j;
    j["ok"] = report.worst() == Failure::kNone;
    j["exit_code"] = report.exit_code();
    j["failure"] = failure_name(report.worst());
    j["direction"] = info.direction;
    j["provider"] = info.provider;
    j["peer"] = info.peer;
    j["files"] = report.files_done.load();
    j["files_total"] = report.total_files.load();
    j["files_skipped"] = report.files_skipped.load();
    j["bytes"] = report.bytes_done.load();
    j["bytes_sent"] = report.bytes_sent.load();
    j["chunks"] = report.chunks.load();
    j["chunks_resent"] = report.chunks_resent.load();
    j["seconds"] = info.seconds;
    j["bytes_per_second"] = rate;
    j["errors"] = nlohmann::json::array();
    for (const FileError& e : errors)
      j["errors"].push_back(
          {{"class", failure_name(e.kind)}, {"path", e.path}, {"reason", e.reason}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("rdmakit-cp: %s %s %s (%s): %lu files, %s in %.2f s (%s/s)",
              info.direction.c_str(), info.direction == "push" ? "to" : "from",
              info.peer.c_str(), info.provider.c_str(),
              static_cast<unsigned long>(report.files_done.load()),
              human_bytes(bytes).c_str(), info.seconds, human_bytes(rate).c_str());
  if (report.files_skipped.load() > 0)
    std::printf(", %lu already complete",
                static_cast<unsigned long>(report.files_skipped.load()));
  if (report.chunks_resent.load() > 0)
    std::printf(", %lu chunks re-sent",
                static_cast<unsigned long>(report.chunks_resent.load()));
  if (!errors.empty())
    std::printf(", %zu errors (%s)", errors.size(), failure_name(report.worst()));
  std::printf("\n");
}

}  // namespace rdmakit::cp
