#include "report.hpp"

#include <cerrno>
#include <cstdio>

namespace rdmakit::cp {

const char* failure_name(Failure f) noexcept {
  switch (f) {
    case Failure::kNone: return "ok";
    case Failure::kUsage: return "usage";
    case Failure::kFile: return "file";
    case Failure::kVerify: return "verify";
    case Failure::kRefused: return "refused";
    case Failure::kPeer: return "peer";
  }
  return "?";
}

Failure classify_errno(int err) noexcept {
  switch (err) {
    case EXDEV:  // openat2 RESOLVE_BENEATH: the path leaves the root
      return Failure::kRefused;
    default: return Failure::kFile;
  }
}

void Report::error(Failure kind, std::string path, std::string reason) {
  std::lock_guard lock(mu_);
  if (kind > worst_) worst_ = kind;
  std::fprintf(stderr, "rdmakit-cp: %s%s%s\n", printable(path).c_str(),
               path.empty() ? "" : ": ", printable(reason).c_str());
  errors_.push_back({kind, std::move(path), std::move(reason)});
}

void Report::item(const std::string& line, const std::string& name) {
  if (!itemize_ && !names_) return;
  std::string text = printable(itemize_ ? line : name);
  text.push_back('\n');
  print(text);
}

void Report::print(const std::string& text) const {
  std::lock_guard lock(print_mu_);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

double Report::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Report::file_started(const std::string& path, uint64_t size) {
  if (!file_progress_) return;
  {
    std::lock_guard lock(mu_);
    current_ = Current{path, size, bytes_sent.load(), seconds()};
  }
  std::string line = printable(path);
  line.push_back('\n');
  print(line);
}

void Report::file_finished() {
  if (!file_progress_) return;
  Current c;
  {
    std::lock_guard lock(mu_);
    c = std::move(current_);
    current_ = Current{};
  }
  if (c.path.empty()) return;
  std::string line = progress_line(
      c.size, 100, c.size, seconds() - c.seconds_at_start, files_transferred.load(),
      files_listed.load() - entries_answered.load(), files_listed.load());
  line.push_back('\n');
  print(line);
}

Report::Current Report::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out.push_back(ch);
      continue;
    }
    char esc[8];
    std::snprintf(esc, sizeof esc, "\\#%03o", c);
    out.append(esc);
  }
  return out;
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string progress_line(uint64_t bytes, int percent, uint64_t done, double seconds,
                          uint64_t transfers, uint64_t to_check, uint64_t total) {
  // rsync's: bytes, percent, rate (decimal units), elapsed time or ETA,
  // and the transfer count with the entries still to check.
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  const char* unit = "kB/s";
  double shown = rate / 1e3;
  if (rate >= 1e9) {
    shown = rate / 1e9;
    unit = "GB/s";
  } else if (rate >= 1e6) {
    shown = rate / 1e6;
    unit = "MB/s";
  }
  const auto t = static_cast<long>(seconds);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "\r%15s %3d%% %7.2f%s %4ld:%02ld:%02ld (xfr#%lu, to-chk=%lu/%lu)",
                with_commas(bytes).c_str(), percent, shown, unit, t / 3600, t / 60 % 60,
                t % 60, static_cast<unsigned long>(transfers),
                static_cast<unsigned long>(to_check), static_cast<unsigned long>(total));
  return buf;
}

std::vector<FileError> Report::errors() const {
  std::lock_guard lock(mu_);
  return errors_;
}

Failure Report::worst() const {
  std::lock_guard lock(mu_);
  return worst_;
}

}  // namespace rdmakit::cp
