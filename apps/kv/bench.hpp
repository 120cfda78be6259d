#pragma once
// rdmakit-kv bench: the lab's measurement. N updates, N RPC GETs and N READ
// GETs over K keys from several client threads against a server in a child
// process, each phase timed with CLOCK_MONOTONIC; optionally with a CPU hog
// sharing the server's core.
#include <cstdint>
#include <string>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::kv {

struct BenchOptions {
  ProviderKind provider = ProviderKind::kAuto;
  uint64_t ops = 100000;  // per phase, over all threads
  uint64_t keys = 1000;
  uint32_t value_size = 8;
  int threads = 2;
  bool server_busy = false;       // a CPU hog on the server's core
  bool server_busy_poll = false;  // ServerOptions::busy_poll
  int server_cpu = 0;             // -1: no pinning
  int client_cpu = 1;
  std::string json;  // file to write the JSON result to ("-" = stdout)
};

// Returns the exit status (non-zero if a phase failed or a GET was wrong).
int run_bench(const BenchOptions& options);

}  // namespace rdmakit::kv
