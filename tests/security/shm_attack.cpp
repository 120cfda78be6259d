// Target, genuine client and attacker for the shm provider's isolation
// between users (tests/security/shm_attack_test.sh runs them as two uids).
//   target PORT_FILE SECONDS  serves echo; at exit checks that nothing it
//                             never granted changed (guard bytes); exit 0 = intact
//   genuine PORT              same-user client: echoes and a granted READ, verified
//   refused PORT              another user against a target that admits none
//   attack PORT               another user against a target that admits it
//   squat PORT SECONDS        holds the port's name; exit 0 if no peer handed it a
//                             descriptor
//   listen-squatted PORT      listening on a taken name names its holder
//   connect-squatted PORT     connecting to another user's name is refused
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#include "shm_raw_peer.hpp"

using namespace rdmakit;
using namespace std::chrono_literals;
namespace raw = rdmakit::shm::attack;

namespace {

constexpr uint32_t kMsg = 100;      // > one slot's inline bytes: the payload path
constexpr uint32_t kRecvLen = 128;  // each posted RECV
constexpr uint32_t kGuard = 64;     // guard bytes either side of each RECV buffer
constexpr uint32_t kRecvs = 4;      // per connection
constexpr uint32_t kMaxConns = 32;
constexpr uint32_t kStride = kGuard + kRecvLen + kGuard;

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::unique_ptr<Context> open_shm() {
  ContextOptions o;
  o.provider = ProviderKind::kShm;
  return Context::open(o);
}

bool all_bytes(const void* p, size_t n, char c) {
  const auto* b = static_cast<const char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != c) return false;
  return true;
}

char g_user_memory[4096];

int target(const std::string& port_file, int seconds) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq({.capacity = 1024});
  auto ro = ctx->allocate(4096, kAccessLocalWrite | kAccessRemoteRead);
  auto rw = ctx->allocate(4096, kAccessLocalWrite | kAccessRemoteWrite);
  auto secret = ctx->allocate(4096, kAccessLocalWrite);
  std::memset(ro->data(), 'R', 4096);
  std::memset(secret->data(), 'S', 4096);
  std::memset(g_user_memory, 'U', sizeof g_user_memory);
  auto user = ctx->register_memory(
      g_user_memory, sizeof g_user_memory,
      kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteWrite | kAccessRemoteAtomic);
  // Atomics only: another user may add to its first word, never map it.
  auto counter = ctx->allocate(4096, kAccessLocalWrite | kAccessRemoteAtomic);
  std::memset(counter->data(), 'C', 4096);
  const uint64_t counter_start = *reinterpret_cast<const uint64_t*>(counter->data());
  auto recv_area = ctx->allocate(kMaxConns * kRecvs * kStride, kAccessLocalWrite);
  std::memset(recv_area->data(), 'G', recv_area->length());
  auto send_area = ctx->allocate(kMaxConns * kRecvLen, kAccessLocalWrite);
  auto listener = ctx->listen("127.0.0.1:0");
  std::vector<std::byte> grants;
  for (auto* mr : {ro.get(), rw.get(), user.get(), counter.get()}) {
    const auto blob = mr->remote().serialize();
    grants.insert(grants.end(), blob.begin(), blob.end());
  }
  {
    std::ofstream(port_file + ".tmp") << listener->port() << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  std::vector<std::unique_ptr<QueuePair>> conns;
  auto recv_buf = [&](uint32_t conn, uint32_t i) {
    return static_cast<std::byte*>(recv_area->data()) + (conn * kRecvs + i) * kStride +
           kGuard;
  };
  auto post = [&](uint32_t conn, uint32_t i) {
    RecvWr wr{.wr_id = conn * kRecvs + i,
              .addr = recv_buf(conn, i),
              .length = kRecvLen,
              .lkey = recv_area->lkey()};
    std::memset(wr.addr, 0, kRecvLen);
    (void)conns[conn]->post_recv({&wr, 1});
  };
  int errors = 0, echoes = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end &&
         ::access((port_file + ".stop").c_str(), F_OK) != 0) {
    if (conns.size() < kMaxConns) {
      try {
        auto qp = listener->accept({.send_cq = cq.get(),
                                    .recv_cq = cq.get(),
                                    .max_send_wr = 16,
                                    .max_recv_wr = kRecvs},
                                   50ms, grants);
        conns.push_back(std::move(qp));
        for (uint32_t i = 0; i < kRecvs; ++i)
          post(static_cast<uint32_t>(conns.size() - 1), i);
      } catch (const Error& e) {
        if (e.sys_errno() != ETIMEDOUT) std::printf("target: accept: %s\n", e.what());
      }
    }
    Completion c[16];
    for (int round = 0; round < 20; ++round) {
      const int n = cq->poll(c);
      for (int k = 0; k < n; ++k) {
        if (c[k].opcode == Opcode::kSend) continue;
        const auto conn = static_cast<uint32_t>(c[k].wr_id / kRecvs);
        const auto i = static_cast<uint32_t>(c[k].wr_id % kRecvs);
        if (conn >= conns.size() || !conns[conn]) continue;
        if (!c[k].ok()) {
          ++errors;
          std::printf("target: connection %u: %s (byte_len %u)\n", conn,
                      status_name(c[k].status), c[k].byte_len);
          if (c[k].status != Status::kWrFlushError) post(conn, i);
          continue;
        }
        // Echo what arrived; the buffer is ours and bounded by kRecvLen.
        auto* out = static_cast<std::byte*>(send_area->data()) + conn * kRecvLen;
        std::memcpy(out, recv_buf(conn, i), c[k].byte_len);
        SendWr wr{.wr_id = 1u << 20,
                  .opcode = Opcode::kSend,
                  .flags = kSignaled,
                  .length = c[k].byte_len,
                  .local_addr = out,
                  .lkey = send_area->lkey()};
        if (conns[conn]->post_send({&wr, 1}).ok()) ++echoes;
        post(conn, i);
      }
      if (n == 0) std::this_thread::sleep_for(1ms);
    }
  }
  std::printf("target: %zu connections, %d echoes, %d error completions\n", conns.size(),
              echoes, errors);
  conns.clear();
  check(all_bytes(ro->data(), 4096, 'R'), "target: the read-only grant is unchanged");
  check(all_bytes(secret->data(), 4096, 'S'),
        "target: the never-granted region is unchanged");
  check(all_bytes(g_user_memory, sizeof g_user_memory, 'U'),
        "target: register_memory() memory is unchanged");
  const auto* words = reinterpret_cast<const uint64_t*>(counter->data());
  const char* adds = std::getenv("RDMAKIT_TEST_EXPECT_ADDS");
  const uint64_t expected_adds = adds != nullptr ? std::strtoull(adds, nullptr, 10) : 0;
  check(words[0] == counter_start + expected_adds &&
            all_bytes(counter->data() + 8, 4088, 'C'),
        "target: the atomic-only grant changed only by the expected FETCH_ADDs of its "
        "first word");
  bool guards = true;
  for (uint32_t b = 0; b < kMaxConns * kRecvs; ++b) {
    const auto* base = static_cast<const std::byte*>(recv_area->data()) + b * kStride;
    guards = guards && all_bytes(base, kGuard, 'G') &&
             all_bytes(base + kGuard + kRecvLen, kGuard, 'G');
  }
  check(guards, "target: no byte outside a posted RECV buffer was written");
  return failures == 0 ? 0 : 1;
}

