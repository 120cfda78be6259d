// rdmakit-cp: copy files and trees between hosts over any rdmakit provider.
//   rdmakit-cp serve --root DIR [-p PORT] [--provider P] [--max-clients N]
//                    [--bind ADDR] [--secret-file F] [--no-auth] [--read-only]
//                    [--write-only] [--preserve-special] [--max-client-bytes SIZE]
//                    [--config FILE]   (default /etc/rdmakit/cp.conf, if present)
//   rdmakit-cp [-r] [--resume] [--json] SRC... HOST:DST     (push)
//   rdmakit-cp [-r] [--resume] [--json] HOST:SRC... DST     (pull)
//   rdmakit-cp -e ssh [--rdmakit-path P] ... [USER@]HOST:...  (no daemon: the
//                    server is started over ssh, as rsync -e; remote_shell.hpp)
#include <sched.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <rdmakit/rdmakit.hpp>
#include <string>

#include "endpoints.hpp"
#include "limits.hpp"
#include "records.hpp"
#include "report.hpp"

namespace {

constexpr const char* kDefaultConfig = "/etc/rdmakit/cp.conf";

// A copy is bulk work, and each end runs several threads on what may be one
// CPU (the transport's receive thread, the session worker, the reader or
// writer). Under SCHED_BATCH a thread that wakes does not preempt the one
// running, so the writer (or reader) keeps its CPU for its time slice and the
// receive thread finds more data per wake-up: on a 2 GiB tcp push with the
// receiver on one CPU, 8 % less receiver CPU and 15 % fewer wake-ups
// (docs/cp.md). Set before any thread starts: they inherit it. A policy
// chosen from outside (chrt) is kept; RDMAKIT_CP_SCHED=other keeps the
// default one.
void use_batch_scheduling() {
  const char* choice = std::getenv("RDMAKIT_CP_SCHED");
  if (choice != nullptr && std::strcmp(choice, "other") == 0) return;
  if (::sched_getscheduler(0) != SCHED_OTHER) return;
  const sched_param param{};
  if (::sched_setscheduler(0, SCHED_BATCH, &param) != 0)
    std::fprintf(stderr, "rdmakit-cp: cannot use SCHED_BATCH (%s); default scheduling\n",
                 std::strerror(errno));
}

// rsync applies --include and --exclude rules in command-line order; CLI11
// keeps each option's values apart, so the order is read from argv.
std::string collect_filters(int argc, char** argv, rdmakit::cp::FilterRules* rules) {
  struct Kind {
    std::string_view name;
    bool include, from_file;
  };
  static constexpr Kind kKinds[] = {{"--exclude", false, false},
                                    {"--include", true, false},
                                    {"--exclude-from", false, true},
                                    {"--include-from", true, true}};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    for (const Kind& k : kKinds) {
      std::string value;
      if (arg == k.name && i + 1 < argc) {
        value = argv[++i];
      } else if (arg.size() > k.name.size() && arg.substr(0, k.name.size()) == k.name &&
                 arg[k.name.size()] == '=') {
        value = arg.substr(k.name.size() + 1);
      } else {
        continue;
      }
      const std::string why = k.from_file ? rules->add_from_file(value, k.include)
                              : k.include ? rules->add_include(value)
                                          : rules->add_exclude(value);
      if (!why.empty()) return std::string(k.name) + " " + value + ": " + why;
      break;
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace rdmakit::cp;
  use_batch_scheduling();
  const int usage = static_cast<int>(Failure::kUsage);
  // Library logs go to stderr: stdout carries the summary (or its JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("rdmakit-cp"));
  try {
    if (argc > 1 && std::strcmp(argv[1], "serve") == 0) {
      ServeOptions o;
      CLI::App app{"rdmakit-cp serve: receive and serve files beneath --root"};
      app.add_option("--root", o.root, "directory served; no path may leave it")
          ->required();
      app.add_option("-p,--port", o.port, "port (0 picks one; see --port-file)");
      app.add_option("--bind", o.bind,
                     "address to listen on (default 127.0.0.1: local users only); "
                     "another one needs a secret or --no-auth")
          ->capture_default_str();
      app.add_option("--secret-file", o.secret_file,
                     "shared secret (0600 file); else RDMAKIT_SECRET_FILE or "
                     "RDMAKIT_SECRET. Clients must prove it, and this server proves it");
      app.add_flag("--no-auth", o.no_auth,
                   "allow a non-loopback --bind without a secret (anyone who reaches "
                   "the port reads and writes under --root)");
      app.add_flag("--read-only", o.read_only, "serve pulls only; refuse pushes");
      app.add_flag("--write-only", o.write_only, "accept pushes only; refuse pulls");
      app.add_flag("--preserve-special", o.preserve_special,
                   "keep setuid/setgid/sticky bits of pushed files (dropped by default)");
      std::string max_bytes;
      app.add_option("--max-client-bytes", max_bytes,
                     "bytes one transfer may declare and write (e.g. 10G); default: no "
                     "limit but the filesystem's free space")
          ->check([&](const std::string& v) {
            uint64_t b = 0;
            return parse_size(v, &b) && b > 0 ? std::string() : "not a size: " + v;
          });
      app.add_option("--provider", o.provider, "shm, tcp, verbs or auto");
      app.add_option("--port-file", o.port_file, "write the bound port here");
      app.add_option("--max-clients", o.max_clients,
                     "clients copying at once (each holds 8 MiB of registered memory); "
                     "one more is refused with \"server busy\"")
          ->check(CLI::Range(1u, kMaxMaxClients))
          ->capture_default_str();
      // Flags override the file; a missing default file is not an error, a
      // missing --config FILE is (docs/cp.md#config-file).
      app.set_config("--config", kDefaultConfig,
                     "INI/TOML file of these options (key = value, e.g. root = /srv/x); "
                     "flags override it. Default " +
                         std::string(kDefaultConfig) + ", if it exists");
      try {
        app.parse(argc - 1, argv + 1);
      } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : usage;
      }
      if (!max_bytes.empty()) parse_size(max_bytes, &o.max_client_bytes);
      return serve(o);
    }
    if (argc > 1 && std::strcmp(argv[1], "--server") == 0) return server_mode(argc, argv);
    CopyOptions o;
    if (const char* rsh = std::getenv("RDMAKIT_RSH")) o.rsh = rsh;
    std::vector<std::string> paths;
    CLI::App app{
        "rdmakit-cp: copy files and directory trees over RDMA (or shm/tcp), verified and "
        "resumable.\n  push: rdmakit-cp [-r] SRC... HOST:DST\n  pull: rdmakit-cp [-r] "
        "HOST:SRC... DST\n  server: rdmakit-cp serve --root DIR\n  no daemon: "
        "rdmakit-cp -e ssh [-r] SRC... [USER@]HOST:DST (or a pull)\nExit codes: 0 ok, 1 "
        "usage, 2 "
        "file errors, 3 verification failed, 4 refused by the server, 5 connection/peer"};
    app.add_flag("-r,--recursive", o.recursive, "copy directories recursively");
    app.add_flag("--resume,--partial", o.resume,
                 "continue from part files an interrupted run left: send only the blocks "
                 "they lack");
    app.add_option("--partial-dir", o.partial_dir,
                   "keep part files in DIR beside each file (one name) and continue from "
                   "them; implies --resume")
        ->check([](const std::string& v) {
          return rdmakit::cp::valid_partial_dir(v) && !v.empty()
                     ? std::string()
                     : "one directory name (no '/', '.' or '..'): " + v;
        });
    app.add_flag("--json", o.json, "print the summary as JSON");
    app.add_flag("-q,--quiet", o.quiet, "no progress line");
    app.add_option("-p,--port", o.port, "server port");
    app.add_option("--provider", o.provider, "shm, tcp, verbs or auto");
    app.add_option("--lanes", o.lanes,
                   "connections the data is striped over (1-8; the server may grant "
                   "fewer). Default on tcp/verbs: one per two CPUs, 1 to 4; 1 on shm")
        ->check(CLI::Range(1u, rdmakit::cp::kMaxLanes));
    app.add_option(
        "--secret-file", o.secret_file,
        "shared secret (0600 file); else RDMAKIT_SECRET_FILE or RDMAKIT_SECRET. "
        "The server must prove it too");
    app.add_flag("--preserve-special", o.preserve_special,
                 "pull (with -e also push): keep setuid/setgid/sticky bits (dropped by "
                 "default)");
    // Sync: rsync's names where they mean the same (docs/cp.md#sync).
    struct SyncFlag {
      const char* name;
      uint32_t bit;
      const char* help;
    };
    static constexpr SyncFlag kSyncOptions[] = {
        {"-c,--checksum", kSyncChecksum,
         "compare content (xxh3), not size and modification time"},
        {"--delete", kSyncDelete, "delete what the destination has and the source lacks"},
        {"--delete-excluded", kSyncDelete | kSyncDeleteExcluded,
         "also delete excluded entries from the destination (implies --delete)"},
        {"-n,--dry-run", kSyncDryRun, "change nothing; show what would change (with -i)"},
        {"-W,--whole-file", kSyncWholeFile, "send changed files whole (no delta)"},
        {"-I,--ignore-times", kSyncIgnoreTimes,
         "send files even when size and modification time match"},
        {"-o,--owner", kSyncOwner, "keep the owner (root only, as rsync)"},
        {"-g,--group", kSyncGroup, "keep the group"},
        {"--numeric-ids", kSyncNumericIds, "map owners by number, not by name"},
        {"-A,--acls", kSyncAcls, "keep POSIX ACLs"},
        {"-X,--xattrs", kSyncXattrs, "keep extended attributes"},
        {"-H,--hard-links", kSyncHardLinks, "keep hard links"},
    };
    std::vector<bool> sync_set(std::size(kSyncOptions), false);
    for (size_t i = 0; i < std::size(kSyncOptions); ++i) {
      app.add_flag_function(
          kSyncOptions[i].name, [&, i](int64_t) { sync_set[i] = true; },
          kSyncOptions[i].help);
    }
    bool archive = false;
    app.add_flag("-a,--archive", archive,
                 "-r plus, as root, -o -g (modes, times and symlinks are always kept)");
    app.add_flag("-i,--itemize-changes", o.itemize,
                 "one line per change, as rsync -i (YXcstpoguax NAME)");
    app.add_flag("-v,--verbose", o.verbose, "name each entry that changes");
    app.add_flag("--progress", o.progress_files,
                 "a progress line per file on stdout, as rsync --progress");
    std::string bwlimit;
    app.add_option(
           "--bwlimit", bwlimit,
           "limit the data rate: KiB/s, or with a unit (e.g. 50M, bytes per second)")
        ->check([](const std::string& v) {
          uint64_t b = 0;
          return rdmakit::cp::parse_size(v, &b) ? std::string() : "not a rate: " + v;
        });
    std::string info;
    app.add_option("--info", info, "progress2: one progress line for the whole transfer")
        ->check(CLI::IsMember({"progress2"}));
    app.add_flag("--stats", o.stats,
                 "counts of what was listed, made and moved, at the end");
    std::vector<std::string> filter_args;  // read in order by collect_filters
    app.add_option("--exclude", filter_args,
                   "leave out what matches PATTERN (rsync's rules)")
        ->allow_extra_args(false);
    app.add_option("--include", filter_args,
                   "keep what matches PATTERN, before later excludes")
        ->allow_extra_args(false);
    app.add_option("--exclude-from", filter_args,
                   "exclude patterns from FILE, one a line")
        ->allow_extra_args(false);
    app.add_option("--include-from", filter_args,
                   "include patterns from FILE, one a line")
        ->allow_extra_args(false);
    app.add_option("-e,--rsh", o.rsh,
                   "start the server over this remote shell, as rsync -e (e.g. 'ssh -p "
                   "2222'): no daemon needed. Default $RDMAKIT_RSH; -e '' for a daemon");
    app.add_option("--rdmakit-path", o.rdmakit_path,
                   "with -e: the program to run on the remote host")
        ->capture_default_str();
    app.add_option("paths", paths, "SRC... DST")->required();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e) == 0 ? 0 : usage;
    }
    if (paths.size() < 2) {
      std::fprintf(stderr, "rdmakit-cp: need at least one source and a destination\n");
      return usage;
    }
    for (size_t i = 0; i < std::size(kSyncOptions); ++i)
      if (sync_set[i]) o.sync |= kSyncOptions[i].bit;
    if (const std::string why = collect_filters(argc, argv, &o.filters); !why.empty()) {
      std::fprintf(stderr, "rdmakit-cp: %s\n", why.c_str());
      return usage;
    }
    o.progress_total = info == "progress2";
    if (!bwlimit.empty()) {
      // A plain number is KiB/s, as rsync's --bwlimit.
      parse_size(bwlimit, &o.bwlimit);
      if (bwlimit.find_first_not_of("0123456789") == std::string::npos) o.bwlimit *= 1024;
    }
    if (archive) {
      o.recursive = true;
      if (::geteuid() == 0) o.sync |= kSyncOwner | kSyncGroup;
    }
    if (!o.rsh.empty() && (app.count("--port") > 0 || app.count("--secret-file") > 0)) {
      // The remote shell starts the server on a port and with a secret of its own.
      std::fprintf(stderr,
                   "rdmakit-cp: -p and --secret-file are for a daemon; with -e (or "
                   "RDMAKIT_RSH) the server gets its port and secret over the remote "
                   "shell (-e '' to use a daemon)\n");
      return usage;
    }
    spdlog::set_level(spdlog::level::warn);  // the client reports by itself
    ::setenv("RDMAKIT_LOG", "warn", 0);
    o.dest = paths.back();
    paths.pop_back();
    o.sources = paths;
    return copy(o);
  } catch (const rdmakit::Error& e) {
    std::fprintf(stderr, "rdmakit-cp: %s\n", e.what());
    return static_cast<int>(Failure::kPeer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmakit-cp: %s\n", e.what());
    return usage;
  }
}
