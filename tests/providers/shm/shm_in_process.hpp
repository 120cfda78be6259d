#pragma once
// Both ends of an shm queue pair in one process, for white-box tests of the
// provider's data path.
#include <future>
#include <memory>
#include <string>

#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/rdmakit.hpp"

namespace rdmakit::shm {

// The kernel's credentials of a connected Unix socket's peer.
inline PeerCred cred_of(int sock) {
  PeerCred cred;
  peer_cred(sock, &cred);
  return cred;
}

inline std::unique_ptr<Context> open_shm() {
  ContextOptions options;
  options.provider = ProviderKind::kShm;
  return Context::open(options);
}

// A signaled 8-byte WRITE from the start of local to (remote_addr, rkey).
inline SendWr write_wr(uint64_t wr_id, MemoryRegion& local, uint64_t remote_addr,
                       uint32_t rkey) {
  return SendWr{.wr_id = wr_id,
                .opcode = Opcode::kWrite,
                .flags = kSignaled,
                .length = 8,
                .local_addr = local.data(),
                .lkey = local.lkey(),
                .remote_addr = remote_addr,
                .rkey = rkey};
}

struct Pair {
  std::unique_ptr<QueuePair> a, b;
};

// a connects from context a to a listener of context b (the same context
// for both ends is fine).
inline Pair connect_pair(Context& a, Context& b, const QpOptions& a_options,
                         const QpOptions& b_options) {
  using namespace std::chrono_literals;
  auto listener = b.listen("127.0.0.1:0");
  auto accepted =
      std::async(std::launch::async, [&] { return listener->accept(b_options, 10s); });
  Pair p;
  p.a = a.connect("127.0.0.1:" + std::to_string(listener->port()), a_options);
  p.b = accepted.get();
  return p;
}

struct Connected {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<MemoryRegion> mem;
  std::unique_ptr<QueuePair> a, b;
};

inline Connected connect_in_process(uint32_t max_inline = 64) {
  using namespace std::chrono_literals;
  Connected c;
  ContextOptions options;
  options.provider = ProviderKind::kShm;
  c.ctx = Context::open(options);
  c.cq = c.ctx->create_cq();
  c.mem = c.ctx->allocate(1 << 16, kAccessAll);
  auto listener = c.ctx->listen("127.0.0.1:0");
  auto accepted = std::async(std::launch::async, [&] {
    return listener->accept(
        {.send_cq = c.cq.get(), .recv_cq = c.cq.get(), .max_inline = max_inline}, 10s);
  });
  c.a = c.ctx->connect(
      "127.0.0.1:" + std::to_string(listener->port()),
      {.send_cq = c.cq.get(), .recv_cq = c.cq.get(), .max_inline = max_inline});
  c.b = accepted.get();
  return c;
}

}  // namespace rdmakit::shm
