#pragma once
// The upgrade of a connected kernel TCP socket to an rdmakit stream, agreed
// out of band (docs/preload.md, "Upgrade protocol"). Both functions run
// before connect()/accept() returns the fd to the application, so no
// application byte has been sent on the TCP connection yet: the cut-over is
// at byte 0 in both directions.
#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "rdmakit/stream/stream.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

struct Upgrade {
  std::unique_ptr<stream::Stream> stream;  // null: stay on kernel TCP
  std::string reason;                      // why not (for the log)
  const char* path = "shm";                // the provider carrying the stream
};

// Listener registry: a preloaded process that listens on a TCP port says so
// (<dir>/l-<port>), so clients of other ports never wait for a rendezvous.
void register_listener(uint16_t port);
void unregister_listener(uint16_t port);

// Active side, in two steps around the kernel connect: prepare publishes
// the offer (binding the socket's local port first if it has none), so it
// exists before the peer can accept; finish waits for the peer to take it
// up. prepare returns null (and *reason) when the connection stays on TCP.
struct PendingOffer;
struct PendingOfferDelete {
  void operator()(PendingOffer* p) const noexcept;
};
using PendingOfferPtr = std::unique_ptr<PendingOffer, PendingOfferDelete>;
bool offer_is_remote(const PendingOffer& offer);
// This process has offers out to a listener of its own (client ends not
// settled yet; mirror.hpp).
bool offers_to_this_process() noexcept;
// Some connect()ed connection of this process waits for its first use.
bool any_deferred_offer() noexcept;
// The offer's listener is this process (mirror.hpp).
bool offer_listener_here(const PendingOffer& offer);
PendingOfferPtr prepare_connect(int tcp_fd, const sockaddr* dest, std::string* reason);
Upgrade finish_connect(PendingOfferPtr offer, int tcp_fd);
// Passive side, on a socket the kernel accept returned. A non-empty `deny`
// (the rules keep this connection on TCP) refuses a waiting offer at once,
// so the client does not spend its budget waiting.
// `deny_status` is the refusal the client reads (wire::kDeniedByRules or
// wire::kNotCarried).
Upgrade upgrade_accepted(int tcp_fd, const std::string& deny,
                         uint32_t deny_status = wire::kDeniedByRules);

// The adoption marker's path for fd's end of its connection (adoption.hpp):
// <dir>/a-<hash of the 4-tuple> for an accepted end, b- for a connected
// one; "" when fd is not a loopback connection or the directory is
// unusable.
std::string adoption_marker(int tcp_fd, bool client);
// The path of the offer a connect() of this user made for tcp_fd's
// connection, tcp_fd being its connect()ed end ("" when unusable).
std::string connect_offer_path(int tcp_fd);
// A file of the rendezvous directory, written whole under another name and
// renamed into place: a reader sees the old one or the new one, never a part.
void write_file_whole(const std::string& path, const std::string& text);
// pid names a live process (of any user).
bool alive(pid_t pid);
// Whether fd's connection has both ends on loopback (the lazy, same-host
// rendezvous applies).
bool loopback_connection(int tcp_fd);

}  // namespace rdmakit::preload
