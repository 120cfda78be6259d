#pragma once
// rdma_cm plumbing of the verbs provider: address resolution, the event
// channel, and events waited for with a deadline; an unexpected event
// becomes an Error naming the verb, the event and the peer.
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/address.hpp"
#include "core/deadline.hpp"
#include "providers/verbs/verbs_objects.hpp"

namespace rdmakit::verbs {

// How long a connection handshake may take from its request on, whatever
// the timeouts of the accept() calls that drive it (a server polling
// accept() with a short timeout must not abandon a connection the peer
// already sees accepted; the handshake stays pending between calls).
// Covers one lost REP or RTU, which the CM resends after ~4.3 s.
inline constexpr std::chrono::milliseconds kHandshakeTimeout{8000};

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
};

SockAddr resolve(const core::HostPort& hp, bool passive, const char* operation,
                 const std::string& peer);

struct CmEvent {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  std::vector<std::byte> private_data;
  uint8_t initiator_depth = 0;
  uint8_t responder_resources = 0;
};

// Waits for the next event, copies what we need and acknowledges it at once
// (an unacknowledged event blocks rdma_destroy_id and rdma_migrate_id).
CmEvent next_event(rdma_event_channel* channel, core::Clock::time_point deadline,
                   const char* operation, const char* waiting_for,
                   const std::string& peer);

// Turns an unexpected rdma_cm event into an Error naming the verb, the
// event, its status and the peer.
[[noreturn]] void throw_cm_failure(const CmEvent& event, const char* operation,
                                   const char* verb, const std::string& peer);

// The event already queued on the channel, if any (no waiting).
std::optional<CmEvent> queued_event(rdma_event_channel* channel, const char* operation,
                                    const std::string& peer);

CmEvent expect_event(rdma_event_channel* channel, core::Clock::time_point deadline,
                     rdma_cm_event_type want, const char* operation, const char* verb,
                     const std::string& peer);

EventChannelHandle make_channel(const char* operation, const std::string& peer);

}  // namespace rdmakit::verbs
