#pragma once
// Both ends of an shm queue pair in one process, for white-box tests of the
// provider's data path.
#include <future>
#include <memory>
#include <string>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::shm {

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
