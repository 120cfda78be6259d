// The rdmakit-kv tool as a user runs it: a server process, one-shot client
// commands, the lab's menu through stdin and through a pseudo-terminal, and
// commands from stdin, on every provider under test.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "kv_test_util.hpp"

namespace rdmakit::kv::test {
namespace {

using Clock = std::chrono::steady_clock;

// A `rdmakit-kv server` child on an ephemeral port, read from its log line.
class ServerProcess {
 public:
  explicit ServerProcess(const std::string& provider) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      execl(RDMAKIT_KV_BINARY, RDMAKIT_KV_BINARY, "server", "--bind", "127.0.0.1", "-p",
            "0", "--provider", provider.c_str(), "--capacity", "1000",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (port_ == 0 && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      log_.append(buf, static_cast<size_t>(n));
      const size_t at = log_.find("listening on 127.0.0.1:");
      if (at != std::string::npos) port_ = std::atoi(log_.c_str() + at + 23);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }
  const std::string& log() const { return log_; }
  // SIGTERM: the server stops cleanly; returns its exit status.
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  std::string log_;
};

struct CliRun {
  int status;
  std::string out;
};

// Runs `rdmakit-kv client ARGS` with `input` on stdin; stdout+stderr back.
CliRun client(const std::string& provider, int port, const std::string& args,
              const std::string& input = "") {
  // input is printf's format: "\\n" for newlines, no quotes or percent signs.
  const std::string cmd =
      "printf '" + input + "' | timeout 20 " RDMAKIT_KV_BINARY " client -p " +
      std::to_string(port) + " --provider " + provider + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  CliRun r{-1, {}};
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

size_t count(const std::string& s, const std::string& what) {
  size_t c = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++c;
  return c;
}

class KvCliTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Providers, KvCliTest, ::testing::ValuesIn(kv_providers()));

TEST_P(KvCliTest, OneShotMenuAndStdinCommands) {
  if (GetParam() == "verbs") GTEST_SKIP() << "the CLI is exercised on shm and tcp";
  ServerProcess server(GetParam());
  ASSERT_NE(server.port(), 0) << server.log();
  const std::string p = GetParam();

  CliRun r = client(p, server.port(), "-q put 5 500");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("stored"), std::string::npos) << r.out;
  r = client(p, server.port(), "get 5");
  EXPECT_NE(r.out.find("value: 500"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GET(RPC) '5' -> OK"), std::string::npos) << r.out;  // not quiet
  r = client(p, server.port(), "-q --get read get 5");
  EXPECT_NE(r.out.find("value: 500"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("GET(READ)"), std::string::npos) << r.out;  // quiet
  r = client(p, server.port(), "-q del 5");
  EXPECT_NE(r.out.find("deleted"), std::string::npos) << r.out;
  r = client(p, server.port(), "-q getr 5");
  EXPECT_NE(r.out.find("key not found"), std::string::npos) << r.out;
  r = client(p, server.port(), "-q put " + std::string(300, 'k') + " v");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("KEY_TOO_LONG"), std::string::npos) << r.out;

  // The lab's menu through stdin, with -i (inline sends).
  r = client(p, server.port(), "-q -i",
             "1\\n42\\n4242\\n2\\n42\\n3\\n42\\n3\\n43\\n7\\n0\\n");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 - set a key/value pair"), std::string::npos) << r.out;
  EXPECT_EQ(count(r.out, "Enter key:"), 4u) << r.out;
  EXPECT_EQ(count(r.out, "Enter value:"), 1u) << r.out;
  EXPECT_EQ(count(r.out, "value: 4242"), 2u) << r.out;
  EXPECT_NE(r.out.find("key not found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown choice '7'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bye"), std::string::npos) << r.out;

  // Commands from stdin; values may hold spaces.
  r = client(p, server.port(), "-q -",
             "put a b c d\\ngetr a\\nget 42\\ndel a\\nget a\\nbogus\\n");
  EXPECT_EQ(r.status, 1) << r.out;  // the bogus line
  EXPECT_NE(r.out.find("value: b c d"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("value: 4242"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("key not found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("usage"), std::string::npos) << r.out;

  EXPECT_EQ(server.stop(), 0);
  // Nobody listening: a clear error, not a hang.
  r = client(p, server.port(), "get 1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("rdmakit-kv:"), std::string::npos) << r.out;
}

// Reads from fd until `want` shows up (or 10 s pass); returns all read.
std::string read_until(int fd, const std::string& want, std::string* all) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (all->find(want) == std::string::npos && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[1024];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    all->append(buf, static_cast<size_t>(n));
  }
  return *all;
}

TEST_P(KvCliTest, MenuOnAPseudoTerminal) {
  if (GetParam() == "verbs") GTEST_SKIP() << "the CLI is exercised on shm and tcp";
  ServerProcess server(GetParam());
  ASSERT_NE(server.port(), 0) << server.log();
  int master = -1;
  const std::string port = std::to_string(server.port());
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(RDMAKIT_KV_BINARY, RDMAKIT_KV_BINARY, "client", "-p", port.c_str(),
          "--provider", GetParam().c_str(), "-q", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string out;
  auto say = [&](const std::string& line) {
    ASSERT_EQ(write(master, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  };
  read_until(master, "Enter choice:", &out);
  say("1\n");
  read_until(master, "Enter key:", &out);
  say("tty-key\n");
  read_until(master, "Enter value:", &out);
  say("tty value\n");
  read_until(master, "stored", &out);
  say("3\n");
  out.clear();
  read_until(master, "Enter key:", &out);
  say("tty-key\n");
  read_until(master, "value: tty value", &out);
  EXPECT_NE(out.find("value: tty value"), std::string::npos) << out;
  say("0\n");
  read_until(master, "bye", &out);
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
}

// The children of a process, from /proc/<pid>/stat's parent field.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
    std::string stat;
    std::getline(f, stat);
    const size_t paren = stat.rfind(')');  // the name may hold spaces
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == parent)
      out.push_back(pid);
  }
  closedir(d);
  return out;
}

// User plus system CPU time of a process, in clock ticks.
long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  // Fields after the name: state(3) ... utime(14) stime(15).
  std::istringstream in(stat.substr(paren + 2));
  std::string field;
  long utime = 0;
  long stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::atol(field.c_str());
    if (i == 15) stime = std::atol(field.c_str());
  }
  return utime + stime;
}

// `rdmakit-kv bench` whose server (its forked child) is SIGKILLed mid-run:
// the bench ends with an error naming the failed request, the server and the
// provider, within its 10 s client timeout, and does not hang.
TEST_P(KvCliTest, BenchFailsClearlyWhenItsServerIsKilledMidRun) {
  if (GetParam() == "verbs") GTEST_SKIP() << "the bench is run on shm and tcp";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t bench = fork();
  ASSERT_GE(bench, 0);
  if (bench == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    execl(RDMAKIT_KV_BINARY, RDMAKIT_KV_BINARY, "bench", "--provider", GetParam().c_str(),
          "-n", "50000000", "-t", "2", "--server-cpu", "-1", "--client-cpu", "-1",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  // Mid-run: the server has served requests for a while (200 ms of its CPU
  // time; the bench runs for minutes at -n 50M). Sanitizer builds start slowly.
  std::vector<pid_t> kids;
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kids = children_of(bench);
    if (kids.size() == 1 && cpu_ticks(kids[0]) >= sysconf(_SC_CLK_TCK) / 5) break;
  }
  ASSERT_EQ(kids.size(), 1u) << "expected the bench's server as its only child";
  ASSERT_GE(cpu_ticks(kids[0]), sysconf(_SC_CLK_TCK) / 5)
      << "the bench's server never served";
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(kids[0], SIGKILL), 0);
  std::string out;
  int status = 0;
  bool exited = false;
  while (Clock::now() - t0 < std::chrono::seconds(30)) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0) out.append(buf, static_cast<size_t>(n));
    }
    if (waitpid(bench, &status, WNOHANG) == bench) {
      exited = true;
      break;
    }
  }
  const auto took = Clock::now() - t0;
  if (!exited) {
    kill(bench, SIGKILL);
    waitpid(bench, &status, 0);
  }
  close(fds[0]);
  ASSERT_TRUE(exited) << "the bench hung after its server died:\n" << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_LT(took, std::chrono::seconds(25));
  EXPECT_NE(out.find("rdmakit-kv bench: rdmakit-kv: "), std::string::npos) << out;
  EXPECT_NE(out.find("provider " + GetParam()), std::string::npos) << out;
  std::printf("[ kv      ] %s: bench after its server's SIGKILL, %.1f s: %s",
              GetParam().c_str(), std::chrono::duration<double>(took).count(),
              out.c_str());
}

}  // namespace
}  // namespace rdmakit::kv::test
