// Two processes on one host: the server exposes a region; the client WRITEs
// into it, READs it back, bumps a counter with FETCH_ADD and SENDs a note.
//   hello_rdma                   # forks both ends (shm by default)
//   RDMAKIT_PROVIDER=tcp hello_rdma
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "rdmakit/rdmakit.hpp"

using namespace rdmakit;
using namespace std::chrono_literals;

static Completion wait_one(CompletionQueue& cq) {
  Completion c;
  if (cq.wait({&c, 1}, 5s) != 1) throw std::runtime_error("no completion within 5 s");
  if (!c.ok())
    throw std::runtime_error(std::string("completion: ") + status_name(c.status));
  return c;
}

static int server(int port_pipe) {
  auto ctx = Context::open();
  auto cq = ctx->create_cq();
  auto mr = ctx->allocate(4096, kAccessAll);
  auto listener = ctx->listen("127.0.0.1:0");
  const uint16_t port = listener->port();
  if (write(port_pipe, &port, sizeof port) != sizeof port) return 1;
  auto qp = listener->accept({.send_cq = cq.get(), .recv_cq = cq.get()}, 10s,
                             mr->remote().serialize());  // the client learns addr+rkey
  qp->post_recv(
      {.wr_id = 1, .addr = mr->data() + 2048, .length = 64, .lkey = mr->lkey()});
  Completion c = wait_one(*cq);  // the client's SEND
  std::printf("server: region holds \"%s\", counter=%lu, message \"%.*s\"\n",
              reinterpret_cast<char*>(mr->data()),
              *reinterpret_cast<uint64_t*>(mr->data() + 1024),
              static_cast<int>(c.byte_len), reinterpret_cast<char*>(mr->data() + 2048));
  return 0;
}

static int client(uint16_t port) {
  auto ctx = Context::open();
  auto cq = ctx->create_cq();
  auto buf = ctx->allocate(4096, kAccessLocalWrite);
  auto qp = ctx->connect("127.0.0.1:" + std::to_string(port),
                         {.send_cq = cq.get(), .recv_cq = cq.get()});
  const RemoteRegion peer = *RemoteRegion::deserialize(qp->peer_private_data());

  std::strcpy(reinterpret_cast<char*>(buf->data()), "written by one-sided WRITE");
  qp->post_send({.wr_id = 1,
                 .opcode = Opcode::kWrite,
                 .flags = kSignaled,
                 .length = 27,
                 .local_addr = buf->data(),
                 .lkey = buf->lkey(),
                 .remote_addr = peer.addr,
                 .rkey = peer.rkey});
  wait_one(*cq);
  qp->post_send({.wr_id = 2,
                 .opcode = Opcode::kRead,
                 .flags = kSignaled,
                 .length = 27,
                 .local_addr = buf->data() + 512,
                 .lkey = buf->lkey(),
                 .remote_addr = peer.addr,
                 .rkey = peer.rkey});
  wait_one(*cq);
  qp->post_send({.wr_id = 3,
                 .opcode = Opcode::kFetchAdd,
                 .flags = kSignaled,
                 .length = 8,
                 .local_addr = buf->data() + 1024,
                 .lkey = buf->lkey(),
                 .remote_addr = peer.addr + 1024,
                 .rkey = peer.rkey,
                 .compare_add = 42});
  wait_one(*cq);
  std::strcpy(reinterpret_cast<char*>(buf->data() + 2048), "hello over SEND");
  qp->post_send({.wr_id = 4,
                 .opcode = Opcode::kSend,
                 .flags = kSignaled | kInline,
                 .length = 15,
                 .local_addr = buf->data() + 2048});
  wait_one(*cq);
  std::printf("client (%s): READ back \"%s\"\n", ctx->provider_name(),
              reinterpret_cast<char*>(buf->data() + 512));
  return 0;
}

int main() try {
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    const int rc = server(fds[1]);
    std::fflush(stdout);
    _exit(rc);
  }
  uint16_t port = 0;
  if (read(fds[0], &port, sizeof port) != sizeof port) return 1;
  const int rc = client(port);
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hello_rdma: %s\n", e.what());
  return 1;
}
