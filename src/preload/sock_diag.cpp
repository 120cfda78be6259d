#include "sock_diag.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "libc.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

namespace {

struct Request {
  nlmsghdr nlh;
  inet_diag_req_v2 req;
};

// A netlink socket that gives up after 1 s (the kernel answers at once).
int open_diag() {
  const int fd = real().socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -1;
  timeval tv{1, 0};
  (void)real().setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool send_request(int fd, Request& r) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  r.nlh.nlmsg_len = sizeof r;
  r.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  r.req.sdiag_protocol = IPPROTO_TCP;
  return real().sendto(fd, &r, sizeof r, 0,
                       reinterpret_cast<sockaddr*>(&kernel),  // NOLINT
                       sizeof kernel) == static_cast<ssize_t>(sizeof r);
}

// Calls on_msg for every inet_diag_msg of the answer, up to NLMSG_DONE or
// an error; bounded by the socket's receive timeout and a message count.
// true: the whole answer was read.
template <typename F>
bool read_answers(int fd, F&& on_msg) {
  alignas(nlmsghdr) std::array<char, 16384> buf{};
  for (int round = 0; round < 4096; ++round) {
    const ssize_t n = real().recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) return false;
    auto len = static_cast<size_t>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data());  // NOLINT
         NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {         // NOLINT
      if (h->nlmsg_type == NLMSG_DONE) return true;
      if (h->nlmsg_type == NLMSG_ERROR) return false;
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
          h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
        continue;
      on_msg(*static_cast<const inet_diag_msg*>(NLMSG_DATA(h)));  // NOLINT
    }
    if ((reinterpret_cast<nlmsghdr*>(buf.data())->nlmsg_flags & NLM_F_MULTI) ==
        0)  // NOLINT
      return true;
  }
  return false;
}

}  // namespace

namespace {

// One exact lookup of the client end in `family` (AF_INET6 with an IPv4
// tuple: the v4-mapped addresses an AF_INET6 socket holds).
struct ClientEnd {
  uid_t uid;
  ino_t inode;
};
std::optional<ClientEnd> lookup_client_end(int fd, const wire::Tuple& t, int family) {
  Request r{};
  r.nlh.nlmsg_flags = NLM_F_REQUEST;
  r.req.sdiag_family = static_cast<uint8_t>(family);
  r.req.idiag_states = ~0u;
  r.req.id.idiag_sport = t.client_port;
  r.req.id.idiag_dport = t.server_port;
  r.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  r.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  auto* src = reinterpret_cast<uint8_t*>(r.req.id.idiag_src);  // NOLINT
  auto* dst = reinterpret_cast<uint8_t*>(r.req.id.idiag_dst);  // NOLINT
  if (family == t.family) {
    std::memcpy(src, t.client_addr, 16);
    std::memcpy(dst, t.server_addr, 16);
  } else {
    src[10] = src[11] = dst[10] = dst[11] = 0xff;
    std::memcpy(src + 12, t.client_addr, 4);
    std::memcpy(dst + 12, t.server_addr, 4);
  }
  std::optional<ClientEnd> end;
  if (!send_request(fd, r)) return end;
  read_answers(fd, [&](const inet_diag_msg& m) {
    if (m.id.idiag_sport == t.client_port && m.id.idiag_dport == t.server_port)
      end = ClientEnd{m.idiag_uid, m.idiag_inode};
  });
  return end;
}

std::optional<ClientEnd> client_end(const wire::Tuple& t) {
  const int fd = open_diag();
  if (fd < 0) return std::nullopt;
  std::optional<ClientEnd> end = lookup_client_end(fd, t, t.family);
  if (!end && t.family == AF_INET) end = lookup_client_end(fd, t, AF_INET6);
  real().close(fd);
  return end;
}

}  // namespace

std::optional<uid_t> client_socket_uid(const wire::Tuple& t) {
  const auto end = client_end(t);
  return end ? std::optional<uid_t>(end->uid) : std::nullopt;
}

std::optional<ino_t> client_socket_inode(const wire::Tuple& t) {
  const auto end = client_end(t);
  return end && end->inode != 0 ? std::optional<ino_t>(end->inode) : std::nullopt;
}

std::vector<uid_t> listener_uids(uint16_t port) {
  std::vector<uid_t> uids;
  const int fd = open_diag();
  if (fd < 0) return uids;
  for (const int family : {AF_INET, AF_INET6}) {
    Request r{};
    r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    r.req.sdiag_family = static_cast<uint8_t>(family);
    r.req.idiag_states = 1u << TCP_LISTEN;
    if (!send_request(fd, r)) break;
    read_answers(fd, [&](const inet_diag_msg& m) {
      if (ntohs(m.id.idiag_sport) == port &&
          std::find(uids.begin(), uids.end(), m.idiag_uid) == uids.end())
        uids.push_back(m.idiag_uid);
    });
  }
  real().close(fd);
  return uids;
}

std::optional<std::vector<ino_t>> tcp_socket_inodes() {
  const int fd = open_diag();
  if (fd < 0) return std::nullopt;
  std::vector<ino_t> inodes;
  bool whole = true;
  for (const int family : {AF_INET, AF_INET6}) {
    Request r{};
    r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    r.req.sdiag_family = static_cast<uint8_t>(family);
    r.req.idiag_states = ~0u;
    whole = whole && send_request(fd, r) && read_answers(fd, [&](const inet_diag_msg& m) {
              if (m.idiag_inode != 0) inodes.push_back(m.idiag_inode);
            });
  }
  real().close(fd);
  if (!whole) return std::nullopt;
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

}  // namespace rdmakit::preload