struct Client {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<MemoryRegion> mem;
  std::unique_ptr<QueuePair> qp;
  std::vector<RemoteRegion> grants;
};

Client connect_client(uint16_t port) {
  Client c;
  c.ctx = open_shm();
  c.cq = c.ctx->create_cq();
  c.mem = c.ctx->allocate(8192, kAccessLocalWrite);
  c.qp = c.ctx->connect("127.0.0.1:" + std::to_string(port),
                        {.send_cq = c.cq.get(), .recv_cq = c.cq.get()});
  const auto pd = c.qp->peer_private_data();
  for (size_t off = 0; off + RemoteRegion::kSerializedSize <= pd.size();
       off += RemoteRegion::kSerializedSize) {
    c.grants.push_back(
        *RemoteRegion::deserialize(pd.subspan(off, RemoteRegion::kSerializedSize)));
  }
  return c;
}

Completion one(Client& c, const SendWr& wr) {
  Completion done{};
  done.status = Status::kGeneralError;
  if (!c.qp->post_send({&wr, 1}).ok()) return done;
  (void)c.cq->wait({&done, 1}, 5s);
  return done;
}

// Echo round trips over the payload path and a granted READ, all verified.
bool echo_and_read(Client& c, int rounds) {
  auto* buf = static_cast<std::byte*>(c.mem->data());
  for (int r = 0; r < rounds; ++r) {
    RecvWr rwr{.wr_id = 7, .addr = buf + 4096, .length = kRecvLen, .lkey = c.mem->lkey()};
    (void)c.qp->post_recv({&rwr, 1});
    std::memset(buf, 'a' + r, kMsg);
    if (!one(c, {.wr_id = 1,
                 .opcode = Opcode::kSend,
                 .flags = kSignaled,
                 .length = kMsg,
                 .local_addr = buf,
                 .lkey = c.mem->lkey()})
             .ok())
      return false;
    Completion in{};
    if (c.cq->wait({&in, 1}, 5s) != 1 || !in.ok() || in.byte_len != kMsg ||
        !all_bytes(buf + 4096, kMsg, static_cast<char>('a' + r)))
      return false;
  }
  const Completion rd = one(c, {.wr_id = 2,
                                .opcode = Opcode::kRead,
                                .flags = kSignaled,
                                .length = 64,
                                .local_addr = buf,
                                .lkey = c.mem->lkey(),
                                .remote_addr = c.grants[0].addr,
                                .rkey = c.grants[0].rkey});
  return rd.ok() && all_bytes(buf, 64, 'R');
}

