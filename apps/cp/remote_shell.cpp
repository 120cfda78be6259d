#include "remote_shell.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <rdmakit/error.hpp>
#include <rdmakit/provider.hpp>
#include <thread>

extern char** environ;

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Numeric IPv4, or IPv6 with an optional %zone.
bool numeric_address(const std::string& a) {
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, a.c_str(), buf) == 1) return true;
  const std::string bare = a.substr(0, a.find('%'));
  return ::inet_pton(AF_INET6, bare.c_str(), buf) == 1;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

bool split_words(std::string_view text, std::vector<std::string>* words,
                 std::string* why) {
  words->clear();
  size_t i = 0;
  while (i < text.size()) {
    if (blank(text[i])) {
      ++i;
      continue;
    }
    std::string word;
    char quote = 0;
    for (; i < text.size() && (quote != 0 || !blank(text[i])); ++i) {
      const char c = text[i];
      if (quote == 0 && (c == '\'' || c == '"')) {
        quote = c;
      } else if (c == quote) {
        // A doubled quote inside quotes is the quote itself (as rsync).
        if (i + 1 < text.size() && text[i + 1] == quote) {
          word += c;
          ++i;
        } else {
          quote = 0;
        }
      } else {
        word += c;
      }
    }
    if (quote != 0) {
      *why = std::string("unbalanced ") + (quote == '"' ? "double" : "single") +
             " quote in the remote shell command: " + std::string(text);
      return false;
    }
    words->push_back(std::move(word));
  }
  if (words->empty() || (*words)[0].empty()) {
    *why = "the remote shell command is empty";
    return false;
  }
  return true;
}

Bootstrap::~Bootstrap() { ::explicit_bzero(secret.data(), secret.size()); }

std::string host_port(const std::string& address, uint16_t port) {
  if (address.find(':') != std::string::npos)
    return "[" + address + "]:" + std::to_string(port);
  return address + ":" + std::to_string(port);
}

std::string Bootstrap::endpoint() const { return host_port(address, port); }

std::string format_bootstrap(const Bootstrap& b) {
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (std::byte x : b.secret) {
    hex += digits[std::to_integer<unsigned>(x) >> 4];
    hex += digits[std::to_integer<unsigned>(x) & 15];
  }
  std::string line = std::string(kBootstrapTag) + " " +
                     std::to_string(kBootstrapVersion) + " " + b.provider + " " +
                     b.address + " " + std::to_string(b.port) + " " + hex;
  ::explicit_bzero(hex.data(), hex.size());
  return line;
}

bool parse_bootstrap(std::string_view line, Bootstrap* out, std::string* why) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::vector<std::string_view> f;
  for (size_t i = 0; i <= line.size();) {
    const size_t sp = std::min(line.find(' ', i), line.size());
    f.push_back(line.substr(i, sp - i));
    i = sp + 1;
  }
  if (f.empty() || f[0] != kBootstrapTag) {
    *why = "not a bootstrap line";
    return false;
  }
  if (f.size() < 2 || f[1] != std::to_string(kBootstrapVersion)) {
    *why = "bootstrap version " +
           (f.size() < 2 ? std::string("missing") : printable(f[1], 16)) +
           ", this rdmakit-cp speaks " + std::to_string(kBootstrapVersion) +
           " (install the same rdmakit-cp on both hosts)";
    return false;
  }
  if (f.size() != 6) {
    *why = "malformed bootstrap line: " + std::to_string(f.size()) + " fields, not 6";
    return false;
  }
  const std::string provider(f[2]), address(f[3]), port(f[4]);
  if (provider != "tcp" && provider != "verbs" && provider != "shm") {
    *why = "malformed bootstrap line: unknown provider " + printable(provider, 16);
    return false;
  }
  if (!numeric_address(address)) {
    *why = "malformed bootstrap line: not a numeric address: " + printable(address, 64);
    return false;
  }
  unsigned long p = 0;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      (p = std::strtoul(port.c_str(), nullptr, 10)) == 0 || p > 65535) {
    *why = "malformed bootstrap line: bad port " + printable(port, 16);
    return false;
  }
  const std::string_view hex = f[5];
  if (hex.size() != 2 * kBootstrapSecretBytes) {
    *why = "malformed bootstrap line: the secret is not " +
           std::to_string(2 * kBootstrapSecretBytes) + " hex digits";
    return false;
  }
  for (size_t i = 0; i < kBootstrapSecretBytes; ++i) {
    const int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      *why = "malformed bootstrap line: the secret is not hex";
      return false;
    }
    out->secret[i] = std::byte{static_cast<uint8_t>(hi * 16 + lo)};
  }
  out->provider = provider;
  out->address = address;
  out->port = static_cast<uint16_t>(p);
  return true;
}

std::string printable(std::string_view text, size_t max) {
  std::string s;
  for (char c : text.substr(0, max))
    s += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (text.size() > max) s += "...";
  return s;
}

RemoteShell::~RemoteShell() {
  if (running()) (void)finish(2s);
  if (out_ >= 0) ::close(out_);
}

bool RemoteShell::spawn(const std::vector<std::string>& argv, std::string* why) {
  name_ = base_name(argv.at(0));
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) {
    *why = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    *why = std::string("pipe: ") + std::strerror(errno);
    ::close(in[0]);
    ::close(in[1]);
    return false;
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  ::posix_spawnattr_init(&attr);
  // The client ignores SIGPIPE; ssh must not inherit that (nor a mask).
  sigset_t deflt, none;
  sigemptyset(&deflt);
  sigaddset(&deflt, SIGPIPE);
  sigemptyset(&none);
  ::posix_spawnattr_setsigdefault(&attr, &deflt);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  if (err != 0) {
    ::close(in[1]);
    ::close(out[0]);
    *why = "cannot run " + argv[0] + ": " + std::strerror(err);
    return false;
  }
  pid_ = pid;
  in_ = in[1];
  out_ = out[0];
  return true;
}

