// Quick loopback numbers for the tcp provider (not a test; the real
// benchmarks live in bench/ and tools/rdmakit-perf):
//   tcp_bench [iterations]
// 16-byte SEND/RECV ping-pong with both sides busy-polling, then 1 MiB WRITE
// bandwidth with 8 in flight.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "rdmakit/rdmakit.hpp"

using namespace rdmakit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Side {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::unique_ptr<MemoryRegion> mr;
};

Completion poll1(CompletionQueue& cq) {
  Completion c;
  const auto end = Clock::now() + 10s;
  while (cq.poll({&c, 1}) == 0) {
    if (Clock::now() > end) {
      std::fprintf(stderr, "timeout\n");
      std::exit(1);
    }
  }
  if (!c.ok()) {
    std::fprintf(stderr, "error %s\n", status_name(c.status));
    std::exit(1);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  ContextOptions co;
  co.provider = ProviderKind::kTcp;
  Side a, b;
  a.ctx = Context::open(co);
  b.ctx = Context::open(co);
  a.cq = a.ctx->create_cq();
  b.cq = b.ctx->create_cq();
  a.mr = a.ctx->allocate(8 << 20, kAccessAll);
  b.mr = b.ctx->allocate(8 << 20, kAccessAll);
  QpOptions oa, ob;
  oa.send_cq = oa.recv_cq = a.cq.get();
  ob.send_cq = ob.recv_cq = b.cq.get();
  ob.thread_safe = true;  // set up here, echoed from another thread
  auto listener = b.ctx->listen("127.0.0.1:0");
  std::thread acc([&] { b.qp = listener->accept(ob, 5s); });
  a.qp = a.ctx->connect("127.0.0.1:" + std::to_string(listener->port()), oa);
  acc.join();

  // Ping-pong: b echoes. Each side keeps one RECV posted.
  auto post_recv = [](Side& s) {
    (void)s.qp->post_recv(RecvWr{1, s.mr->data() + 4096, 64, s.mr->lkey()});
  };
  auto send16 = [](Side& s) {
    SendWr w;
    w.opcode = Opcode::kSend;
    w.flags = kSignaled | kInline;
    w.length = 16;
    w.local_addr = s.mr->data();
    (void)s.qp->post_send(w);
  };
  post_recv(a);
  post_recv(b);
  {
    // One thread drives both ends: the software cost of a round trip
    // without any scheduler in the way (meaningful on a loaded machine).
    Completion c[4];
    const auto t = Clock::now();
    const int n = iters / 4;
    for (int i = 0; i < n; ++i) {
      send16(a);
      for (bool got = false; !got;) {
        for (int k = b.cq->poll(c), j = 0; j < k; ++j)
          got |= c[j].opcode == Opcode::kRecv;
      }
      post_recv(b);
      send16(b);
      for (bool got = false; !got;) {
        for (int k = a.cq->poll(c), j = 0; j < k; ++j)
          got |= c[j].opcode == Opcode::kRecv;
      }
      post_recv(a);
    }
    while (a.cq->poll(c) > 0 || b.cq->poll(c) > 0) {
    }
    std::printf("16 B SEND/RECV one-thread round trip: %.2f us (%d iterations)\n",
                std::chrono::duration<double, std::micro>(Clock::now() - t).count() / n,
                n);
  }
  std::thread echo([&] {
    for (int i = 0; i < iters; ++i) {
      // Wait for the RECV, repost, reply; reap our send completion later.
      for (;;) {
        Completion c = poll1(*b.cq);
        if (c.opcode == Opcode::kRecv) break;
      }
      post_recv(b);
      send16(b);
    }
    Completion c[16];
    const auto end = Clock::now() + 200ms;
    while (Clock::now() < end) b.cq->poll(c);
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    send16(a);
    for (;;) {
      Completion c = poll1(*a.cq);
      if (c.opcode == Opcode::kRecv) break;
    }
    post_recv(a);
  }
  const double rtt_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  echo.join();
  Completion drainbuf[64];
  while (a.cq->poll(drainbuf) > 0) {
  }
  std::printf("16 B SEND/RECV ping-pong: %.2f us half round trip (%d iterations)\n",
              rtt_us / 2, iters);

  // Bandwidth: b polls only so its socket is served by the poll path, as in
  // a benchmark where the target busy-polls; a is the writer.
  std::atomic<bool> stop{false};
  std::thread target([&] {
    Completion c[16];
    while (!stop.load()) b.cq->poll(c);
  });
  const RemoteRegion rr = b.mr->remote();
  constexpr uint32_t kChunk = 1 << 20;
  const int writes = std::max(iters / 20, 200);
  int posted = 0, done = 0;
  const auto t1 = Clock::now();
  while (done < writes) {
    while (posted < writes && posted - done < 8) {
      SendWr w;
      w.wr_id = posted;
      w.opcode = Opcode::kWrite;
      w.flags = kSignaled;
      w.length = kChunk;
      w.local_addr = a.mr->data();
      w.lkey = a.mr->lkey();
      w.remote_addr = rr.addr + (posted % 8) * kChunk;
      w.rkey = rr.rkey;
      if (!a.qp->post_send(w).ok()) break;
      ++posted;
    }
    poll1(*a.cq);
    ++done;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t1).count();
  stop = true;
  target.join();
  std::printf("1 MiB WRITE, 8 in flight: %.2f Gbit/s (%d writes)\n",
              writes * double(kChunk) * 8 / secs / 1e9, writes);
  a.qp.reset();
  b.qp.reset();
  return 0;
}
