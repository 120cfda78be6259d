// A peer process shares memory with us: its region table, its receive ring,
// the memfds it hands over. Whatever it writes there must not direct our
// writes outside what we mapped, resize what we mapped, or stall the progress
// thread that serves every peer of the context. Each case plays the hostile
// peer in-process through the provider's internals.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_qp.hpp"
#include "rdmakit/rdmakit.hpp"
#include "shm_in_process.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;

// A raw shm listener on an abstract socket, for a peer that handshakes by hand.
struct RawListener {
  explicit RawListener(uint16_t p) : port(p), fd(::socket(AF_UNIX, SOCK_SEQPACKET, 0)) {
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    const std::string name = abstract_name(port);
    std::memcpy(sa.sun_path, name.data(), name.size());
    ok = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa),
                static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) ==
             0 &&
         ::listen(fd.get(), 4) == 0;
  }
  uint16_t port;
  Fd fd;
  bool ok = false;
};

// This process's descriptors whose target names `what` (memfds we made, as
// a peer holding them would see them), with that target.
std::vector<std::pair<int, std::string>> open_memfds(const std::string& what) {
  std::vector<std::pair<int, std::string>> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string link = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && link.find(what) != std::string::npos) {
      found.emplace_back(std::stoi(e.path().filename().string()), link);
    }
  }
  return found;
}

// Each memfd this process has mapped but holds no descriptor of (a QP
// closes its own once mapped), opened again through /proc/self/map_files:
// the same file a peer's descriptor names, read-write where the mapping is.
std::vector<std::pair<int, std::string>> reopen_mapped_memfds(const std::string& what) {
  std::vector<std::pair<int, std::string>> found;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& [fd, link] : open_memfds(what)) {
    struct stat st {};
    if (::fstat(fd, &st) == 0) seen.emplace(st.st_dev, st.st_ino);
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(what) == std::string::npos) continue;
    const std::string range = line.substr(0, line.find(' '));
    const bool writable = line.size() > range.size() + 2 && line[range.size() + 2] == 'w';
    const std::string path = "/proc/self/map_files/" + range;
    const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !seen.emplace(st.st_dev, st.st_ino).second) {
      ::close(fd);
      continue;
    }
    found.emplace_back(fd, line.substr(line.find('/')));
  }
  return found;
}

uint16_t scratch_port() { return static_cast<uint16_t>(40000 + ::getpid() % 20000); }

// The peer rewrites the address and length of a live entry of its region
// table after we mapped the region: our WRITE must stay inside our mapping.
// (It landed anywhere in our process: the offset came from the live entry.)
TEST(ShmHostilePeerTest, RewrittenTableEntryCannotRedirectAWrite) {
  auto victim = open_shm();
  auto peer = open_shm();
  auto victim_cq = victim->create_cq();
  auto peer_cq = peer->create_cq();
  auto src = victim->allocate(4096, kAccessAll);
  auto target = peer->allocate(4096, kAccessRemoteWrite | kAccessLocalWrite);
  Pair p = connect_pair(*victim, *peer,
                        {.send_cq = victim_cq.get(), .recv_cq = victim_cq.get()},
                        {.send_cq = peer_cq.get(), .recv_cq = peer_cq.get()});
  std::memcpy(src->data(), "PWNED!!!", 8);
  const auto target_addr = reinterpret_cast<uint64_t>(target->data());
  ASSERT_TRUE(p.a->post_send(write_wr(1, *src, target_addr, target->rkey())).ok());
  Completion c[4];
  ASSERT_EQ(victim_cq->poll(c), 1);
  ASSERT_EQ(c[0].status, Status::kSuccess);  // the victim has mapped the region now

  char* secret = static_cast<char*>(std::malloc(16));
  std::strcpy(secret, "victim-heap");
  auto& entry =
      dynamic_cast<ShmContext&>(*peer).table().entries[target->rkey() & kRegionIndexMask];
  entry.addr.store(0);
  entry.length.store(~uint64_t{0});
  // Any address now passes the live entry's range check.
  ASSERT_TRUE(p.a->post_send(write_wr(2, *src, reinterpret_cast<uint64_t>(secret),
                                      target->rkey()))
                  .ok());
  ASSERT_EQ(victim_cq->poll(c), 1);
  EXPECT_EQ(c[0].status, Status::kRemoteAccessError) << status_name(c[0].status);
  EXPECT_STREQ(secret, "victim-heap");
  std::free(secret);
}

