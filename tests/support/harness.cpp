#include "harness.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void config_error(const std::string& what) {
  std::fprintf(stderr, "rdmakit test harness: %s\n", what.c_str());
  std::exit(2);
}

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : fallback;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::string host_port(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Reads exactly len bytes within timeout; false on EOF, error or timeout.
bool read_exact(int fd, void* buf, size_t len, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto* out = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::read(fd, out + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

struct Child {
  std::string role;
  pid_t pid = -1;
  bool may_be_killed = false;
  bool done = false;
  bool timed_out = false;
  int status = 0;
};

[[noreturn]] void run_child(const std::string& role, const RoleFn& fn, RoleEnv& env,
                            const std::string& netns) {
  {
    SCOPED_TRACE(role + " role");
    try {
      if (!netns.empty()) {
        const std::string path = "/var/run/netns/" + netns;
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
          ADD_FAILURE() << "cannot enter network namespace " << path << ": "
                        << std::strerror(errno);
          std::fflush(nullptr);
          _exit(1);
        }
        ::close(fd);
      }
      fn(env);
    } catch (const std::exception& e) {
      ADD_FAILURE() << role << " role threw: " << e.what();
    } catch (...) {
      ADD_FAILURE() << role << " role threw a non-standard exception";
    }
  }
  const bool failed = ::testing::Test::HasFailure();
  std::fflush(nullptr);
  // _exit: the child must not run the parent's gtest teardown or atexit.
  _exit(failed ? 1 : 0);
}

}  // namespace

const HarnessConfig& HarnessConfig::get() {
  static const HarnessConfig config = [] {
    HarnessConfig c;
    c.providers = split_commas(env_or("RDMAKIT_TEST_PROVIDERS", "shm"));
    if (c.providers.empty()) config_error("RDMAKIT_TEST_PROVIDERS is empty");
    const std::string role = env_or("RDMAKIT_TEST_ROLE", "");
    if (role.empty()) {
      c.mode = RoleMode::kFork;
    } else if (role == "server") {
      c.mode = RoleMode::kServer;
    } else if (role == "client") {
      c.mode = RoleMode::kClient;
    } else {
      config_error("RDMAKIT_TEST_ROLE must be server, client or unset, not '" + role +
                   "'");
    }
    c.host = env_or("RDMAKIT_TEST_HOST", "127.0.0.1");
    const std::string base = env_or("RDMAKIT_TEST_BASE_PORT", "");
    if (!base.empty()) {
      char* end = nullptr;
      const long port = std::strtol(base.c_str(), &end, 10);
      if (*end != '\0' || port < 1 || port > 65000) {
        config_error("RDMAKIT_TEST_BASE_PORT must be 1..65000, not '" + base + "'");
      }
      c.base_port = static_cast<uint16_t>(port);
    } else if (c.mode != RoleMode::kFork) {
      // Both invocations must agree without talking: derive from the uid
      // (usually the same user on both hosts), away from ephemeral ports.
      c.base_port = static_cast<uint16_t>(30000 + (::getuid() % 200) * 128);
    }
    c.server_netns = env_or("RDMAKIT_TEST_SERVER_NETNS", "");
    const std::string scale = env_or("RDMAKIT_TEST_TIMEOUT_SCALE", "1");
    char* scale_end = nullptr;
    c.timeout_scale = std::strtod(scale.c_str(), &scale_end);
    if (*scale_end != '\0' || !(c.timeout_scale >= 1.0 && c.timeout_scale <= 100.0)) {
      config_error("RDMAKIT_TEST_TIMEOUT_SCALE must be a number in 1..100, not '" +
                   scale + "'");
    }
    return c;
  }();
  return config;
}

milliseconds scaled(milliseconds guard) {
  return milliseconds(static_cast<int64_t>(static_cast<double>(guard.count()) *
                                           HarnessConfig::get().timeout_scale));
}

std::vector<std::string> providers_from_env() { return HarnessConfig::get().providers; }

int current_case_index() {
  const auto* unit = ::testing::UnitTest::GetInstance();
  const auto* current = unit->current_test_info();
  if (current == nullptr) return 0;
  std::vector<std::string> names;
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j) {
      names.push_back(std::string(suite->name()) + "." + suite->GetTestInfo(j)->name());
    }
  }
  std::sort(names.begin(), names.end());
  const std::string me = std::string(current->test_suite_name()) + "." + current->name();
  const auto it = std::find(names.begin(), names.end(), me);
  return static_cast<int>(it - names.begin());
}

RoleEnv::RoleEnv(std::string provider, bool server, int client_index, int clients,
                 uint16_t port, int port_read_fd, int port_write_fd)
    : provider_(std::move(provider)),
      server_(server),
      client_index_(client_index),
      clients_(clients),
      port_(port),
      port_read_fd_(port_read_fd),
      port_write_fd_(port_write_fd) {}

RoleEnv::~RoleEnv() {
  if (port_read_fd_ >= 0) ::close(port_read_fd_);
  if (port_write_fd_ >= 0) ::close(port_write_fd_);
}

ProviderKind RoleEnv::kind() const { return parse_provider(provider_); }

std::unique_ptr<Context> RoleEnv::open_context() const {
  ContextOptions options;
  options.provider = kind();
  return Context::open(options);
}

std::string RoleEnv::listen_address() const {
  return host_port(HarnessConfig::get().host, port_);
}

std::unique_ptr<Listener> RoleEnv::listen(Context& ctx) {
  auto listener = ctx.listen(listen_address());
  publish_port(listener->port());
  return listener;
}