RemoteShell::Read RemoteShell::read_line(std::chrono::milliseconds timeout, size_t max,
                                         std::string* line) {
  line->clear();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Read::kTimeout;
    pollfd p{out_, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Read::kError;
    if (n == 0) continue;
    // Byte by byte: nothing after the newline is consumed (and it is short).
    char c = 0;
    const ssize_t got = ::read(out_, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Read::kError;
    if (got == 0) return Read::kEof;
    if (c == '\n') return Read::kLine;
    if (line->size() >= max) return Read::kTooLong;
    *line += c;
  }
}

std::string RemoteShell::finish(std::chrono::milliseconds grace) {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
  if (pid_ <= 0) return name_ + " already ended";
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int st = 0;
  pid_t r = 0;
  while ((r = ::waitpid(pid_, &st, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  std::string note;
  if (r == 0) {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && (r = ::waitpid(pid_, &st, WNOHANG)) == 0; ++i)
      std::this_thread::sleep_for(10ms);
    if (r == 0) {
      ::kill(pid_, SIGKILL);
      r = ::waitpid(pid_, &st, 0);
    }
    note = " (stopped: still running " + std::to_string(grace.count()) +
           " ms after its input was closed)";
  }
  pid_ = -1;
  if (r < 0) return name_ + ": waitpid: " + std::strerror(errno);
  status_ = st;
  if (WIFEXITED(st))
    return name_ + " exited with status " + std::to_string(WEXITSTATUS(st)) + note;
  if (WIFSIGNALED(st))
    return name_ + " was killed by signal " + std::to_string(WTERMSIG(st)) + " (" +
           ::strsignal(WTERMSIG(st)) + ")" + note;
  return name_ + " ended with wait status " + std::to_string(st);
}

std::string provider_between_hosts(const std::string& requested) {
  if (requested != "auto") return requested;
  if (const char* env = std::getenv("RDMAKIT_PROVIDER"); env != nullptr && *env != '\0')
    return env;
  return list_devices().auto_choice == ProviderKind::kVerbs ? "verbs" : "tcp";
}

bool remote_command(const RemoteRequest& r, std::vector<std::string>* argv,
                    std::string* why) {
  if (!split_words(r.rsh, argv, why)) return false;
  if (r.host.empty() || r.host[0] == '-') {
    // ssh would take it for an option (-oProxyCommand=...).
    *why = "host " + r.host + ": not a host name";
    return false;
  }
  if (r.program.empty()) {
    *why = "--rdmakit-path is empty";
    return false;
  }
  // With verbs here the server may pick verbs too (it falls back to tcp);
  // without, only tcp can meet us.
  std::string provider;
  try {
    provider = provider_between_hosts(r.provider);
    (void)parse_provider(provider);
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
  if (r.provider == "auto" && provider == "verbs") provider = "auto";
  argv->push_back(r.host);
  argv->push_back(r.program);
  argv->push_back("--server");
  argv->push_back(r.push ? "--push" : "--pull");
  argv->push_back("--provider");
  argv->push_back(provider);
  if (r.preserve_special) argv->push_back("--preserve-special");
  return true;
}

std::string command_text(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    if (!s.empty()) s += ' ';
    const bool quote = a.empty() || a.find_first_of(" \t\n'\"") != std::string::npos;
    s += quote ? "'" + a + "'" : a;
  }
  return s;
}

bool start_remote_server(const RemoteRequest& r, const std::vector<std::string>& argv,
                         RemoteShell* shell, Bootstrap* out, std::string* why) {
  const std::string cmd = " (command: " + command_text(argv) + ")";
  if (!shell->spawn(argv, why)) {
    *why += cmd;
    return false;
  }
  std::string line;
  const RemoteShell::Read got = shell->read_line(kRemoteStartTimeout, 256, &line);
  std::string parse_why;
  if (got == RemoteShell::Read::kLine && parse_bootstrap(line, out, &parse_why)) {
    ::explicit_bzero(line.data(), line.size());
    return true;
  }
  switch (got) {
    case RemoteShell::Read::kEof:
      if (line.empty()) {
        *why = shell->finish(5s) + " before the server answered" + cmd;
        return false;
      }
      *why =
          "the remote program ended its output without a bootstrap line; it printed \"" +
          printable(line) + "\"";
      break;
    case RemoteShell::Read::kTimeout:
      *why = "no answer from the remote server within " +
             std::to_string(kRemoteStartTimeout.count()) + " s";
      break;
    case RemoteShell::Read::kTooLong:
      *why = "the remote program printed a long line instead of a bootstrap line: \"" +
             printable(line) + "\"";
      break;
    case RemoteShell::Read::kError:
      *why = std::string("reading the remote shell's output: ") + std::strerror(errno);
      break;
    case RemoteShell::Read::kLine:
      *why = parse_why == "not a bootstrap line"
                 ? "the remote program printed \"" + printable(line) +
                       "\" instead of a bootstrap line (is " + r.program +
                       " rdmakit-cp on that host? do its shell startup files print?)"
                 : "the remote server's answer: " + parse_why;
      break;
  }
  // It is of no use now: ask it to end, and say how it ended.
  *why += "; " + shell->finish(2s) + cmd;
  return false;
}

}  // namespace rdmakit::cp