// A victim context connecting to an acceptor that handshakes by hand:
// `tamper` sees the victim's end and the reply's end before the reply goes
// out, as a hostile peer process could.
class HandmadeAcceptor {
 public:
  using Tamper = std::function<void(PeerEnd& victim_end, LocalEnd& reply)>;
  HandmadeAcceptor(uint16_t port, Tamper tamper) : raw(port) {
    if (!raw.ok) return;
    done_ = std::async(
        std::launch::async,
        [this, tamper = std::move(tamper), victim_done = victim_connected_.get_future()] {
          Fd conn(::accept4(raw.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
          auto& evil_ctx = dynamic_cast<ShmContext&>(*evil_);
          PeerEnd victim_end = receive_handshake(conn.get(), "accept", "victim",
                                                 cred_of(conn.get()), evil_ctx, 5s);
          const QpOptions options{.send_cq = evil_cq_.get(), .recv_cq = evil_cq_.get()};
          LocalEnd reply = prepare_local_end(evil_ctx, options, false);
          tamper(victim_end, reply);
          send_handshake(conn.get(), evil_ctx, reply, options, {}, true);
          // Hang up only once the victim has mapped what it got (its connect()
          // returned): a fixed nap lost that race on a loaded machine.
          (void)victim_done.wait_for(10s);
        });
  }
  ~HandmadeAcceptor() { finish(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(raw.port); }
  // Lets the acceptor hang up; waits until it has.
  void finish() {
    if (!released_) {
      released_ = true;
      victim_connected_.set_value();
    }
    if (done_.valid()) done_.get();
  }

  std::unique_ptr<Context> victim = open_shm();
  std::unique_ptr<CompletionQueue> victim_cq = victim->create_cq();
  RawListener raw;

 private:
  std::unique_ptr<Context> evil_ = open_shm();
  std::unique_ptr<CompletionQueue> evil_cq_ = evil_->create_cq();
  std::promise<void> victim_connected_;
  bool released_ = false;
  std::future<void> done_;
};

// A hostile acceptor rewrites the ring size in the connector's own receive
// block during the handshake; the connector must keep using its own size
// (it indexed past its 4-slot block: ASan reported the write).
TEST(ShmHostilePeerTest, RingSizeIsNotReadBackFromSharedMemory) {
  HandmadeAcceptor peer(scratch_port(), [](PeerEnd& victim_end, LocalEnd&) {
    const size_t bytes = InboundBlock::bytes_for(victim_end.ring_size);
    auto* block =
        static_cast<InboundBlock*>(map_fd(victim_end.block_fd.get(), bytes, true));
    ASSERT_NE(block, nullptr);
    block->ring_size = 65536;
    ::munmap(block, bytes);
  });
  ASSERT_TRUE(peer.raw.ok);
  auto& victim = peer.victim;
  auto& victim_cq = peer.victim_cq;
  auto qp = victim->connect(peer.address(), {.send_cq = victim_cq.get(),
                                             .recv_cq = victim_cq.get(),
                                             .max_send_wr = 4,
                                             .max_recv_wr = 4});
  peer.finish();
  auto mem = victim->allocate(4096, kAccessAll);
  int posted = 0;
  Completion c[8];
  // The peer is gone: once the victim has noticed (the hang-up is seen
  // asynchronously), RECVs flush and slots free up.
  const auto until = std::chrono::steady_clock::now() + 5s;
  for (int i = 0; i < 64 && std::chrono::steady_clock::now() < until; ++i) {
    const PostResult r = qp->post_recv(RecvWr{
        .wr_id = uint64_t(i), .addr = mem->data(), .length = 64, .lkey = mem->lkey()});
    if (r.ok()) {
      ++posted;
    } else {
      std::this_thread::sleep_for(10ms);
    }
    victim_cq->poll(c);
  }
  EXPECT_GT(posted, 4);  // the queue keeps working within its own 4 slots
}

// A peer checks its accesses against our region table but cannot rewrite
// it: the descriptor it receives is read-only (it was read-write, so a peer
// could grant itself, or another peer, access to any of our regions).
TEST(ShmHostilePeerTest, PeersGetOurRegionTableReadOnly) {
  HandmadeAcceptor peer(
      static_cast<uint16_t>(scratch_port() + 2), [](PeerEnd& victim_end, LocalEnd&) {
        EXPECT_EQ(map_fd(victim_end.table_fd.get(), sizeof(RegionTable), true), nullptr)
            << "the victim's region table could be mapped writable";
        // Sealed (F_SEAL_FUTURE_WRITE): EPERM whatever the descriptor's mode.
        EXPECT_EQ(errno, EPERM);
        void* readable = map_fd(victim_end.table_fd.get(), sizeof(RegionTable), false);
        EXPECT_NE(readable, nullptr);
        if (readable != nullptr) ::munmap(readable, sizeof(RegionTable));
      });
  ASSERT_TRUE(peer.raw.ok);
  auto qp = peer.victim->connect(
      peer.address(), {.send_cq = peer.victim_cq.get(), .recv_cq = peer.victim_cq.get()});
  EXPECT_EQ(qp->state(), QpState::kConnected);
}

// Every memfd we share is sealed against resizing: a peer holding the
// descriptor of our receive ring cannot truncate it under our mapping
// (our next post_recv died with SIGBUS).
TEST(ShmHostilePeerTest, SharedMemfdsCannotBeResized) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto mem = ctx->allocate(4096, kAccessAll);
  auto srq = ctx->create_srq({.max_wr = 4});
  Pair p = connect_pair(*ctx, *ctx, {.send_cq = cq.get(), .recv_cq = cq.get()},
                        {.send_cq = cq.get(), .recv_cq = cq.get()});
  int memfds = 0;
  auto check = [&](int fd, const std::string& link) {
    ++memfds;
    EXPECT_NE(::ftruncate(fd, 0), 0) << link << " could be truncated";
    const int err = errno;
    // A writable descriptor is stopped by the seal (read-only ones by their mode).
    if ((::fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR) {
      EXPECT_EQ(err, EPERM) << link;
    }
  };
  for (const auto& [fd, link] : open_memfds("memfd:rdmakit-shm")) check(fd, link);
  for (const auto& [fd, link] : reopen_mapped_memfds("memfd:rdmakit-shm")) {
    check(fd, link);
    ::close(fd);
  }
  EXPECT_GE(memfds, 5);  // region table, region, SRQ, two receive blocks
  EXPECT_TRUE(
      p.a->post_recv(
             RecvWr{.wr_id = 1, .addr = mem->data(), .length = 64, .lkey = mem->lkey()})
          .ok());
}

// A peer whose receive block is not sealed (it could shrink it under our
// mapping) is refused at the handshake, naming the reason.
TEST(ShmHostilePeerTest, UnsealedPeerMemoryIsRefused) {
  HandmadeAcceptor peer(
      static_cast<uint16_t>(scratch_port() + 1), [](PeerEnd&, LocalEnd& reply) {
        // Same content, in a memfd without seals.
        Fd unsealed(::memfd_create("unsealed", MFD_CLOEXEC));
        ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(reply.block_bytes)), 0);
        void* copy = map_fd(unsealed.get(), reply.block_bytes, true);
        ASSERT_NE(copy, nullptr);
        std::memcpy(copy, reply.block, reply.block_bytes);
        ::munmap(copy, reply.block_bytes);
        reply.block_fd = std::move(unsealed);
      });
  ASSERT_TRUE(peer.raw.ok);
  try {
    peer.victim->connect(peer.address(), {.send_cq = peer.victim_cq.get(),
                                          .recv_cq = peer.victim_cq.get()});
    ADD_FAILURE() << "connected to a peer whose shared memory is not sealed";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EPROTO) << e.what();
    EXPECT_NE(std::string(e.what()).find("sealed"), std::string::npos) << e.what();
  }
}