void RoleEnv::publish_port(uint16_t port) {
  if (port_write_fd_ < 0) return;
  // One 2-byte record per client; pipe writes this small are atomic.
  for (int i = 0; i < clients_; ++i) {
    const uint8_t record[2] = {static_cast<uint8_t>(port >> 8),
                               static_cast<uint8_t>(port & 0xFF)};
    if (::write(port_write_fd_, record, sizeof record) != sizeof record) {
      ADD_FAILURE() << "cannot announce the port: " << std::strerror(errno);
    }
  }
  ::close(port_write_fd_);
  port_write_fd_ = -1;
}

std::string RoleEnv::server_address() {
  if (!server_address_.empty()) return server_address_;
  uint16_t port = port_;
  if (port_read_fd_ >= 0) {
    uint8_t record[2];
    if (!read_exact(port_read_fd_, record, sizeof record,
                    scaled(std::chrono::seconds(30)))) {
      throw std::runtime_error(
          "the server role did not announce its port (it failed or hung)");
    }
    port = static_cast<uint16_t>((record[0] << 8) | record[1]);
    ::close(port_read_fd_);
    port_read_fd_ = -1;
  }
  server_address_ = host_port(HarnessConfig::get().host, port);
  return server_address_;
}

std::unique_ptr<QueuePair> RoleEnv::connect(Context& ctx, const QpOptions& options,
                                            std::span<const std::byte> private_data,
                                            milliseconds timeout) {
  const std::string address = server_address();
  const bool split = HarnessConfig::get().mode != RoleMode::kFork;
  const auto deadline = Clock::now() + scaled(std::chrono::seconds(60));
  for (;;) {
    try {
      return ctx.connect(address, options, private_data, timeout);
    } catch (const Error& e) {
      if (!split || e.sys_errno() != ECONNREFUSED || Clock::now() > deadline) {
        throw;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
}

void run_roles(const std::string& provider, const RoleFn& server, const RoleFn& client,
               const RunOptions& options) {
  const HarnessConfig& config = HarnessConfig::get();
  const int index = current_case_index();
  uint16_t port = 0;
  if (config.base_port != 0) {
    const int wanted = config.base_port + index;
    ASSERT_LE(wanted, 65535) << "RDMAKIT_TEST_BASE_PORT too high for " << index
                             << " cases";
    port = static_cast<uint16_t>(wanted);
  }
  const bool fork_mode = config.mode == RoleMode::kFork;
  const bool run_server = config.mode != RoleMode::kClient;
  const bool run_client = config.mode != RoleMode::kServer;

  int pipe_fds[2] = {-1, -1};
  if (fork_mode) {
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0) << std::strerror(errno);
  }

  // Unflushed output would be printed once more by every child.
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  std::vector<Child> children;
  auto spawn = [&](const std::string& role, bool is_server, int client_index,
                   const RoleFn& fn, bool may_be_killed) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed: " << std::strerror(errno);
      return;
    }
    if (pid == 0) {
      // Die with the parent (e.g. ctest timeout) instead of lingering.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(1);
      int read_fd = -1;
      int write_fd = -1;
      if (is_server) {
        write_fd = pipe_fds[1];
        if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
      } else {
        read_fd = pipe_fds[0];
        if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
      }
      RoleEnv env(provider, is_server, client_index, options.clients, port, read_fd,
                  write_fd);
      run_child(role, fn, env, (is_server && fork_mode) ? config.server_netns : "");
    }
    Child child;
    child.role = role;
    child.pid = pid;
    child.may_be_killed = may_be_killed;
    children.push_back(child);
  };
  if (run_server) spawn("server", true, 0, server, options.server_may_be_killed);
  if (run_client) {
    for (int i = 0; i < options.clients; ++i) {
      const std::string role =
          options.clients == 1 ? "client" : "client " + std::to_string(i);
      spawn(role, false, i, client, options.client_may_be_killed);
    }
  }
  for (int fd : pipe_fds) {
    if (fd >= 0) ::close(fd);
  }

  // Bounded reaping: after the first failure the others get a short grace
  // period (they usually notice the dead peer), then everyone is killed.
  const milliseconds case_limit = scaled(options.timeout);
  auto deadline = Clock::now() + case_limit;
  for (;;) {
    bool alive = false;
    for (Child& child : children) {
      if (child.done) continue;
      const pid_t r = ::waitpid(child.pid, &child.status, WNOHANG);
      if (r == child.pid) {
        child.done = true;
        const bool ok = (WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0) ||
                        (child.may_be_killed && WIFSIGNALED(child.status) &&
                         WTERMSIG(child.status) == SIGKILL);
        if (!ok) {
          deadline = std::min(deadline, Clock::now() + scaled(std::chrono::seconds(10)));
        }
      } else {
        alive = true;
      }
    }
    if (!alive) break;
    if (Clock::now() > deadline) {
      for (Child& child : children) {
        if (child.done) continue;
        ::kill(child.pid, SIGKILL);
        ::waitpid(child.pid, &child.status, 0);
        child.done = true;
        child.timed_out = true;
      }
      break;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }

  for (const Child& child : children) {
    if (child.timed_out) {
      ADD_FAILURE() << child.role << " role hung: killed after the case's "
                    << case_limit.count() << " ms limit";
    } else if (WIFEXITED(child.status)) {
      if (WEXITSTATUS(child.status) != 0) {
        ADD_FAILURE() << child.role << " role failed with exit status "
                      << WEXITSTATUS(child.status)
                      << " (its assertions are printed above)";
      }
    } else if (WIFSIGNALED(child.status)) {
      const int sig = WTERMSIG(child.status);
      if (!(child.may_be_killed && sig == SIGKILL)) {
        ADD_FAILURE() << child.role << " role died from signal " << sig << " ("
                      << strsignal(sig) << ")";
      }
    }
  }
}

}  // namespace rdmakit::test
