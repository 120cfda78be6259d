// Software cost of the data path, without any cache line crossing cores:
// both ends of a QP live in one thread, so each iteration measures only the
// instructions a message runs through (post, deliver, poll, repost). The
// cross-core latency of rdmakit-perf is this cost plus the two-line floor of
// rdmakit-floors.
//   rdmakit-path-cost [--benchmark_filter=shm]
#include <benchmark/benchmark.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"

namespace {

using namespace rdmakit;
using namespace std::chrono_literals;

struct Pair {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<MemoryRegion> mem;
  std::unique_ptr<QueuePair> a, b;
};

Pair connect_pair(ProviderKind provider) {
  Pair p;
  ContextOptions options;
  options.provider = provider;
  p.ctx = Context::open(options);
  p.cq_a = p.ctx->create_cq();
  p.cq_b = p.ctx->create_cq();
  p.mem = p.ctx->allocate(1 << 16, kAccessAll);
  auto listener = p.ctx->listen("127.0.0.1:0");
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  // accept and connect each wait for the other's handshake.
  auto accepted = std::async(std::launch::async, [&] {
    return listener->accept({.send_cq = p.cq_b.get(), .recv_cq = p.cq_b.get()}, 10s);
  });
  p.a = p.ctx->connect(address, {.send_cq = p.cq_a.get(), .recv_cq = p.cq_a.get()});
  p.b = accepted.get();
  return p;
}

// One 8-byte inline SEND from a to b: post, poll the RECV, repost it.
void send_recv(benchmark::State& state, ProviderKind provider) {
  Pair p = connect_pair(provider);
  std::byte* buf = p.mem->data();
  const RecvWr recv{.wr_id = 7, .addr = buf + 4096, .length = 64, .lkey = p.mem->lkey()};
  for (int i = 0; i < 64; ++i) p.b->post_recv(recv);
  const SendWr send{.opcode = Opcode::kSend,
                    .flags = kInline,
                    .length = static_cast<uint32_t>(state.range(0)),
                    .local_addr = buf,
                    .lkey = p.mem->lkey()};
  Completion c[4];
  int64_t unsignaled = 0;
  for (auto _ : state) {
    SendWr wr = send;
    // Signal one in 32, as a latency loop with selective signaling does.
    if (++unsignaled == 32) {
      wr.flags |= kSignaled;
      unsignaled = 0;
    }
    if (p.a->post_send(wr).status != PostStatus::kOk) state.SkipWithError("post_send");
    int n;
    while ((n = p.cq_b->poll(c)) == 0) {
    }
    if (!c[0].ok()) state.SkipWithError("recv completion failed");
    p.b->post_recv(recv);
    if (unsignaled == 0) {
      while (p.cq_a->poll(c) == 0) {
      }
    }
  }
}

// One 8-byte WRITE, signaled, posted and polled to completion.
void write_completion(benchmark::State& state, ProviderKind provider) {
  Pair p = connect_pair(provider);
  std::byte* buf = p.mem->data();
  const SendWr write{.opcode = Opcode::kWrite,
                     .flags = kSignaled | kInline,
                     .length = 8,
                     .local_addr = buf,
                     .lkey = p.mem->lkey(),
                     .remote_addr = reinterpret_cast<uint64_t>(buf + 8192),
                     .rkey = p.mem->rkey()};
  Completion c[4];
  for (auto _ : state) {
    if (p.a->post_send(write).status != PostStatus::kOk) state.SkipWithError("post_send");
    while (p.cq_a->poll(c) == 0) {
    }
  }
}

// An empty poll: what a spinning receiver pays per turn.
void empty_poll(benchmark::State& state, ProviderKind provider) {
  Pair p = connect_pair(provider);
  Completion c[4];
  for (auto _ : state) benchmark::DoNotOptimize(p.cq_b->poll(c));
}

// A 16-byte stream ping-pong in one thread, both streams on one engine
// (busy-polling, as rdmakit-stream-bench lat): per iteration, two messages,
// each a write and the read that takes it. Half an iteration is the stream
// layer's instructions per message, to set beside send_recv above.
void stream_ping_pong(benchmark::State& state, ProviderKind provider) {
  stream::EngineOptions engine_options;
  engine_options.provider = provider;
  auto engine = stream::Engine::create(engine_options);
  stream::StreamOptions options;
  options.busy_poll = 1s;
  auto listener = engine->listen("127.0.0.1:0", options);
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  auto accepted = std::async(std::launch::async, [&] { return listener->accept(10s); });
  auto a = engine->connect(address, options);
  auto b = accepted.get();
  // state.range(1) idle stream pairs on the same engine (its CQ serves them all).
  std::vector<std::unique_ptr<stream::Stream>> idle;
  for (int64_t i = 0; i < state.range(1); ++i) {
    auto other = std::async(std::launch::async, [&] { return listener->accept(10s); });
    idle.push_back(engine->connect(address, options));
    idle.push_back(other.get());
  }
  const auto size = static_cast<size_t>(state.range(0));
  std::byte buf[64] = {};
  for (auto _ : state) {
    if (a->write(buf, size) != static_cast<ssize_t>(size)) state.SkipWithError("write");
    if (b->read(buf, size, stream::Stream::kWaitAll) != static_cast<ssize_t>(size))
      state.SkipWithError("read");
    if (b->write(buf, size) != static_cast<ssize_t>(size)) state.SkipWithError("write");
    if (a->read(buf, size, stream::Stream::kWaitAll) != static_cast<ssize_t>(size))
      state.SkipWithError("read");
  }
}

BENCHMARK_CAPTURE(send_recv, shm, ProviderKind::kShm)->Arg(8)->Arg(0);
BENCHMARK_CAPTURE(write_completion, shm, ProviderKind::kShm);
BENCHMARK_CAPTURE(empty_poll, shm, ProviderKind::kShm);
BENCHMARK_CAPTURE(stream_ping_pong, shm, ProviderKind::kShm)
    ->Args({16, 0})
    ->Args({16, 100})
    ->Args({16, 400});

}  // namespace

BENCHMARK_MAIN();
