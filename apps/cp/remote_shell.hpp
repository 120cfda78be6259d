#pragma once
// rdmakit-cp -e COMMAND: the server is started over a remote shell (ssh), as
// rsync -e does. The client runs `COMMAND... [USER@]HOST PROGRAM --server
// ...` with pipes on the remote program's stdin and stdout; the remote
// `rdmakit-cp --server` listens on an ephemeral port with a fresh random
// secret and answers with one line, the bootstrap line:
//
//   rdmakit-cp-bootstrap 1 PROVIDER ADDRESS PORT SECRET
//
// (version 1; PROVIDER tcp, verbs or shm; ADDRESS numeric IPv4 or IPv6;
// SECRET 64 hex digits, 32 random bytes). The client then connects there and
// both ends prove the secret (auth.hpp). So the secret only ever crosses the
// remote shell's channel: never a command line, the environment or a file.
#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rdmakit::cp {

inline constexpr const char* kBootstrapTag = "rdmakit-cp-bootstrap";
inline constexpr int kBootstrapVersion = 1;
inline constexpr size_t kBootstrapSecretBytes = 32;
// How long the client waits for the bootstrap line, and the server for its
// client to connect.
inline constexpr std::chrono::seconds kRemoteStartTimeout{30};

// Splits a remote shell command line into words as rsync does: words are
// separated by blanks (space, tab, newline); single or double quotes keep
// blanks inside a word and are removed; inside quotes the same quote doubled
// stands for itself ('it''s' -> it's); no backslash escapes. False (with the
// reason) on an unbalanced quote or an empty command.
bool split_words(std::string_view text, std::vector<std::string>* words,
                 std::string* why);

struct Bootstrap {
  std::string provider;  // tcp, verbs or shm
  std::string address;   // numeric IPv4 or IPv6, no brackets
  uint16_t port = 0;
  std::array<std::byte, kBootstrapSecretBytes> secret{};
  ~Bootstrap();  // wipes the secret
  // "ADDRESS:PORT", "[ADDRESS]:PORT" for IPv6 (what session::Client takes).
  std::string endpoint() const;
};

// "ADDRESS:PORT", or "[ADDRESS]:PORT" for IPv6.
std::string host_port(const std::string& address, uint16_t port);

// The line without its newline.
std::string format_bootstrap(const Bootstrap& b);
// Parses a line (its newline removed). False with the reason when it is not
// a version-1 bootstrap line; the reason never quotes the secret.
bool parse_bootstrap(std::string_view line, Bootstrap* out, std::string* why);

// A printable excerpt of what a peer sent (at most `max` characters, control
// bytes as '?'), for error messages.
std::string printable(std::string_view text, size_t max = 80);

// One child process with pipes on its stdin and stdout; stderr is inherited
// (ssh's prompts and errors reach the user's terminal). Spawned with
// posix_spawnp, no shell; signals the client ignores (SIGPIPE) are reset.
class RemoteShell {
 public:
  RemoteShell() = default;
  RemoteShell(const RemoteShell&) = delete;
  RemoteShell& operator=(const RemoteShell&) = delete;
  ~RemoteShell();  // finish() with a short grace if still running

  bool spawn(const std::vector<std::string>& argv, std::string* why);
  bool running() const { return pid_ > 0; }

  enum class Read { kLine, kEof, kTimeout, kTooLong, kError };
  // One line from the child's stdout, without its newline; waits at most
  // `timeout`. *line holds what was read even when no newline came.
  Read read_line(std::chrono::milliseconds timeout, size_t max, std::string* line);

  // Closes the child's stdin (its end of input: the remote server exits),
  // waits up to `grace` for it to exit, then SIGTERM and, 2 s later,
  // SIGKILL. Returns how it ended ("ssh exited with status 255").
  std::string finish(std::chrono::milliseconds grace);
  // The wait status after finish(); -1 before.
  int status() const { return status_; }

 private:
  pid_t pid_ = -1;
  int in_ = -1;   // the child's stdin (we never write; closing it is the EOF)
  int out_ = -1;  // the child's stdout
  int status_ = -1;
  std::string name_;  // the program's base name, for messages
};

// What the client asks of the remote side.
struct RemoteRequest {
  std::string rsh;       // -e COMMAND
  std::string program;   // --rdmakit-path (passed to the remote shell as is)
  std::string host;      // [USER@]HOST, given to the remote shell as is
  bool push = true;      // else pull
  std::string provider;  // --provider: auto, tcp, verbs, shm
  bool preserve_special = false;
};

// The argv of the remote shell command (no secret in it); false with the
// reason on a usage error (quotes, host, provider).
bool remote_command(const RemoteRequest& r, std::vector<std::string>* argv,
                    std::string* why);
// The command line as text, for messages.
std::string command_text(const std::vector<std::string>& argv);

// Starts the remote server (argv from remote_command) and reads its bootstrap line
// (kRemoteStartTimeout). False with a message naming the host, what happened (e.g. "ssh
// exited with status 255 before the server answered") and the command.
bool start_remote_server(const RemoteRequest& r, const std::vector<std::string>& argv,
                         RemoteShell* shell, Bootstrap* out, std::string* why);

// The provider --provider auto means between hosts: verbs when this host
// has a usable RDMA device, else tcp (shm only when asked for: the remote
// server runs as another user). RDMAKIT_PROVIDER, when set, is taken.
std::string provider_between_hosts(const std::string& requested);

}  // namespace rdmakit::cp
