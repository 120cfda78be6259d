// Link-cut liveness check for the tcp provider, one role per process (run by
// netns_test.sh in two network namespaces joined by a veth pair):
//   tcp_linkcut server HOST:PORT
//   tcp_linkcut client HOST:PORT "CUT COMMAND"
// The client streams 1 MiB WRITEs and small SENDs, runs the cut command
// mid-transfer, and requires every outstanding request to complete with an
// error within peer_timeout + slack. The server requires its posted RECVs to
// flush within the same bound after traffic stops. Exit 0 = pass.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "rdmakit/rdmakit.hpp"

using namespace rdmakit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPeerTimeout = 1000ms;
constexpr auto kSlack = 700ms;  // one heartbeat period plus scheduling
constexpr uint32_t kChunk = 1 << 20;
constexpr int kDepth = 8;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

QpOptions options(CompletionQueue* cq) {
  QpOptions o;
  o.send_cq = o.recv_cq = cq;
  o.max_send_wr = 64;
  o.max_recv_wr = 64;
  o.peer_timeout = kPeerTimeout;
  o.rnr_timeout = 2000ms;
  return o;
}

int server(const std::string& address) {
  ContextOptions co;
  co.provider = ProviderKind::kTcp;
  auto ctx = Context::open(co);
  auto cq = ctx->create_cq();
  auto region = ctx->allocate(size_t{kChunk} * 2, kAccessAll);
  auto listener = ctx->listen(address);
  std::printf("server: listening on %s\n", listener->address().c_str());
  std::fflush(stdout);
  const auto blob = region->remote().serialize();
  auto qp = listener->accept(options(cq.get()), 30s, blob);
  for (int i = 0; i < 64; ++i) {
    RecvWr r{uint64_t(i), region->data() + i * 64, 64, region->lkey()};
    if (!qp->post_recv(r).ok()) return 2;
  }
  auto last_ok = Clock::now();
  int received = 0;
  const auto give_up = Clock::now() + 60s;
  Completion c[16];
  while (Clock::now() < give_up) {
    const int n = cq->wait(c, 100ms);
    for (int i = 0; i < n; ++i) {
      if (c[i].ok()) {
        ++received;
        last_ok = Clock::now();
        RecvWr r{c[i].wr_id, region->data() + c[i].wr_id * 64, 64, region->lkey()};
        (void)qp->post_recv(r);
        continue;
      }
      const double after = ms_since(last_ok);
      std::printf("server: %d SENDs received; error %s %.0f ms after the last one\n",
                  received, status_name(c[i].status), after);
      const bool in_bound =
          after <=
          std::chrono::duration<double, std::milli>(kPeerTimeout + kSlack).count();
      return received > 0 && in_bound ? 0 : 1;
    }
  }
  std::printf("server: no error within 60 s: liveness broken\n");
  return 1;
}

int client(const std::string& address, const std::string& cut) {
  ContextOptions co;
  co.provider = ProviderKind::kTcp;
  auto ctx = Context::open(co);
  auto cq = ctx->create_cq();
  auto local = ctx->allocate(kChunk, kAccessAll);
  std::unique_ptr<QueuePair> qp;
  for (int attempt = 0; attempt < 100 && !qp; ++attempt) {
    try {
      qp = ctx->connect(address, options(cq.get()));
    } catch (const Error& e) {
      if (e.sys_errno() != ECONNREFUSED) throw;
      std::this_thread::sleep_for(50ms);  // server not listening yet
    }
  }
  if (!qp) return 2;
  const auto remote = RemoteRegion::deserialize(qp->peer_private_data());
  if (!remote) return 2;
  uint64_t posted = 0, completed = 0, ok = 0;
  auto post_one = [&](uint64_t id) {
    SendWr w;
    w.wr_id = id;
    w.flags = kSignaled;
    if (id % 2 == 0) {
      w.opcode = Opcode::kWrite;
      w.length = kChunk;
      w.remote_addr = remote->addr + (id / 2 % 2) * kChunk;
      w.rkey = remote->rkey;
    } else {
      w.opcode = Opcode::kSend;
      w.length = 16;
    }
    w.local_addr = local->data();
    w.lkey = local->lkey();
    if (qp->post_send(w).ok()) ++posted;
  };
  // A RECV the server never consumes: the QP's death always shows up here,
  // even at a moment with no request in flight.
  if (!qp->post_recv(RecvWr{~0ull, local->data(), 64, local->lkey()}).ok()) return 2;
  ++posted;
  for (int i = 0; i < kDepth; ++i) post_one(posted);
  const auto start = Clock::now();
  Clock::time_point cut_at{};
  bool cut_done = false;
  Completion c[16];
  Clock::time_point first_error{};
  while (completed < posted) {
    if (!cut_done && ms_since(start) > 500) {
      std::printf("client: %lu requests done, cutting the link: %s\n",
                  static_cast<unsigned long>(ok), cut.c_str());
      std::fflush(stdout);
      cut_at = Clock::now();
      if (std::system(cut.c_str()) != 0) return 2;
      cut_done = true;
    }
    if (cut_done && ms_since(cut_at) > 30'000) {
      std::printf("client: %lu of %lu requests still outstanding after 30 s: hang\n",
                  static_cast<unsigned long>(posted - completed),
                  static_cast<unsigned long>(posted));
      return 1;
    }
    const int n = cq->wait(c, 50ms);
    for (int i = 0; i < n; ++i) {
      ++completed;
      if (c[i].ok()) {
        ++ok;
        // Keep the pipe full until the cut is noticed.
        if (first_error == Clock::time_point{}) post_one(posted);
      } else if (first_error == Clock::time_point{}) {
        first_error = Clock::now();
        std::printf("client: first error %s %.0f ms after the cut\n",
                    status_name(c[i].status), ms_since(cut_at));
      }
    }
  }
  if (!cut_done || first_error == Clock::time_point{}) return 1;
  const double detect =
      std::chrono::duration<double, std::milli>(first_error - cut_at).count();
  const double bound =
      std::chrono::duration<double, std::milli>(kPeerTimeout + kSlack).count();
  std::printf(
      "client: all %lu requests completed (%lu ok), error after %.0f ms (bound %.0f)\n",
      static_cast<unsigned long>(posted), static_cast<unsigned long>(ok), detect, bound);
  return detect <= bound && qp->state() == QpState::kError ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "server") == 0) return server(argv[2]);
  if (argc >= 4 && std::strcmp(argv[1], "client") == 0) return client(argv[2], argv[3]);
  std::fprintf(stderr, "usage: %s server HOST:PORT | client HOST:PORT CUT_COMMAND\n",
               argv[0]);
  return 2;
}
