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

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "rdmakit/auth.hpp"
#include "rdmakit/rdmakit.hpp"
#include "rendezvous.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

struct RemoteConfig {
  ProviderKind provider = ProviderKind::kVerbs;  // kAuto: off
  int port_offset = 10000;
  std::string problem;  // why this host cannot carry cross-host streams
  // RDMAKIT_SECRET_FILE or RDMAKIT_SECRET: with it, the rendezvous proves
  // and requires the shared secret (rdmakit/auth.hpp) before any offer.
  std::optional<auth::Secret> secret;
};
// Read once from the environment.
const RemoteConfig& remote_config();
// A listener's rendezvous port (port + offset, wrapped into 1024..65535).
uint16_t rendezvous_port(uint16_t port);
// How long learning whether the peer is rdmakit-enabled may take (the
// probe; on the server, a rendezvous handshake up to the stored offer).
std::chrono::milliseconds probe_budget();
// An address of a tuple as the stream API takes it ("10.0.0.1", "[fd00::1]").
std::string ip_text(int family, const uint8_t* addr);
size_t addr_len(int family);

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
// The offer stored for this connection by the rendezvous thread
// (remote_serve.cpp), removed from its table; false when there is none.
bool take_stored_offer(const wire::Tuple& tuple, wire::Offer* offer, int* fd);
Upgrade accept_remote(int tcp_fd, const wire::Tuple& tuple, const std::string& deny);

}  // namespace rdmakit::preload
