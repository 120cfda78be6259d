#pragma once
// The two programs of rdmakit-cp: the serving daemon and the copying client
// (push or pull), each wiring a session to a Sender or a Receiver.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <rdmakit/auth.hpp>
#include <rdmakit/session/session.hpp>
#include <string>
#include <vector>

#include "filter.hpp"
#include "lanes.hpp"
#include "protocol.hpp"

namespace rdmakit::cp {

struct ServeOptions {
  std::string root;
  std::string bind = "127.0.0.1";  // closed by default: only local users
  std::string secret_file;         // else RDMAKIT_SECRET_FILE, RDMAKIT_SECRET
  bool no_auth = false;            // allow a non-loopback bind without a secret
  bool read_only = false;          // refuse pushes
  bool write_only = false;         // refuse pulls
  bool preserve_special = false;   // keep setuid/setgid/sticky of pushed modes
  uint64_t max_client_bytes = 0;   // per transfer; 0: no limit
  uint16_t port = 7480;
  std::string provider = "auto";
  std::string port_file;                      // written with the bound port (for -p 0)
  uint32_t max_clients = kDefaultMaxClients;  // transfers at once; more are refused
};
int serve(const ServeOptions& options);

// What serve's per-client code (serve.cpp) works with: serve and --server
// (server_mode.cpp) each fill one and run their clients with it.
struct ServerState {
  int root = -1;         // peer paths are resolved beneath it (AT_FDCWD: --server)
  bool confined = true;  // false (--server): the user's own permissions are the limit
  std::optional<auth::Secret> secret;
  bool read_only = false, write_only = false, preserve_special = false;
  uint64_t max_client_bytes = 0;  // 0: no limit
  uint32_t max_clients = kDefaultMaxClients;
  FILE* log = stderr;                  // per-client lines
  std::atomic<uint32_t> copying{0};    // admitted transfers, at most max_clients
  std::atomic<uint32_t> served{0};     // admitted transfers that ended
  std::atomic<uint32_t> connected{0};  // connections so far
  std::atomic<int> active{0};          // handler threads (admitted or not)
  // Lanes (lanes.hpp): every lane of every copy holds kLaneBytes of
  // registered memory. Each admitted copy has its first lane; the lanes
  // past the first come from a budget of extra_lanes, shared by all.
  LaneRegistry lanes;
  uint32_t extra_lanes = kDefaultMaxClients;
  std::atomic<uint32_t> extra_lanes_used{0};
};
// Lanes past the first a server grants at once for max_clients copies: as
// many as the copies (docs/cp.md, "Lanes").
inline uint32_t extra_lanes_for(uint32_t max_clients) { return max_clients; }
// A server's session options for up to max_clients clients at once.
session::SessionOptions server_session_options(const std::string& provider,
                                               uint32_t max_clients);
// Runs each client that connects on a thread of its own (serve's per-client
// code); the state must outlive the session server.
session::Handlers client_handlers(ServerState& s);

// rdmakit-cp --server ...: started by a client over a remote shell (-e),
// serves that one client (remote_shell.hpp, server_mode.cpp).
int server_mode(int argc, char** argv);

struct CopyOptions {
  std::vector<std::string> sources;
  std::string dest;
  bool recursive = false;
  bool resume = false;
  bool json = false;
  bool quiet = false;
  uint16_t port = 7480;
  std::string provider = "auto";
  std::string secret_file;        // else RDMAKIT_SECRET_FILE, RDMAKIT_SECRET
  bool preserve_special = false;  // keep setuid/setgid/sticky of pulled modes
  uint32_t sync = 0;              // SyncFlags
  bool itemize = false;           // -i
  bool verbose = false;           // -v
  bool progress_files = false;    // --progress
  bool progress_total = false;    // --info=progress2
  bool stats = false;             // --stats
  std::string partial_dir;        // --partial-dir
  uint32_t lanes = 0;             // --lanes; 0: default_lanes() for the provider
  uint64_t bwlimit = 0;           // --bwlimit, bytes per second
  FilterRules filters;            // --exclude, --include, ... in order
  // -e COMMAND: start the server over this remote shell (empty: a daemon).
  std::string rsh;
  std::string rdmakit_path = "rdmakit-cp";  // the remote program (-e)
};
// Push or pull, decided by which side names a HOST:.
int copy(const CopyOptions& options);

// Session options both ends use. Liveness is generous: a copy saturates the
// CPUs it runs on (and the machine may be loaded), so a heartbeat can be late
// by seconds without the peer being gone; a killed peer is still seen at once
// by the transport.
session::SessionOptions session_options(const std::string& provider);

// Fault injection for tests: RDMAKIT_CP_CORRUPT_CHUNK=N corrupts the N-th
// chunk (0-based) this process sends, once, after its hashes were taken: a
// byte of file data if the chunk has any, else a record byte; with the suffix
// "r" (N r) always a record byte.
int64_t corrupt_chunk_from_env();
bool corrupt_records_from_env();

}  // namespace rdmakit::cp
