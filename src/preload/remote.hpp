#pragma once
// The upgrade between two hosts (docs/preload.md, "Between hosts"): each
// preloaded listener has a rendezvous TCP listener on a derived port
// (listener port + RDMAKIT_PRELOAD_REMOTE_PORT_OFFSET). A client first asks
// it, on a connection of its own, whether the server side is rdmakit-enabled
// and leaves its offer there (bound to the kernel connection's 4-tuple and a
// nonce) before the kernel connect; the server's accept() takes the offer up.
// The stream runs on the cross-host provider (verbs, only when both hosts
// have a usable RDMA device). Nothing is sent on the application's own
// connection.
#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "rendezvous.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

// A listener on an address other hosts can reach gets its rendezvous
// listener (and a thread that serves it) when this host can carry streams.
void open_remote_listener(int app_fd, uint16_t port);
void close_remote_listener(uint16_t port);

// Client, before the kernel connect to a non-loopback peer: null and *reason
// (beginning "peer is not on this host") when the connection stays on TCP.
PendingOfferPtr prepare_remote(int tcp_fd, const sockaddr_storage& peer,
                               std::string* reason);
Upgrade finish_remote(PendingOffer& offer, int tcp_fd);
// Server, on an accepted connection from another host.
Upgrade accept_remote(int tcp_fd, const wire::Tuple& tuple, const std::string& deny);

}  // namespace rdmakit::preload