int genuine(uint16_t port) {
  Client c = connect_client(port);
  check(echo_and_read(c, 3),
        "genuine: 3 echoes of 100 bytes and a granted READ verified");
  return failures == 0 ? 0 : 1;
}

int refused(uint16_t port) {
  try {
    Client c = connect_client(port);
    check(false, "refused: another user's connect was refused");
  } catch (const Error& e) {
    const std::string what = e.what();
    std::printf("refused: %s\n", what.c_str());
    check(e.sys_errno() == EACCES &&
              what.find("we run as uid " + std::to_string(::geteuid())) !=
                  std::string::npos &&
              what.find("of uid 0,") != std::string::npos &&
              what.find("RDMAKIT_SHM_ALLOW_UIDS") != std::string::npos,
          "refused: EACCES naming both uids and the opt-in");
  }
  return failures == 0 ? 0 : 1;
}

void try_to_write(int fd, const std::string& what) {
  const std::string name = what;
  void* w = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  check(w == MAP_FAILED, name + ": mmap(PROT_WRITE) refused");
  void* r = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  if (r != MAP_FAILED) {
    check(::mprotect(r, 4096, PROT_READ | PROT_WRITE) != 0,
          name + ": mprotect(PROT_WRITE) refused");
    ::munmap(r, 4096);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int rw = ::open(path.c_str(), O_RDWR);
  if (rw >= 0) {
    check(::write(rw, "X", 1) != 1, name + ": write() through a /proc reopen refused");
    void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    check(m == MAP_FAILED, name + ": writable mmap of a /proc reopen refused");
    ::close(rw);
  } else {
    check(true, name + ": /proc reopen for writing refused");
  }
}

int attack(uint16_t port) {
  // 1. Through the API: what was granted works, nothing else does.
  {
    Client c = connect_client(port);
    check(echo_and_read(c, 1), "attack: admitted, the granted READ and echo work");
    auto* buf = static_cast<std::byte*>(c.mem->data());
    const Completion w = one(c, {.wr_id = 3,
                                 .opcode = Opcode::kWrite,
                                 .flags = kSignaled,
                                 .length = 8,
                                 .local_addr = buf,
                                 .lkey = c.mem->lkey(),
                                 .remote_addr = c.grants[0].addr,
                                 .rkey = c.grants[0].rkey});
    check(w.status == Status::kRemoteAccessError,
          std::string("attack: WRITE to the read-only grant: ") + status_name(w.status));
  }
  {
    Client c = connect_client(port);
    auto* buf = static_cast<std::byte*>(c.mem->data());
    const Completion a = one(c, {.wr_id = 5,
                                 .opcode = Opcode::kFetchAdd,
                                 .flags = kSignaled,
                                 .length = 8,
                                 .local_addr = buf,
                                 .lkey = c.mem->lkey(),
                                 .remote_addr = c.grants[3].addr,
                                 .rkey = c.grants[3].rkey,
                                 .compare_add = 1});
    check(a.ok(), std::string("attack: FETCH_ADD on the atomic-only grant (the owner "
                              "performs it): ") +
                      status_name(a.status));
  }
  {
    Client c = connect_client(port);
    auto* buf = static_cast<std::byte*>(c.mem->data());
    const Completion r = one(c, {.wr_id = 4,
                                 .opcode = Opcode::kRead,
                                 .flags = kSignaled,
                                 .length = 64,
                                 .local_addr = buf,
                                 .lkey = c.mem->lkey(),
                                 .remote_addr = c.grants[2].addr,
                                 .rkey = c.grants[2].rkey});
    check(r.status == Status::kRemoteAccessError,
          std::string("attack: READ of register_memory() memory: ") +
              status_name(r.status));
  }
  // 2. By hand: ask for every live region, and try to make grants writable.
  {
    raw::RawPeer p;
    check(p.connect(port, true), "attack: raw handshake " + p.error);
    if (p.table == nullptr) return 1;
    int handed = 0, live = 0;
    for (uint32_t i = 0; i < shm::kRegionTableSize; ++i) {
      const uint32_t key = p.table->entries[i].key.load();
      if (key == 0) continue;
      ++live;
      bool writable = false;
      rdmakit::core::Fd fd = p.get_region(key, &writable);
      if (!fd) continue;
      ++handed;
      const uint32_t access = p.table->entries[i].access.load();
      check(
          (access & (kAccessRemoteRead | kAccessRemoteWrite | kAccessRemoteAtomic)) != 0,
          "attack: region " + std::to_string(key) +
              " handed out only with a remote grant");
      if (!writable) try_to_write(fd.get(), "read-only grant " + std::to_string(key));
    }
    std::printf("attack: %d live regions, %d handed out\n", live, handed);
    check(handed == 2,
          "attack: exactly the read-only and read-write grants were handed out (not the "
          "atomic-only one, nor register_memory() memory, nor the never-granted one)");
    for (uint32_t i = 0; i < shm::kRegionTableSize; ++i) {
      const auto& e = p.table->entries[i];
      if (e.key.load() == 0 ||
          e.kind.load() != static_cast<uint32_t>(shm::RegionKind::kUser))
        continue;
      const uint32_t st =
          p.atomic(shm::RequestOp::kFetchAdd, e.key.load(), e.addr.load(), 1);
      check(st == static_cast<uint32_t>(Status::kRemoteAccessError),
            "attack: FETCH_ADD on register_memory() memory by hand is refused by the "
            "target");
    }
    // The wake socket we hold: blocking it and filling it must not stall the
    // target (an eventfd shares its flags and counter with whoever holds it).
    ::fcntl(p.cq_event.get(), F_SETFL, 0);
    int sent = 0;
    while (sent < 100000 && ::send(p.cq_event.get(), "x", 1, MSG_DONTWAIT) == 1) ++sent;
    std::printf("attack: %d wake-ups sent, the target's wake socket is full\n", sent);
    try_to_write(p.table_fd.get(), "the target's region table");
    check(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p.table_fd.get(),
                 0) == MAP_FAILED,
          "attack: the region table cannot be mapped writable");
    // 3. Lying byte_len, opcode and payload location in the target's ring.
    // One lie per message, each alone: a 4 GiB length, a payload said to be on
    // the socket that is not, a bogus opcode, a bogus status, and a payload
    // said to be in the buffer, which a peer with a payload socket never
    // writes (stale memory passed off as a message).
    const auto recv = static_cast<uint8_t>(Opcode::kRecv);
    struct Lie {
      uint32_t len;
      uint8_t where, opcode, status;
      uint32_t socket_bytes = 0;  // what really goes on the payload socket
    };
    const Lie lies[] = {{0xfffffff0u, shm::kPayloadInBuffer, recv, 0},
                        {kMsg, shm::kPayloadOnSocket, recv, 0},
                        {8, shm::kPayloadInSlot, 0xee, 0},
                        {8, shm::kPayloadInSlot, recv, 0x77},
                        {8, shm::kPayloadInBuffer, recv, 0},
                        // A socket message longer than it says, and than the buffer.
                        {kMsg, shm::kPayloadOnSocket, recv, 0, 3 * kRecvLen}};
    // Each lie on a connection of its own: the first error completion puts a
    // QP in the error state, as on a NIC.
    for (const Lie& lie : lies) {
      raw::RawPeer liar;
      if (!liar.connect(port, true)) {
        check(false, "attack: raw handshake for a lie " + liar.error);
        continue;
      }
      for (int i = 0; i < 400 && liar.block->slots()[0].post_seq.load() != 1; ++i)
        std::this_thread::sleep_for(5ms);
      if (lie.socket_bytes != 0) {
        std::vector<char> junk(lie.socket_bytes, 'J');
        (void)::send(liar.payload_socket.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
      }
      liar.publish(0, lie.len, lie.where, lie.opcode, lie.status);
      std::this_thread::sleep_for(100ms);
    }
    std::this_thread::sleep_for(200ms);
  }
  // 4. Confused deputy. A peer of another user that offers no payload socket
  // (so that the target would write its SENDs into buffers the peer names)
  // is refused at the handshake.
  {
    raw::RawPeer p;
    check(!p.connect(port, false),
          "attack: a handshake without a payload socket is refused (" + p.error + ")");
  }
  // With one, our receive slot names a buffer of our own that our forged
  // table calls register_memory() memory: the target's echo must come over
  // the socket, never through process_vm_writev into an address we named.
  {
    raw::RawPeer p;
    check(p.connect(port, true), "attack: raw handshake " + p.error);
    if (p.table == nullptr) return 1;
    static char bait[4096];
    std::memset(bait, 'B', sizeof bait);
    const uint32_t forged_key = (1u << shm::kRegionIndexBits) | 5;
    auto& fe = p.own_table->entries[5];
    fe.access.store(kAccessLocalWrite | kAccessRemoteWrite);
    fe.kind.store(static_cast<uint32_t>(shm::RegionKind::kUser));
    fe.addr.store(reinterpret_cast<uint64_t>(bait));
    fe.length.store(sizeof bait);
    fe.key.store(forged_key);
    auto& slot = p.own_block->slots()[0];
    slot.addr = reinterpret_cast<uint64_t>(bait);
    slot.length = kRecvLen;
    slot.lkey = forged_key;
    slot.post_seq.store(1);
    for (int i = 0; i < 400 && p.block->slots()[0].post_seq.load() != 1; ++i)
      std::this_thread::sleep_for(5ms);
    char msg[kMsg];
    std::memset(msg, 'D', sizeof msg);
    check(::send(p.payload_socket.get(), msg, sizeof msg, MSG_NOSIGNAL) == kMsg,
          "attack: message sent over the target's payload socket");
    p.publish(0, kMsg, shm::kPayloadOnSocket, static_cast<uint8_t>(Opcode::kRecv), 0);
    char echo[kRecvLen];
    ssize_t got = -1;
    for (int i = 0; i < 400 && got < 0; ++i) {
      got = ::recv(p.own_payload_rx.get(), echo, sizeof echo, MSG_DONTWAIT);
      if (got < 0) std::this_thread::sleep_for(5ms);
    }
    check(got == kMsg && all_bytes(echo, kMsg, 'D'),
          "attack: the echo arrived over our payload socket");
    check(all_bytes(bait, sizeof bait, 'B'),
          "attack: nothing was written into the buffer our slot named");
  }
  return failures == 0 ? 0 : 1;
}

std::string abstract(uint16_t port) { return rdmakit::shm::abstract_name(port); }

int squat(uint16_t port, int seconds) {
  rdmakit::core::Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract(port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&sa),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) !=
          0 ||
      ::listen(s.get(), 8) != 0) {
    std::printf("squat: bind failed: %s\n", std::strerror(errno));
    return 2;
  }
  std::printf("squatting\n");
  std::fflush(stdout);
  int received = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  ::fcntl(s.get(), F_SETFL, O_NONBLOCK);
  while (std::chrono::steady_clock::now() < end) {
    rdmakit::core::Fd c(::accept4(s.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    rdmakit::shm::Hello h{};
    rdmakit::core::Fd fds[8];
    size_t nfds = 0;
    (void)rdmakit::shm::recv_with_fds(c.get(), &h, sizeof h, fds, &nfds, 500ms);
    received += static_cast<int>(nfds);
  }
  std::printf("squat: received %d descriptors\n", received);
  return received == 0 ? 0 : 1;
}

int listen_squatted(uint16_t port) {
  auto ctx = open_shm();
  try {
    auto l = ctx->listen("127.0.0.1:" + std::to_string(port));
    check(false, "listen-squatted: listening on a taken name failed");
  } catch (const Error& e) {
    std::printf("listen-squatted: %s\n", e.what());
    check(std::string(e.what()).find("another user") != std::string::npos,
          "listen-squatted: the error names the other user holding the name");
  }
  return failures == 0 ? 0 : 1;
}

int connect_squatted(uint16_t port) {
  try {
    Client c = connect_client(port);
    check(false, "connect-squatted: connecting to another user's listener was refused");
  } catch (const Error& e) {
    std::printf("connect-squatted: %s\n", e.what());
    check(e.sys_errno() == EACCES &&
              std::string(e.what()).find("taken") != std::string::npos,
          "connect-squatted: refused before anything was sent, saying the name may be "
          "taken");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODE ARG...\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "target") return target(argv[2], argc > 3 ? std::atoi(argv[3]) : 30);
    const auto port = static_cast<uint16_t>(std::atoi(argv[2]));
    if (mode == "genuine") return genuine(port);
    if (mode == "refused") return refused(port);
    if (mode == "attack") return attack(port);
    if (mode == "squat") return squat(port, argc > 3 ? std::atoi(argv[3]) : 10);
    if (mode == "listen-squatted") return listen_squatted(port);
    if (mode == "connect-squatted") return connect_squatted(port);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
