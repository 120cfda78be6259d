// rdmakit-kv: a key-value store whose GETs can be one-sided RDMA READs.
//   rdmakit-kv server [-p PORT] [--provider P] [--capacity N] [--config FILE]
//   rdmakit-kv client [-s SERVER] [-p PORT] [-i] [-q]          # the lab's menu
//   rdmakit-kv client put K V | get K [--get read] | del K | -  # one-shot, or stdin
//   rdmakit-kv bench [--provider P] [-n N] [-k K] [--threads T] [--server-busy] [--json
//   F]
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <string_view>

#include "bench.hpp"
#include "client.hpp"
#include "menu.hpp"
#include "server.hpp"

using namespace rdmakit;
using namespace rdmakit::kv;

namespace {

std::atomic<bool> g_stop{false};

constexpr const char* kDefaultConfig = "/etc/rdmakit/kv.conf";

ProviderKind provider_of(const std::string& name) { return parse_provider(name); }

// The server's options: the same on `rdmakit-kv server` (parsed by its own
// App, which also reads the config file) and in the top-level help.
struct ServerArgs {
  std::string provider = "auto";
  std::string secret_file;
  uint16_t port = 7471;
  std::string bind = "127.0.0.1";
  ServerOptions so;
  bool no_grow = false;
  int auth_timeout_ms = 5000;
};

void add_server_options(CLI::App* server_cmd, ServerArgs& a) {
  server_cmd->add_option("-p,--port", a.port, "Port (default 7471)");
  server_cmd->add_option("--bind", a.bind,
                         "Address to listen on (default 127.0.0.1; another one needs a "
                         "secret or --no-auth)");
  server_cmd->add_option("--secret-file", a.secret_file,
                         "Clients must prove this key (0600 file; else "
                         "RDMAKIT_SECRET_FILE, else RDMAKIT_SECRET)");
  server_cmd->add_flag("--no-auth", a.so.allow_no_auth,
                       "Allow a non-loopback address without a secret (anyone who "
                       "reaches it can read and write the table)");
  server_cmd->add_option(
      "--auth-timeout-ms", a.auth_timeout_ms,
      "Drop a client that has not authenticated by then (default 5000)");
  server_cmd->add_option("--provider", a.provider, "auto, shm, tcp or verbs");
  server_cmd->add_option("--capacity", a.so.table.capacity,
                         "Keys the first table holds (default 32768)");
  server_cmd->add_option("--blocks", a.so.table.blocks,
                         "Blocks for entries longer than a slot (default 64)");
  server_cmd->add_flag("--no-grow", a.no_grow,
                       "Refuse PUTs when full instead of growing");
  server_cmd->add_option("--max-clients", a.so.max_clients,
                         "Clients served at once (default 64)");
  server_cmd->add_flag("-q,--quiet", a.so.quiet, "No line per request");
  server_cmd->add_flag("--busy-poll", a.so.busy_poll,
                       "Poll without sleeping (lowest latency; takes a core)");
  // Flags override the file; a missing default file is not an error, a
  // missing --config FILE is (docs/kv.md#config-file).
  server_cmd->set_config(
      "--config", kDefaultConfig,
      "INI/TOML file of these options (key = value, e.g. port = 7471); "
      "flags override it. Default " +
          std::string(kDefaultConfig) + ", if it exists");
}

int run_server(ServerArgs& a) {
  ServerOptions& so = a.so;
  so.provider = provider_of(a.provider);
  so.address = a.bind + ":" + std::to_string(a.port);
  so.table.grow = !a.no_grow;
  so.auth_timeout = std::chrono::milliseconds(a.auth_timeout_ms);
  if (auto secret = auth::Secret::resolve(a.secret_file))
    so.secret = std::make_shared<const auth::Secret>(std::move(*secret));
  Server server(so);
  std::fprintf(stderr, "rdmakit-kv server: listening on %s, table sized for %lu keys\n",
               server.describe().c_str(), static_cast<unsigned long>(so.table.capacity));
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  server.run(g_stop);
  std::fprintf(stderr, "rdmakit-kv server: stopped after %lu requests\n",
               static_cast<unsigned long>(server.requests()));
  return 0;
}

// `rdmakit-kv server ...`: its own App, so that --config applies to it (CLI11
// reads a config file for the top-level App only).
int server_main(int argc, char** argv) {
  ServerArgs a;
  CLI::App app{"rdmakit-kv server: serve a table"};
  add_server_options(&app, a);
  CLI11_PARSE(app, argc, argv);
  return run_server(a);
}

}  // namespace

