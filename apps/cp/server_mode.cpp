// rdmakit-cp --server (--push | --pull) [--provider P] [--preserve-special]:
// the server a client started over a remote shell (rdmakit-cp -e ssh ...).
// It runs as the ssh user, with that user's permissions and no --root:
// paths are relative to its working directory (the user's home under ssh),
// absolute ones are allowed. It listens on an ephemeral port of the address
// the ssh connection arrived on, with a fresh random secret, tells the
// client both on stdout (one bootstrap line, remote_shell.hpp), serves that
// one client with serve's per-client code, and exits. It also exits when no
// client comes within 30 s or its stdin (the remote shell's channel) closes.
#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <rdmakit/auth.hpp>
#include <sstream>
#include <thread>

#include "endpoints.hpp"
#include "protocol.hpp"
#include "remote_shell.hpp"
#include "report.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

constexpr const char* kMe = "rdmakit-cp --server";

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// Where the client reached this host: the third field of SSH_CONNECTION
// ("client port server port"); loopback without one (a local remote shell).
std::string arrival_address() {
  const char* c = std::getenv("SSH_CONNECTION");
  std::istringstream in(c != nullptr ? c : "");
  std::string client, port, server;
  if (!(in >> client >> port >> server)) return "127.0.0.1";
  // An IPv4 client on a dual-stack sshd shows as ::ffff:a.b.c.d.
  if (server.rfind("::ffff:", 0) == 0 && server.find('.') != std::string::npos)
    server = server.substr(7);
  return server;
}

static_assert(kBootstrapSecretBytes == auth::kNonceBytes, "a secret is one fresh nonce");

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// True once stdin has ended (EOF, or an error: the channel is gone). Reads
// and drops whatever arrives: the client sends nothing on it.
bool input_ended(std::chrono::milliseconds wait) {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(wait.count()));
  if (n <= 0) return false;
  char buf[256];
  const ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
  return r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN);
}

}  // namespace

int server_mode(int argc, char** argv) {
  const int usage = static_cast<int>(Failure::kUsage);
  const int peer = static_cast<int>(Failure::kPeer);
  bool push = false, pull = false, preserve_special = false;
  std::string provider = "auto";
  CLI::App app{
      "rdmakit-cp --server: started by rdmakit-cp -e over a remote shell; "
      "not for direct use"};
  auto* push_opt = app.add_flag("--push", push, "the client pushes (this end receives)");
  app.add_flag("--pull", pull, "the client pulls (this end sends)")->excludes(push_opt);
  app.add_option("--provider", provider, "tcp, verbs, shm, or auto (verbs, else tcp)");
  app.add_flag("--preserve-special", preserve_special,
               "keep setuid/setgid/sticky bits of pushed files");
  try {
    app.parse(argc - 1, argv + 1);  // argv[1] is --server
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : usage;
  }
  if (push == pull) {
    std::fprintf(stderr, "%s: give --push or --pull\n", kMe);
    return usage;
  }
  spdlog::set_level(spdlog::level::warn);  // the client reports; stderr is its terminal
  ::setenv("RDMAKIT_LOG", "warn", 0);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);

  Bootstrap boot;
  boot.address = arrival_address();
  try {
    boot.provider = provider_between_hosts(provider);
    (void)parse_provider(boot.provider);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", kMe, e.what());
    return usage;
  }
  boot.secret = auth::fresh_nonce();
  // Declared before the server: handler threads use it until the server is gone.
  ServerState s;
  s.root = AT_FDCWD;
  s.confined = false;
  s.secret = auth::Secret::from_bytes(boot.secret, "the remote shell's channel");
  s.read_only = !push;  // only what the client asked the remote shell for
  s.write_only = push;
  s.preserve_special = preserve_special;
  s.max_clients = 1;
  s.extra_lanes = kMaxLanes - 1;  // the one copy may have all its lanes
  // Per-client lines would repeat on the user's terminal what the client
  // already says (every refusal reaches it).
  FILE* quiet = std::fopen("/dev/null", "w");
  if (quiet != nullptr) s.log = quiet;
  std::unique_ptr<session::Server> server;
  const std::string listen = host_port(boot.address, 0);
  try {
    server = std::make_unique<session::Server>(
        listen, server_session_options(boot.provider, s.max_clients), client_handlers(s));
    server->expose_per_endpoint(kSlotsBuffer, kLaneBytes, kAccessAll);
    server->start();
  } catch (const Error& e) {
    std::fprintf(
        stderr, "%s: cannot listen on %s (provider %s, the address ssh came in on): %s\n",
        kMe, listen.c_str(), boot.provider.c_str(), e.what());
    return peer;
  }
  boot.port = server->port();
  std::string line = format_bootstrap(boot) + "\n";
  const bool told = write_all(STDOUT_FILENO, line);
  ::explicit_bzero(line.data(), line.size());
  if (!told) {
    std::fprintf(stderr, "%s: cannot answer the client on stdout: %s\n", kMe,
                 std::strerror(errno));
    return peer;
  }
  // Nothing else goes to stdout: the client no longer reads it, and a stray
  // print must not block on a full pipe.
  ::dup2(STDERR_FILENO, STDOUT_FILENO);

  const auto deadline = std::chrono::steady_clock::now() + kRemoteStartTimeout;
  std::chrono::steady_clock::time_point closed_at{};
  bool input_closed = false;
  int rc = 0;
  for (;;) {
    const bool admitted = s.copying > 0 || s.served > 0;
    if (s.served > 0) break;  // the one client was served
    if (g_stop) {
      std::fprintf(stderr, "%s: stopped by a signal\n", kMe);
      rc = peer;
      break;
    }
    if (!admitted && std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: no client connected to %s within %lld s; exiting\n", kMe,
                   boot.endpoint().c_str(),
                   static_cast<long long>(kRemoteStartTimeout.count()));
      rc = peer;
      break;
    }
    if (!input_closed) {
      if (input_ended(50ms)) {
        input_closed = true;
        closed_at = std::chrono::steady_clock::now();
      }
      continue;
    }
    // The client closed our stdin: it is done or gone. A transfer ending
    // right now gets a moment to finish its bookkeeping.
    if (s.active == 0 || std::chrono::steady_clock::now() > closed_at + 5s) {
      if (s.active > 0)
        std::fprintf(stderr,
                     "%s: the remote shell's input closed during the copy; exiting\n",
                     kMe);
      else if (s.connected == 0)
        std::fprintf(stderr,
                     "%s: the remote shell's input closed before a client came; "
                     "exiting\n",
                     kMe);
      rc = peer;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  for (int i = 0; i < 100 && s.active > 0; ++i) std::this_thread::sleep_for(50ms);
  if (s.active > 0) std::_Exit(rc == 0 ? peer : rc);  // never unwind under a transfer
  server.reset();
  if (quiet != nullptr) std::fclose(quiet);
  return rc;
}

}  // namespace rdmakit::cp
