#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
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

Progress::Progress(const Report& report, ProgressMode mode)
    : report_(report), mode_(mode), start_(std::chrono::steady_clock::now()) {
  if (mode_ == ProgressMode::kTerminal && !::isatty(STDERR_FILENO))
    mode_ = ProgressMode::kNone;
  if (mode_ != ProgressMode::kNone) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() { stop(); }

void Progress::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  thread_.join();
  if (mode_ == ProgressMode::kTerminal) std::fprintf(stderr, "\r\033[K");
  if (mode_ == ProgressMode::kOverall) draw_overall(true);
}

void Progress::loop() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    switch (mode_) {
      case ProgressMode::kTerminal: draw_terminal(secs); break;
      case ProgressMode::kOverall: draw_overall(false); break;
      case ProgressMode::kPerFile: {
        const Report::Current c = report_.current();
        if (c.path.empty()) break;
        const uint64_t bytes =
            std::min(report_.bytes_sent.load() - c.bytes_at_start, c.size);
        const int pct = c.size == 0 ? 100 : static_cast<int>(bytes * 100 / c.size);
        report_.print(
            progress_line(bytes, pct, bytes, report_.seconds() - c.seconds_at_start,
                          report_.files_transferred.load(),
                          report_.files_listed.load() - report_.entries_answered.load(),
                          report_.files_listed.load()));
        break;
      }
      case ProgressMode::kNone: break;
    }
  }
}

void Progress::draw_terminal(double secs) {
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

// The whole transfer: files up to date count as done, as in rsync.
void Progress::draw_overall(bool final) {
  const uint64_t done = report_.bytes_sent.load() + report_.bytes_matched.load() +
                        report_.bytes_skipped.load();
  const uint64_t total = std::max(report_.bytes_listed.load(), done);
  const int pct = total == 0 ? 100 : static_cast<int>(done * 100 / total);
  std::string line =
      progress_line(done, pct, done, report_.seconds(), report_.files_transferred.load(),
                    report_.files_listed.load() - report_.entries_answered.load(),
                    report_.files_listed.load());
  if (final) line.push_back('\n');
  report_.print(line);
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
    j["lanes"] = info.lanes;
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
  const std::string lanes =
      info.lanes > 1 ? ", " + std::to_string(info.lanes) + " lanes" : std::string();
  std::printf("rdmakit-cp: %s %s %s (%s%s): %lu files, %s in %.2f s (%s/s)",
              info.direction.c_str(), info.direction == "push" ? "to" : "from",
              info.peer.c_str(), info.provider.c_str(), lanes.c_str(),
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

void print_stats(const Report& r, const SummaryInfo& info) {
  const uint64_t files = r.files_listed.load();
  const uint64_t dirs = r.dirs_listed.load(), links = r.links_listed.load();
  std::string out;
  out += "\nNumber of files: " + with_commas(files) +
         " (reg: " + with_commas(files - dirs - links) + ", dir: " + with_commas(dirs) +
         ", link: " + with_commas(links) + ")\n";
  out += "Number of created files: " + with_commas(r.files_created.load()) + "\n";
  out += "Number of deleted files: " + with_commas(r.files_deleted.load()) + "\n";
  out +=
      "Number of regular files transferred: " + with_commas(r.files_transferred.load()) +
      "\n";
  out += "Total file size: " + with_commas(r.bytes_listed.load()) + " bytes\n";
  out += "Total transferred file size: " + with_commas(r.bytes_transferred.load()) +
         " bytes\n";
  out += "Literal data: " + with_commas(r.bytes_sent.load()) + " bytes\n";
  out += "Matched data: " + with_commas(r.bytes_matched.load()) + " bytes\n";
  char tail[160];
  const double moved = static_cast<double>(r.bytes_sent.load());
  std::snprintf(tail, sizeof tail, "Transfer time: %.3f s (%s/s over %s)\n", info.seconds,
                human_bytes(info.seconds > 0 ? moved / info.seconds : 0).c_str(),
                info.provider.c_str());
  out += tail;
  r.print(out);
}

}  // namespace rdmakit::cp