static int run_tool(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "server")
    return server_main(argc - 1, argv + 1);
  CLI::App app{"rdmakit-kv: key-value store with one-sided READ GETs (docs/kv.md)"};
  app.require_subcommand(1);

  std::string provider = "auto";
  std::string secret_file;
  uint16_t port = 7471;

  auto* server_cmd = app.add_subcommand("server", "Serve a table");
  ServerArgs server_args;
  add_server_options(server_cmd, server_args);

  auto* client_cmd =
      app.add_subcommand("client", "Menu, one command, or commands from stdin");
  std::string server_host = "127.0.0.1";
  ClientOptions co;
  bool quiet = false;
  std::string get_mode = "rpc";
  int timeout_ms = 5000;
  std::vector<std::string> words;
  client_cmd->add_option("-s,--server", server_host, "Server host (default 127.0.0.1)");
  client_cmd->add_option("-p,--port", port, "Port (default 7471)");
  client_cmd->add_option("--secret-file", secret_file,
                         "Prove this key to the server (0600 file; else "
                         "RDMAKIT_SECRET_FILE, else RDMAKIT_SECRET)");
  client_cmd->add_option("--provider", provider, "auto, shm, tcp or verbs");
  client_cmd->add_flag("-i,--inline", co.inline_sends,
                       "Send requests INLINE when they fit");
  client_cmd->add_flag("-q,--quiet", quiet, "No line per request");
  client_cmd->add_option("--get", get_mode, "GET by rpc (message) or read (RDMA READ)")
      ->check(CLI::IsMember({"rpc", "read"}));
  client_cmd->add_option("--timeout-ms", timeout_ms,
                         "Per-request timeout (default 5000)");
  client_cmd->add_option("command", words,
                         "put K V | get K | getr K | del K | - (commands from stdin); "
                         "none: the menu");

  auto* bench_cmd = app.add_subcommand("bench", "N updates, N RPC GETs, N READ GETs");
  BenchOptions bo;
  bench_cmd->add_option("--provider", provider, "auto, shm, tcp or verbs");
  bench_cmd->add_option("-n,--ops", bo.ops, "Operations per phase (default 100000)");
  bench_cmd->add_option("-k,--keys", bo.keys, "Distinct keys (default 1000)");
  bench_cmd->add_option("--value-size", bo.value_size, "Value bytes (default 8)");
  bench_cmd->add_option("-t,--threads", bo.threads, "Client threads (default 2)");
  bench_cmd->add_flag("--server-busy", bo.server_busy,
                      "A CPU hog shares the server's core");
  bench_cmd->add_flag("--server-busy-poll", bo.server_busy_poll,
                      "The server polls without sleeping (as read_lat's target)");
  bench_cmd->add_option("--server-cpu", bo.server_cpu,
                        "Server core (default 0; -1 unpinned)");
  bench_cmd->add_option("--client-cpu", bo.client_cpu,
                        "Client core (default 1; -1 unpinned)");
  bench_cmd->add_option("--json", bo.json,
                        "Write the result as JSON to this file (- stdout)");

  CLI11_PARSE(app, argc, argv);

  try {
    if (server_cmd->parsed()) return run_server(server_args);
    if (client_cmd->parsed()) {
      co.provider = provider_of(provider);
      co.address = server_host + ":" + std::to_string(port);
      co.timeout = std::chrono::milliseconds(timeout_ms);
      if (auto secret = auth::Secret::resolve(secret_file))
        co.secret = std::make_shared<const auth::Secret>(std::move(*secret));
      const GetMode mode = get_mode == "read" ? GetMode::kRead : GetMode::kRpc;
      Client client(co);
      if (!quiet)
        std::fprintf(stderr,
                     "rdmakit-kv client: connected to %s (provider %s, table epoch %u)\n",
                     co.address.c_str(), client.provider_name(), client.table().epoch);
      if (words.empty()) return run_menu(client, std::cin, std::cout, quiet);
      if (words.size() == 1 && words[0] == "-")
        return run_commands(client, std::cin, mode, std::cout, quiet);
      return run_command(client, words, mode, std::cout, quiet) ? 0 : 1;
    }
    bo.provider = provider_of(provider);
    return run_bench(bo);
  } catch (const std::exception& e) {
    std::cout << std::flush;
    // ClientError's text already starts with the tool's name.
    const std::string_view what = e.what();
    std::fprintf(stderr, "%s%s\n",
                 what.starts_with("rdmakit-kv: ") ? "" : "rdmakit-kv: ", e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  try {
    return run_tool(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-kv: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "rdmakit-kv: unknown error\n");
  }
  return 1;
}
