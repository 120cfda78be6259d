// libFuzzer target: the tcp provider's frame decoder and target-side request
// handling, driven through the real queue pair over a socketpair. The input
// is the byte stream a hostile peer sends; the harness plays that peer.
//
// Input: byte 0 = flags (bit 0: post requests first so responses have
// something to match; bit 1: post RECVs; bit 2: the QP takes its RECVs from
// a shared receive queue, where bit 1 posts them), then the stream. To let the fuzzer
// reach the success paths, a frame whose rkey is 0..2 gets the real rkey of
// test region 0..2 and, if its address is below 64 KiB, the region's base
// added (frames are walked the way the engine walks them).
//
// Checked: no crash or sanitizer report, no byte changed outside the
// registered regions (guard pages around the arena), bounded time.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "providers/tcp/tcp_provider.hpp"

namespace {

using namespace rdmakit;
using namespace rdmakit::tcp;

constexpr size_t kGuard = 4096;
constexpr size_t kArena = 65536;
constexpr uint8_t kGuardByte = 0xcc;

struct State {
  std::unique_ptr<TcpContext> ctx;
  std::byte* arena = nullptr;  // guard | regions | guard
  std::unique_ptr<MemoryRegion> mr[3];
  uint64_t base[3] = {};
};

State& state() {
  static State* s = [] {
    auto* st = new State;
    st->ctx = std::make_unique<TcpContext>(/*progress_thread=*/false);
    st->ctx->progress()->mrs().reseed_for_testing(1);
    st->arena = static_cast<std::byte*>(std::aligned_alloc(4096, kGuard * 2 + kArena));
    std::memset(st->arena, kGuardByte, kGuard * 2 + kArena);
    std::byte* mid = st->arena + kGuard;
    // 0: everything; 1: remote read only; 2: local sinks only.
    st->mr[0] = st->ctx->register_memory(mid, 32768, kAccessAll);
    st->mr[1] = st->ctx->register_memory(mid + 32768, 16384, kAccessRemoteRead);
    st->mr[2] = st->ctx->register_memory(mid + 49152, 16384, kAccessLocalWrite);
    for (int i = 0; i < 3; ++i)
      st->base[i] = reinterpret_cast<uint64_t>(st->mr[i]->addr());
    return st;
  }();
  return *s;
}

void patch(std::vector<std::byte>& wire, const State& st) {
  size_t i = 0;
  while (i + kHeaderSize <= wire.size()) {
    std::byte* h = wire.data() + i;
    uint32_t rkey, len;
    uint64_t addr;
    std::memcpy(&rkey, h + 24, 4);
    std::memcpy(&addr, h + 16, 8);
    std::memcpy(&len, h + 4, 4);
    if (rkey < 3) {
      const uint32_t real = st.mr[rkey]->rkey();
      std::memcpy(h + 24, &real, 4);
      if (addr < kArena) {
        addr += st.base[rkey];
        std::memcpy(h + 16, &addr, 8);
      }
    }
    i += kHeaderSize;
    if (len > wire.size() - i) break;
    i += len;
  }
}

void post_requests(QueuePair& qp, const State& st) {
  const MemoryRegion& sink = *st.mr[2];
  SendWr w;
  w.flags = kSignaled;
  w.lkey = sink.lkey();
  w.local_addr = sink.data();
  w.rkey = 12345;
  w.remote_addr = 0x1000;
  const Opcode ops[] = {Opcode::kRead, Opcode::kWrite, Opcode::kFetchAdd,
                        Opcode::kSend, Opcode::kRead,  Opcode::kCompareSwap};
  const uint32_t lens[] = {64, 16, 8, 32, 8192, 8};
  for (int i = 0; i < 6; ++i) {
    w.wr_id = i;
    w.opcode = ops[i];
    w.length = lens[i];
    (void)qp.post_send(w);
  }
}

template <typename Queue>  // QueuePair or SharedReceiveQueue
void post_recvs(Queue& q, const State& st) {
  const MemoryRegion& sink = *st.mr[2];
  const uint32_t lens[] = {8, 64, 4096, 16384};
  for (int i = 0; i < 4; ++i) {
    (void)q.post_recv(RecvWr{uint64_t(100 + i), sink.data(), lens[i], sink.lkey()});
  }
  // A RECV with a key that names nothing: the engine must refuse to use it.
  (void)q.post_recv(RecvWr{200, sink.data(), 64, 0xdead0001});
}

void drain(int fd) {
  std::byte sink[65536];
  for (int i = 0; i < 64; ++i) {
    if (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) <= 0) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("RDMAKIT_LOG", "off", 1);  // connection errors are the point here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 20)) return 0;
  // The handshake decoder sees the same bytes.
  (void)decode_hello({reinterpret_cast<const std::byte*>(data + 1), size - 1}, 192);

  State& st = state();
  const uint8_t flags = data[0];
  std::vector<std::byte> wire(reinterpret_cast<const std::byte*>(data + 1),
                              reinterpret_cast<const std::byte*>(data + size));
  patch(wire, st);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
  CqOptions cqo;
  cqo.capacity = 1024;
  auto cq = st.ctx->create_cq(cqo);
  QpOptions o;
  o.send_cq = o.recv_cq = cq.get();
  o.max_send_wr = 16;
  o.max_recv_wr = 16;
  o.peer_timeout = std::chrono::milliseconds(1'000'000);  // no time dependence
  // rnr 0: a SEND without a RECV is refused at once instead of stalling.
  const Hello peer{16, 16, 0, 1'000'000, 0};
  std::unique_ptr<SharedReceiveQueue> srq;
  if (flags & 4) {
    srq = st.ctx->create_srq({.max_wr = 16});
    o.srq = srq.get();
  }
  auto qp = st.ctx->adopt(sv[0], o, peer, "fuzz-peer");
  if (flags & 1) post_requests(*qp, st);
  if (flags & 2) {
    if (srq) {
      post_recvs(*srq, st);
    } else {
      post_recvs(*qp, st);
    }
  }

  Completion out[64];
  size_t off = 0;
  bool closed = false;
  int after_close = 0;
  // Bounded: every round either writes, or the stream is closed; after the
  // close the QP sees EOF and dies within a few rounds.
  for (int round = 0; round < 100000; ++round) {
    if (off < wire.size()) {
      const ssize_t w = ::send(sv[1], wire.data() + off, wire.size() - off,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) off += static_cast<size_t>(w);
    } else if (!closed) {
      ::shutdown(sv[1], SHUT_WR);
      closed = true;
    }
    drain(sv[1]);
    while (cq->poll(out) > 0) {
    }
    // After EOF the QP dies within a round or two; a QP already in error
    // (after a NAK) still consumes the stream, so give it a few rounds more.
    if (closed && qp->state() != QpState::kConnected && ++after_close > 16) break;
  }
  qp.reset();
  srq.reset();  // after its QP, as the API requires
  while (cq->poll(out) > 0) {
  }
  cq.reset();
  ::close(sv[1]);

  for (size_t i = 0; i < kGuard; ++i) {
    if (st.arena[i] != std::byte{kGuardByte} ||
        st.arena[kGuard + kArena + i] != std::byte{kGuardByte}) {
      std::abort();  // a write escaped the registered regions
    }
  }
  return 0;
}
