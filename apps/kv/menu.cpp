#include "menu.hpp"

#include <chrono>
#include <sstream>

#include "fmt/format.h"

namespace rdmakit::kv {
namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

bool prompt(std::istream& in, std::ostream& out, const char* text, std::string* line) {
  out << text << ' ' << std::flush;
  if (!std::getline(in, *line)) return false;
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return true;
}

// Prints the outcome of one request; true unless the server refused it.
bool report(std::ostream& out, const char* what, std::string_view key, KvStatus s,
            const std::string& detail, double us, bool quiet) {
  if (!quiet)
    out << fmt::format("{} '{}' -> {} ({:.1f} us)\n", what, key, kv_status_name(s), us);
  if (s != KvStatus::kOk && s != KvStatus::kNotFound) {
    out << fmt::format("error: {} '{}': {}{}{}\n", what, key, kv_status_name(s),
                       detail.empty() ? "" : ": ", detail);
    return false;
  }
  return true;
}

bool do_put(Client& c, std::string_view key, std::string_view value, std::ostream& out,
            bool quiet) {
  std::string why;
  const auto t0 = Clock::now();
  const KvStatus s = c.put(key, value, &why);
  const bool ok = report(out, "PUT", key, s, why, micros_since(t0), quiet);
  if (ok) out << "stored\n";
  return ok;
}

bool do_get(Client& c, std::string_view key, GetMode mode, std::ostream& out,
            bool quiet) {
  std::string value;
  std::string why;
  const auto t0 = Clock::now();
  const KvStatus s = c.get(key, &value, mode, &why);
  const bool ok = report(out, mode == GetMode::kRead ? "GET(READ)" : "GET(RPC)", key, s,
                         why, micros_since(t0), quiet);
  if (s == KvStatus::kOk) out << "value: " << value << '\n';
  if (s == KvStatus::kNotFound) out << "key not found\n";
  return ok;
}

bool do_del(Client& c, std::string_view key, std::ostream& out, bool quiet) {
  std::string why;
  const auto t0 = Clock::now();
  const KvStatus s = c.del(key, &why);
  const bool ok = report(out, "DEL", key, s, why, micros_since(t0), quiet);
  if (s == KvStatus::kOk) out << "deleted\n";
  if (s == KvStatus::kNotFound) out << "key not found\n";
  return ok;
}

}  // namespace

int run_menu(Client& client, std::istream& in, std::ostream& out, bool quiet) {
  std::string choice;
  std::string key;
  std::string value;
  for (;;) {
    out << "\n0 - disconnect and quit\n1 - set a key/value pair\n2 - query a key by RPC\n"
           "3 - query a key by RDMA READ\n";
    if (!prompt(in, out, "Enter choice:", &choice)) break;
    if (choice == "0") break;
    if (choice == "1") {
      if (!prompt(in, out, "Enter key:", &key) ||
          !prompt(in, out, "Enter value:", &value))
        break;
      do_put(client, key, value, out, quiet);
    } else if (choice == "2" || choice == "3") {
      if (!prompt(in, out, "Enter key:", &key)) break;
      do_get(client, key, choice == "2" ? GetMode::kRpc : GetMode::kRead, out, quiet);
    } else if (!choice.empty()) {
      out << "unknown choice '" << choice << "' (0, 1, 2 or 3)\n";
    }
  }
  out << "bye\n";
  return 0;
}

bool run_command(Client& client, const std::vector<std::string>& words,
                 GetMode default_mode, std::ostream& out, bool quiet) {
  const std::string& cmd = words.empty() ? std::string() : words[0];
  if (cmd == "put" && words.size() == 3)
    return do_put(client, words[1], words[2], out, quiet);
  if ((cmd == "get" || cmd == "getr" || cmd == "getrpc") && words.size() == 2) {
    const GetMode mode = cmd == "getr"     ? GetMode::kRead
                         : cmd == "getrpc" ? GetMode::kRpc
                                           : default_mode;
    return do_get(client, words[1], mode, out, quiet);
  }
  if (cmd == "del" && words.size() == 2) return do_del(client, words[1], out, quiet);
  out << "error: usage: put KEY VALUE | get KEY | getr KEY | getrpc KEY | del KEY\n";
  return false;
}

int run_commands(Client& client, std::istream& in, GetMode default_mode,
                 std::ostream& out, bool quiet) {
  std::string line;
  int status = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream words(line);
    std::vector<std::string> w;
    std::string word;
    if (!(words >> word) || word[0] == '#') continue;
    w.push_back(word);
    if (word == "put") {
      std::string key;
      words >> key;
      std::string rest;
      std::getline(words, rest);
      const size_t start = rest.find_first_not_of(' ');
      w.push_back(key);
      w.push_back(start == std::string::npos ? std::string() : rest.substr(start));
    } else {
      while (words >> word) w.push_back(word);
    }
    if (!run_command(client, w, default_mode, out, quiet)) status = 1;
  }
  return status;
}

}  // namespace rdmakit::kv
