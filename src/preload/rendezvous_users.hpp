#pragma once
// The same-host rendezvous between processes of different users
// (docs/preload.md, "Between users"): the listener says so in a host-wide
// registration file; a client offers on an abstract unix socket named after
// the 4-tuple; the server proves with its end of the kernel connection
// (SCM_RIGHTS) that it holds it, after checking that the offer's owner is
// the user whose socket is the client end (NETLINK_SOCK_DIAG). Each side
// then carries the stream on an shm engine that admits only the other's uid.
#include <cstdint>
#include <string>

#include "rendezvous.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

// RDMAKIT_PRELOAD_OTHER_USERS=0 turns the path off (both roles).
bool other_users_enabled();
// The host-wide registrations' path prefix, "<dir>/rdmakit-l-<netns inode>-"
// ("" when other users are off).
std::string host_registration_prefix();
// listen(): <host dir>/rdmakit-l-<netns>-<port> names this process.
void register_host_listener(uint16_t port);
void unregister_host_listener(uint16_t port);
// Client, before the kernel connect: a preloaded listener of another user
// holds `port` (its registration file is owned by a uid that owns a socket
// listening on the port). *why: what was found otherwise.
bool other_user_listener(uint16_t port, std::string* why);
// Client: listens on the abstract offer socket for p->tuple (p->usock).
std::string listen_other_user_offer(PendingOffer* p);
// A listening socket on the abstract offer name of t, or -1 (*why) when it
// cannot be made or another process holds the name.
int listen_on_other_user_name(const wire::Tuple& t, std::string* why);
// Client, at first use: the server's proof, the offer, the commit.
// *proven: the peer proved it holds the server end (a failure after that is
// the real server's; before it, a squatter's).
Upgrade finish_other_user(PendingOffer& p, int tcp_fd, bool* proven = nullptr);
// Server, at first use: false when no client of another user offers this
// connection; else *up holds the stream or why not.
bool answer_other_user(int tcp_fd, const wire::Tuple& t, const std::string& deny,
                       uint32_t deny_status, Upgrade* up);

}  // namespace rdmakit::preload