// A peer that floods our progress thread with requests and never reads the
// replies is dropped; the thread goes on serving other peers (it blocked in
// sendmsg, and a well-behaved peer's first WRITE failed after its timeout).
TEST(ShmHostilePeerTest, PeerNotReadingRepliesDoesNotStallTheServiceThread) {
  auto victim = open_shm();
  auto evil = open_shm();
  auto good = open_shm();
  auto victim_cq = victim->create_cq();
  auto evil_cq = evil->create_cq();
  auto good_cq = good->create_cq();
  auto victim_mem = victim->allocate(4096, kAccessAll);
  auto good_mem = good->allocate(4096, kAccessAll);
  auto listener = victim->listen("127.0.0.1:0");
  QpOptions victim_options{.send_cq = victim_cq.get(), .recv_cq = victim_cq.get()};
  auto first = std::async(std::launch::async,
                          [&] { return listener->accept(victim_options, 10s); });
  Fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(listener->port());
  std::memcpy(sa.sun_path, name.data(), name.size());
  ASSERT_EQ(
      ::connect(sock.get(), reinterpret_cast<sockaddr*>(&sa),
                static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
      0);
  QpOptions evil_options{.send_cq = evil_cq.get(), .recv_cq = evil_cq.get()};
  LocalEnd local =
      prepare_local_end(dynamic_cast<ShmContext&>(*evil), evil_options, false);
  ASSERT_EQ(send_handshake(sock.get(), dynamic_cast<ShmContext&>(*evil), local,
                           evil_options, {}, true),
            0);
  PeerEnd victim_end =
      receive_handshake(sock.get(), "connect", "victim", cred_of(sock.get()),
                        dynamic_cast<ShmContext&>(*evil), 5s);
  auto victim_qp1 = first.get();
  const Request request{RequestOp::kGetRegion, 12345, 0, 0, 0};
  const auto flood_end = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < flood_end) {
    if (::send(victim_end.request_socket.get(), &request, sizeof request, MSG_DONTWAIT) !=
        static_cast<ssize_t>(sizeof request)) {
      std::this_thread::sleep_for(1ms);
    }
  }
  auto second = std::async(std::launch::async,
                           [&] { return listener->accept(victim_options, 10s); });
  QpOptions good_options{.send_cq = good_cq.get(), .recv_cq = good_cq.get()};
  good_options.peer_timeout = 2000ms;
  auto good_qp =
      good->connect("127.0.0.1:" + std::to_string(listener->port()), good_options);
  auto victim_qp2 = second.get();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(good_qp
                  ->post_send(write_wr(1, *good_mem,
                                       reinterpret_cast<uint64_t>(victim_mem->data()),
                                       victim_mem->rkey()))
                  .ok());
  Completion c[2];
  ASSERT_EQ(good_cq->poll(c), 1);
  EXPECT_EQ(c[0].status, Status::kSuccess) << status_name(c[0].status);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

// A sender forges a claim of an SRQ entry that is posted but that no sender
// took from the ring: the RECV must not complete (it completed, then again
// for the honest sender that took it, and the SRQ's accounting went past
// its posted count, refusing every later RECV).
TEST(ShmHostilePeerTest, ForgedSrqClaimCompletesNothing) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto mem = ctx->allocate(1 << 16, kAccessAll);
  auto srq = ctx->create_srq({.max_wr = 2});
  QpOptions server{.send_cq = cq.get(), .recv_cq = cq.get()};
  server.srq = srq.get();
  Pair p = connect_pair(*ctx, *ctx, {.send_cq = cq.get(), .recv_cq = cq.get()}, server);
  for (uint64_t id : {10, 11}) {
    ASSERT_TRUE(srq->post_recv(RecvWr{.wr_id = id,
                                      .addr = mem->data() + 1024 * id,
                                      .length = 1024,
                                      .lkey = mem->lkey()})
                    .ok());
  }
  // The server QP's receive block: its slots start as SRQ credits 1, 2, ...
  InboundBlock* block = nullptr;
  size_t block_bytes = 0;
  // Mapped only (a QP closes its descriptors once mapped): reopened.
  const auto blocks = reopen_mapped_memfds("memfd:rdmakit-shm-qp");
  for (const auto& [fd, link] : blocks) {
    struct stat st {};
    ::fstat(fd, &st);
    auto* b =
        static_cast<InboundBlock*>(map_fd(fd, static_cast<size_t>(st.st_size), true));
    if (b != nullptr && b->slots()[0].post_seq.load() == 1 &&
        b->slots()[1].post_seq.load() == 2) {
      block = b;
      block_bytes = static_cast<size_t>(st.st_size);
      break;
    }
    if (b != nullptr) ::munmap(b, static_cast<size_t>(st.st_size));
  }
  for (const auto& [fd, link] : blocks) ::close(fd);
  ASSERT_NE(block, nullptr);
  RecvSlot& slot = block->slots()[0];
  std::atomic_ref<uint64_t>(slot.srq_entry).store(0 + 1);  // entry 0: wr_id 10, unclaimed
  slot.byte_len = 0;
  slot.status = 0;
  slot.opcode = static_cast<uint8_t>(Opcode::kRecv);
  slot.data_inline = 0;
  slot.done_seq.store(1);
  Completion c[8];
  ASSERT_EQ(cq->poll(c), 1);
  EXPECT_NE(c[0].status, Status::kSuccess)
      << "a forged claim completed RECV " << c[0].wr_id;
  EXPECT_NE(c[0].wr_id, 10u);
  ::munmap(block, block_bytes);
}

}  // namespace
}  // namespace rdmakit::shm

namespace rdmakit::shm {
namespace {

// Every sender on a shared receive queue writes its shared block: a peer of
// another user may not be one (it could redirect the others' payloads).
TEST(ShmHostilePeerTest, AnotherUsersPeerCannotUseASharedReceiveQueue) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto srq = ctx->create_srq({.max_wr = 4});
  QpOptions options{.send_cq = cq.get(), .recv_cq = cq.get()};
  options.srq = srq.get();
  auto& shm_ctx = dynamic_cast<ShmContext&>(*ctx);
  EXPECT_NO_THROW((void)prepare_local_end(shm_ctx, options, false));
  try {
    (void)prepare_local_end(shm_ctx, options, true);
    FAIL() << "a QP to another user's process was set up on a shared receive queue";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EPERM) << e.what();
  }
}

}  // namespace
}  // namespace rdmakit::shm
